package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/admission"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
)

// memStager is a stager that keeps one chunk of stride items and then
// drops it, as the store's writer sends a full chunk to Redis; it keeps
// every custom ID for CustomIDAt.
type memStager struct {
	stride   int
	ids      []string
	items    []store.StagedItem
	buffered int64
	closed   bool
}

func (m *memStager) Add(_ context.Context, it store.StagedItem) error {
	m.ids = append(m.ids, it.CustomID)
	m.items = append(m.items, store.StagedItem{Kind: it.Kind, Own: it.Own, Timeout: it.Timeout})
	m.buffered += int64(len(it.Request) + len(it.CustomID))
	if len(m.ids)%m.stride == 0 {
		m.buffered = 0
	}
	return nil
}
func (m *memStager) Total() int      { return len(m.ids) }
func (m *memStager) Buffered() int64 { return m.buffered }
func (m *memStager) CustomIDAt(_ context.Context, i int) (string, error) {
	return m.ids[i], nil
}
func (m *memStager) Close(context.Context) error   { m.closed, m.buffered = true, 0; return nil }
func (m *memStager) Discard(context.Context) error { return nil }

// peakReader records the pool's use each time the body is read.
type peakReader struct {
	r    io.Reader
	p    *admission.Pool
	peak int64
}

func (r *peakReader) Read(b []byte) (int, error) {
	r.peak = max(r.peak, r.p.InUse())
	return r.r.Read(b)
}

// bodyChunk is the most a poolBody reads at once, as internal/api's
// metered body reads.
const bodyChunk = 32 << 10

// poolBody is a request body read from r that takes each byte it returns
// from its ticket of the pool, as internal/api's metered body does, under
// a deadline a minute away.
type poolBody struct {
	r   io.Reader
	t   *admission.Ticket
	err error
	cut bool
}

func (b *poolBody) Read(p []byte) (int, error) {
	if len(p) > bodyChunk {
		p = p[:bodyChunk]
	}
	n, err := b.r.Read(p)
	if n > 0 {
		if terr := b.Take(int64(n)); terr != nil {
			b.err = terr
			return 0, terr
		}
	}
	return n, err
}

func (b *poolBody) Ticket() *admission.Ticket { return b.t }
func (b *poolBody) Take(n int64) error {
	return b.t.TakeUntil(context.Background(), time.Now().Add(time.Minute), n)
}
func (b *poolBody) Failed(err error) { b.err = err }
func (b *poolBody) CutOff()          { b.cut = true }

// testDecoder is a Decoder with the API's test limits, and the pool its
// bodies take from.
func testDecoder(t *testing.T) (*Decoder, *admission.Pool) {
	t.Helper()
	d := New(Config{MaxItems: 1 << 20, ChunkSize: 64, Decodes: 2,
		Deadline: map[puzzle.Kind]time.Duration{puzzle.KindSliding: 5 * time.Minute, puzzle.KindSweep: time.Minute, puzzle.KindFill: 10 * time.Second}})
	return d, admission.New(32<<20, 16<<20)
}

// stream stages body as NDJSON under a fresh ticket of p.
func stream(d *Decoder, p *admission.Pool, r io.Reader, w Stager, withHash bool) (*Result, error) {
	b := &poolBody{r: r, t: p.Ticket("")}
	defer b.t.Release()
	return d.Stream(context.Background(), b, b, w, true, withHash)
}

// A streamed body holds of the pool what the request holds in memory: the
// reader's buffer, the item and the writer's unwritten chunk, not the
// body. Its hash is the body's, under its form, and every item is sized
// for its unit as the store expects.
func TestIngestHoldsWhatItBuffers(t *testing.T) {
	d, pool := testDecoder(t)
	var b strings.Builder
	for i := range 20000 {
		fmt.Fprintf(&b, `{"custom_id":"c-%d","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"max_nodes":%d}}`+"\n", i, i+1)
		if i%1000 == 0 {
			b.WriteString(`{"kind":"sweep","puzzle":{"board":["...","..."]}}` + "\n")
		}
	}
	body := b.String()
	pr := &peakReader{r: strings.NewReader(body), p: pool}
	w := &memStager{stride: 64}
	in, err := stream(d, pool, pr, w, true)
	if err != nil {
		t.Fatal(err)
	}
	if w.Total() != 20020 || !w.closed || in.Kinds[puzzle.KindSliding] != 20000 || in.Kinds[puzzle.KindSweep] != 20 {
		t.Fatalf("staged %d items (closed %v), kinds %v", w.Total(), w.closed, in.Kinds)
	}
	sum := sha256.Sum256([]byte("ndjson\n" + body))
	if in.Hash != hex.EncodeToString(sum[:]) {
		t.Errorf("hash %s, want the body's under ndjson", in.Hash)
	}
	// The bound: the reader's buffer, a read ahead of it, a chunk of
	// items, the blocks of lines being decoded; the body is 2.5 MB.
	if limit := int64(readSlack+bodyChunk+64*200) + maxReadAhead(runtime.GOMAXPROCS(0)); pr.peak > limit || pr.peak == 0 {
		t.Errorf("the pool held up to %d bytes of a %d-byte body, want at most %d", pr.peak, len(body), limit)
	}
	for i, it := range w.items {
		wantOwn := i%1001 == 1
		d := time.Minute // cheap: the chunk cap; sweep: its deadline
		if it.Own != wantOwn || it.Timeout != d {
			t.Fatalf("item %d: own %v timeout %s, want own %v timeout %s", i, it.Own, it.Timeout, wantOwn, d)
		}
	}
}

// A large cheap item (a 1000x1000 fill is 2 MB) runs alone: a worker
// reading its chunk must not read megabytes of its neighbours.
func TestLargeCheapItemRunsAlone(t *testing.T) {
	s, _ := testDecoder(t)
	row := "[" + strings.TrimSuffix(strings.Repeat("0,", 200), ",") + "]"
	grid := "[" + strings.TrimSuffix(strings.Repeat(row+",", 200), ",") + "]"
	p, err := puzzle.Decode([]byte(`{"kind":"fill","puzzle":{"game_board":` + grid + `,"table":` + grid + `}}`))
	if err != nil {
		t.Fatal(err)
	}
	if it := s.staged(p, ""); !it.Own || it.Timeout != 10*time.Second || len(p.Payload()) <= ownPayload {
		t.Errorf("a %d-byte fill: own %v timeout %s", len(p.Payload()), it.Own, it.Timeout)
	}
	small, _ := puzzle.Decode([]byte(`{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[1,0]]}}`))
	if it := s.staged(small, "x"); it.Own || it.CustomID != "x" {
		t.Errorf("a small fill: own %v", it.Own)
	}
}

// The lines are decoded on several goroutines, a block at a time, but the
// error reported is the first by line order, whichever block's decoder
// finished first: a later bad line (even in the same block), a duplicate
// custom_id or a line too long never hides an earlier fault.
func TestNDJSONFirstErrorByLine(t *testing.T) {
	good := func(i int) string {
		return fmt.Sprintf(`{"custom_id":"c-%d","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`, i)
	}
	const n = 3000
	for _, tc := range []struct {
		name string
		bad  map[int]string // 1-based line -> its text
		want string
	}{
		{"bad tile, then worse", map[int]string{1500: `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,9]]}}`, 1501: `{`, 2900: `x`},
			"line 1500: puzzle.board[2][2]: "},
		{"syntax in the first block", map[int]string{3: `{"kind":`, 2000: `{"kind":"sweep"}`}, "line 3: "},
		{"duplicate before a bad line", map[int]string{1200: good(7), 1201: `{"kind":"x","puzzle":{}}`},
			`line 1200: custom_id: "c-7" is already the custom_id of line 6`},
		{"bad line before a duplicate", map[int]string{1199: `{"kind":"x","puzzle":{}}`, 1200: good(7)}, "line 1199: unknown kind"},
		{"too long after a bad line", map[int]string{2500: `{"kind":"sliding"}`, 2600: `{"custom_id":"` + strings.Repeat("x", puzzle.MaxJSONLine) + `"}`},
			"line 2500: "},
		{"too long first", map[int]string{2400: `{"custom_id":"` + strings.Repeat("x", puzzle.MaxJSONLine) + `"}`, 2500: `{"kind":"sliding"}`},
			"line 2400: longer than"},
	} {
		d, pool := testDecoder(t)
		var b strings.Builder
		for i := 1; i <= n; i++ {
			if l, ok := tc.bad[i]; ok {
				b.WriteString(l + "\n")
			} else {
				b.WriteString(good(i+1) + "\n")
			}
		}
		w := &memStager{stride: 64}
		_, err := stream(d, pool, strings.NewReader(b.String()), w, false)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error starting %q", tc.name, err, tc.want)
		}
	}
}
