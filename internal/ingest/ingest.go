// Package ingest reads a batch body and stages its items: the streaming
// decoder of JSON and NDJSON bodies and the decode of the judge formats.
// The HTTP side (the body's deadline, its metering, the answers) is
// internal/api's.
package ingest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/maphash"
	"io"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/admission"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
)

// A batch body is read as a stream and staged item by item (see
// docs/batches.md): never the whole body, never all the items. What the
// request holds in memory at once is the reader's buffer, the item being
// decoded and the chunks the writer has not yet sent to Redis, and that is
// what it holds of the admission pool: bytes are taken as they arrive
// (the Body's reader) and given back as items are staged and chunks
// written.

// Stager is where a batch's items are staged; *store.BatchWriter.
type Stager interface {
	Add(ctx context.Context, it store.StagedItem) error
	Total() int
	Buffered() int64
	CustomIDAt(ctx context.Context, index int) (string, error)
	Close(ctx context.Context) error
	Discard(ctx context.Context) error
}

// Body is the request body's share of the admission pool, as the reader
// of a streamed body takes it; internal/api's metered body.
type Body interface {
	// Ticket is the request's ticket of the pool.
	Ticket() *admission.Ticket
	// Take takes n more bytes for the request, waiting for the pool at
	// most until the body's deadline.
	Take(n int64) error
	// Failed records err, a failed take of the pool, as the body's
	// failure: its answer is the pool's, not the items'.
	Failed(err error)
	// CutOff ends the body when staging stops reading it: a reader
	// waiting for bytes returns at once, and the connection carries no
	// other request.
	CutOff()
}

// Config bounds the batches a Decoder reads.
type Config struct {
	// MaxItems bounds the items of one batch.
	MaxItems int
	// ChunkSize is how many cheap items go into one chunk task.
	ChunkSize int
	// Deadline is each kind's deadline (tasks.Limits).
	Deadline map[puzzle.Kind]time.Duration
	// Decodes is how many large items and judge bodies decode at once.
	Decodes int
}

// Decoder reads batch bodies and stages their items; its decode slots
// are shared by every request.
type Decoder struct {
	cfg     Config
	decodes chan struct{} // the decode slots
}

// New returns a Decoder bounded by cfg.
func New(cfg Config) *Decoder {
	return &Decoder{cfg: cfg, decodes: make(chan struct{}, cfg.Decodes)}
}

// ownPayload is the request size above which an item runs in its own unit
// even when it is cheap (a 1000x1000 fill), so that a worker reading a
// chunk never reads megabytes of its neighbours.
const ownPayload = 64 << 10

// chunkPayload bounds the requests of one chunk's cheap unit: with
// CHUNK_SIZE items to a chunk, an item larger than chunkPayload/CHUNK_SIZE
// runs in its own unit, so a worker slot holds at most this much request
// (and its decode, several times more) however large the chunks. At the
// default 512 a chunk of 8-puzzles (about 80 bytes each) is one unit,
// and a fill over 8 KiB (larger than about 60x60) runs alone.
const chunkPayload = 4 << 20

// bigItem is the raw size above which decoding an item takes a decode slot
// and decodeFactor times its size from the pool: small items cost their
// bytes and a few allocations, large ones (fills) several times their size
// for a moment.
const bigItem = 64 << 10

// readSlack is what a body's reader holds beyond the current item: the
// line reader's buffer, or the JSON decoder's look-ahead.
const readSlack = 64 << 10

// MaxJudgeBody bounds a judge-format batch body, which is read whole (the
// judges' parsers are not streams); their inputs are a few megabytes.
const MaxJudgeBody = 16 << 20

// cheapItemTimeout caps what a cheap item adds to its chunk's timeout, as
// tasks.NewChunkUnit does: a kind's deadline is sized for its hardest
// boards, which never ride in a chunk.
const cheapItemTimeout = time.Minute

// Result is what reading a batch body made.
type Result struct {
	// Format is the judge format the batch came in; "" for JSON and NDJSON.
	Format string
	// Hash is the body's SHA-256 with its form, in hex, for the
	// Idempotency-Key; "" unless hashing was asked for.
	Hash string
	// Kinds counts the items of each kind, for the metrics.
	Kinds map[puzzle.Kind]int
	// Webhook is the "webhook" member of a {"tasks": [...]} body,
	// unchecked; nil when it has none.
	Webhook *string
}

// Stream stages every item of a JSON ({"tasks": [...]}) or, with
// ndjson, NDJSON body read from r, taking what it holds from body's
// ticket, and closes w. With withHash the Result has the body's hash. On
// an error nothing it staged is left behind: the caller must Discard w
// (Stream does not, so that one path discards whatever failed).
func (d *Decoder) Stream(ctx context.Context, r io.Reader, body Body, w Stager, ndjson, withHash bool) (*Result, error) {
	g := &run{d: d, ctx: ctx, w: w, body: body, out: &Result{Kinds: map[puzzle.Kind]int{}}}
	form := "json"
	if ndjson {
		form = "ndjson"
	}
	if withHash {
		g.hash = sha256.New()
		g.hash.Write([]byte(form + "\n"))
		r = io.TeeReader(r, g.hash)
	}
	var err error
	if ndjson {
		err = g.lines(r)
	} else {
		err = g.array(r)
	}
	if err != nil {
		return nil, err
	}
	if err := w.Close(ctx); err != nil {
		return nil, err
	}
	g.settle(0)
	if g.hash != nil {
		g.out.Hash = hex.EncodeToString(g.hash.Sum(nil))
	}
	return g.out, nil
}

// run is one body being staged.
type run struct {
	d    *Decoder
	ctx  context.Context // the request's
	w    Stager
	body Body // nil for a judge body, read whole
	hash hash.Hash
	out  *Result
	dups dupIndex
	// window is what the NDJSON blocks read ahead of the stager weigh.
	window atomic.Int64
}

// where names an item in errors: its line for NDJSON ("line 7"), its
// place for JSON ("tasks[6]").
type where struct {
	line  int    // 1-based line of an NDJSON item; 0 for the JSON forms
	field string // "tasks[6]" for an item of {"tasks": [...]}
}

func (at where) wrap(err error) error {
	if at.line > 0 {
		return puzzle.LineError(err, at.line)
	}
	return puzzle.PrefixField(err, at.field)
}

func (at where) String() string {
	if at.line > 0 {
		return "line " + strconv.Itoa(at.line)
	}
	return at.field
}

// An NDJSON body is read, decoded and staged by three stages at once, so
// that decoding (the most CPU an item costs) runs on every core while the
// upload arrives, and staging stays in line order on one goroutine:
//
//   - the reader (one goroutine) cuts the body into blocks of lines;
//   - decoders (GOMAXPROCS goroutines) decode a block's items;
//   - the request's goroutine takes the blocks in order, waits for each to
//     be decoded, and stages its items as item does, stopping at the
//     first error by line order: the one a single goroutine would have
//     reported, whatever a later block's decoder found meanwhile.
//
// At most decodeWindow blocks are between the reader and the stager, and
// the pool holds what they weigh (block.weight), so memory stays bounded
// by bytes as it was: the reader's buffer, the window, the writer's
// chunks.

// blockBytes ends a block once its lines hold this many bytes;
// blockLines once it holds this many lines.
const (
	blockBytes = 16 << 10
	blockLines = 64
)

// decodeWindow is how many blocks may be read ahead of the stager, per
// decoder.
const decodeWindow = 2

// parsedWeight is what a decoded item weighs beyond three times its line
// (the line, its payload and its grid): the Parsed itself and its slices'
// headers.
const parsedWeight = 512

// maxReadAhead bounds what the blocks between the reader and the stager
// weigh (of lines up to blockBytes; a larger line is a block alone): the
// window, the block being staged and the one being read.
func maxReadAhead(par int) int64 {
	return int64(decodeWindow*par+2) * (3*blockBytes + blockLines*parsedWeight)
}

// lineItem is one item of a block: where its line is, and what decoding it
// made.
type lineItem struct {
	line     int
	off, end int // the line is block.raw[off:end]
	p        *puzzle.Parsed
	id       string
	err      error
}

// block is a run of consecutive NDJSON lines.
type block struct {
	raw    []byte
	items  []lineItem
	weight int64         // what the block holds of the pool, decoded
	end    error         // after the items: io.EOF, a read error or a line too long
	done   chan struct{} // closed once its items are decoded
}

// lines stages an NDJSON body: one item per line, blank lines skipped.
func (g *run) lines(r io.Reader) error {
	par := max(1, runtime.GOMAXPROCS(0))
	ordered := make(chan *block, decodeWindow*par)
	work := make(chan *block, decodeWindow*par)
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		defer close(ordered)
		defer close(work)
		g.readBlocks(r, ordered, work, stop)
	}()
	for range par {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for b := range work {
				decodeBlock(b)
			}
		}()
	}
	err := g.stageBlocks(ordered)
	close(stop)
	if err != nil && err != io.EOF {
		// The reader may be waiting for bytes that are not coming yet:
		// its read ends now, not at the body's deadline. A read that
		// fails on the connection cancels net/http's context for the
		// whole connection, so it must not carry another request:
		// CutOff closes it.
		g.body.CutOff()
	}
	for range ordered {
		// Let the reader go: it sends nothing more once stop is closed,
		// but may be sending now.
	}
	readers.Wait()
	if err != io.EOF {
		return err
	}
	if g.w.Total() == 0 {
		return &solvers.InputError{Code: apitype.CodeInvalidRequest, Msg: "a batch needs at least one item: the body has no lines"}
	}
	return nil
}

// readBlocks cuts the body into blocks and hands each to the stager (in
// order) and to the decoders, until the body ends or stop is closed. The
// last block carries how the body ended.
func (g *run) readBlocks(r io.Reader, ordered, work chan<- *block, stop <-chan struct{}) {
	br := bufio.NewReaderSize(r, readSlack)
	var long []byte // a line longer than the reader's buffer, pieced together
	b := &block{done: make(chan struct{})}
	send := func() bool {
		g.window.Add(b.weight)
		select {
		case ordered <- b:
		case <-stop:
			return false
		}
		if len(b.items) == 0 {
			close(b.done)
		} else {
			select {
			case work <- b:
			case <-stop:
				close(b.done)
				return false
			}
		}
		b = &block{done: make(chan struct{})}
		return true
	}
	for line := 1; ; line++ {
		l, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], l...)
			for errors.Is(err, bufio.ErrBufferFull) {
				if len(long) > puzzle.MaxJSONLine {
					b.end = &solvers.InputError{Code: apitype.CodeTooLarge, Line: line,
						Msg: fmt.Sprintf("longer than %d bytes", puzzle.MaxJSONLine)}
					send()
					return
				}
				l, err = br.ReadSlice('\n')
				long = append(long, l...)
			}
			l = long
		}
		if err != nil && err != io.EOF {
			b.end = err
			send()
			return
		}
		// Only JSON's own whitespace makes a line blank: a line that
		// another reader would not take as blank is an item, and fails
		// as one.
		if t := bytes.Trim(l, " \t\r\n"); len(t) > 0 {
			if len(t) > puzzle.MaxJSONLine {
				b.end = &solvers.InputError{Code: apitype.CodeTooLarge, Line: line,
					Msg: fmt.Sprintf("longer than %d bytes", puzzle.MaxJSONLine)}
				send()
				return
			}
			if len(t) > bigItem {
				// A large line (it was pieced together in long) is a
				// block of its own, not copied: the stager decodes it,
				// weighed as decode weighs it.
				if len(b.items) > 0 && !send() {
					return
				}
				b.raw, long = t, nil
				b.items = append(b.items, lineItem{line: line, end: len(t)})
				b.weight = int64(len(t))
				if err != io.EOF && !send() {
					return
				}
			} else {
				if len(b.raw)+len(t) > blockBytes && !send() {
					return
				}
				off := len(b.raw)
				b.raw = append(b.raw, t...)
				b.items = append(b.items, lineItem{line: line, off: off, end: len(b.raw)})
				b.weight += 3*int64(len(t)) + parsedWeight
			}
		}
		if long != nil && cap(long) > readSlack {
			long = nil // let a megabyte line go
		}
		if err == io.EOF {
			b.end = io.EOF
			send()
			return
		}
		// A block goes when full, and when the next line is not here
		// yet: the stager does not wait for a slow client's next bytes
		// to stage the lines already in.
		if len(b.items) > 0 && (len(b.items) >= blockLines || br.Buffered() == 0) && !send() {
			return
		}
	}
}

// decodeBlock decodes a block's small items, up to its first bad one:
// the stager stops there. A large item is left to the stager, which
// decodes it under a decode slot (decode).
func decodeBlock(b *block) {
	defer close(b.done)
	for i := range b.items {
		it := &b.items[i]
		raw := b.raw[it.off:it.end]
		if len(raw) > bigItem {
			continue
		}
		if it.p, it.id, it.err = puzzle.DecodeItem(raw); it.err != nil {
			return
		}
	}
}

// stageBlocks stages the blocks' items in order, as item does, and
// returns the first error by line order, or io.EOF once the body ended
// well.
func (g *run) stageBlocks(ordered <-chan *block) error {
	ctx := g.ctx
	for b := range ordered {
		<-b.done
		for i := range b.items {
			it := &b.items[i]
			at := where{line: it.line}
			if g.w.Total() >= g.d.cfg.MaxItems {
				return at.wrap(solvers.TooLarge("", "a batch holds at most %d items", g.d.cfg.MaxItems))
			}
			raw := b.raw[it.off:it.end]
			if len(raw) > bigItem {
				it.p, it.id, it.err = g.decode(raw)
			}
			if it.err != nil {
				return at.wrap(it.err)
			}
			if err := g.stage(ctx, it.p, it.id, at); err != nil {
				return err
			}
			it.p = nil
		}
		if b.end != nil && b.end != io.EOF {
			return b.end
		}
		g.window.Add(-b.weight)
		if err := g.settle(0); err != nil {
			return err
		}
		if b.end != nil {
			return b.end
		}
	}
	// The reader stopped without an end: only when told to.
	return errors.New("ingest: batch reader stopped early")
}

// array stages a {"tasks": [...]} body.
func (g *run) array(r io.Reader) error {
	d := puzzle.NewBatchDecoder(r, g.d.cfg.MaxItems)
	for {
		i := d.Index()
		raw, err := d.NextRaw()
		if err == io.EOF {
			if u, ok := d.Webhook(); ok {
				g.out.Webhook = &u
			}
			return nil
		}
		if err != nil {
			return err
		}
		if err := g.item(raw, where{field: "tasks[" + strconv.Itoa(i) + "]"}); err != nil {
			return err
		}
	}
}

// Judge stages every case of a judge-format body, read whole (the
// formats' parsers are not streams, and their inputs are small), and
// closes w. The decode takes its memory from t (when not nil) and a
// decode slot. As with Stream, the caller must Discard w on an error.
func (d *Decoder) Judge(ctx context.Context, f puzzle.Format, body []byte, t *admission.Ticket, w Stager, withHash bool) (*Result, error) {
	out := &Result{Kinds: map[puzzle.Kind]int{}}
	reqs, _, err := d.decodeBatchSlot(ctx, t, f, body)
	if err != nil {
		return out, err
	}
	if len(reqs) == 0 {
		return out, &solvers.InputError{Code: apitype.CodeInvalidRequest, Field: "body", Msg: "a batch needs at least one case"}
	}
	if len(reqs) > d.cfg.MaxItems {
		return out, &solvers.InputError{Code: apitype.CodeTooLarge, Field: "body",
			Msg: fmt.Sprintf("a batch holds at most %d tasks, got %d", d.cfg.MaxItems, len(reqs))}
	}
	for _, p := range reqs {
		if err := w.Add(ctx, d.staged(p, "")); err != nil {
			return out, err
		}
		out.Kinds[p.Kind()]++
	}
	if err := w.Close(ctx); err != nil {
		return out, err
	}
	out.Format = string(f)
	if withHash {
		sum := sha256.Sum256(append([]byte(string(f)+"\n"), body...))
		out.Hash = hex.EncodeToString(sum[:])
	}
	return out, nil
}

// item decodes and stages one item.
func (g *run) item(raw []byte, at where) error {
	ctx := g.ctx
	if at.line > 0 && g.w.Total() >= g.d.cfg.MaxItems {
		return at.wrap(solvers.TooLarge("", "a batch holds at most %d items", g.d.cfg.MaxItems))
	}
	p, id, err := g.decode(raw)
	if err != nil {
		return at.wrap(err)
	}
	if err := g.stage(ctx, p, id, at); err != nil {
		return err
	}
	return g.settle(len(raw))
}

// stage stages one decoded item, after checking its custom_id against the
// earlier ones.
func (g *run) stage(ctx context.Context, p *puzzle.Parsed, id string, at where) error {
	if id != "" {
		if err := g.checkDuplicate(ctx, id, at); err != nil {
			return err
		}
	}
	if err := g.w.Add(ctx, g.d.staged(p, id)); err != nil {
		return err
	}
	g.out.Kinds[p.Kind()]++
	return nil
}

// decode decodes one item; a large one takes a decode slot and the memory
// its decoding takes, so that several megabyte fills are not blown up at
// once.
func (g *run) decode(raw []byte) (*puzzle.Parsed, string, error) {
	if len(raw) <= bigItem {
		return puzzle.DecodeItem(raw)
	}
	ctx := g.ctx
	n := decodeFactor * int64(len(raw))
	t := g.body.Ticket()
	if err := t.Take(ctx, n); err != nil {
		g.body.Failed(err)
		return nil, "", err
	}
	defer t.Put(n)
	select {
	case g.d.decodes <- struct{}{}:
		defer func() { <-g.d.decodes }()
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
	p, id, err := puzzle.DecodeItem(raw)
	if err == nil {
		p = p.Compact()
	}
	return p, id, err
}

// settle makes the request's share of the pool what it holds now: the
// writer's unwritten chunks, the reader's buffer and the last item's raw
// bytes (which a reader may still hold), giving back what was staged and
// written since.
func (g *run) settle(last int) error {
	if g.body == nil {
		return nil
	}
	t := g.body.Ticket()
	want := g.w.Buffered() + readSlack + g.window.Load() + int64(last)
	switch held := t.Holding(); {
	case held > want:
		t.Put(held - want)
	case held < want:
		if err := g.body.Take(want - held); err != nil {
			g.body.Failed(err)
			return err
		}
	}
	return nil
}

// staged is the stored form of a decoded item.
func (d *Decoder) staged(p *puzzle.Parsed, customID string) store.StagedItem {
	own := !p.Cheap() || len(p.Payload()) > min(ownPayload, chunkPayload/max(d.cfg.ChunkSize, 1))
	return store.StagedItem{CustomID: customID, Kind: p.Kind(), Request: p.Payload(), Own: own, Timeout: d.Timeout(p.Kind(), own)}
}

// Timeout is what an item of kind k adds to its unit's timeout: its
// kind's deadline, at most cheapItemTimeout in a chunk (not own).
func (d *Decoder) Timeout(k puzzle.Kind, own bool) time.Duration {
	dl := d.cfg.Deadline[k]
	if !own {
		dl = min(dl, cheapItemTimeout)
	}
	return dl
}

// dupIndex finds a repeated custom_id in bounded memory: 16 bytes an item
// that has one (a 64-bit hash and where it was), not the IDs themselves.
// A hash match is confirmed by reading the earlier ID back from the
// writer, so a collision costs one read and never a false 400.
type dupIndex struct {
	seed maphash.Seed
	seen map[uint64]uint64 // hash -> line<<32 | index
	// exact holds the IDs whose hash another ID already had: so rare
	// (64-bit hashes, a random seed) that it is a map of strings.
	exact map[string]uint64
}

// checkDuplicate records the custom_id of the next item (at) and fails,
// naming both items, when an earlier item has it.
func (g *run) checkDuplicate(ctx context.Context, id string, at where) error {
	d := &g.dups
	if d.seen == nil {
		d.seed, d.seen = maphash.MakeSeed(), map[uint64]uint64{}
	}
	here := uint64(at.line)<<32 | uint64(g.w.Total())
	h := maphash.String(d.seed, id)
	prev, ok := d.seen[h]
	if !ok {
		d.seen[h] = here
		return nil
	}
	other, err := g.w.CustomIDAt(ctx, int(uint32(prev)))
	if err != nil {
		return err
	}
	if other != id {
		if p, ok := d.exact[id]; ok {
			prev = p
		} else {
			if d.exact == nil {
				d.exact = map[string]uint64{}
			}
			d.exact[id] = here
			return nil
		}
	}
	first := where{line: int(prev >> 32), field: "tasks[" + strconv.Itoa(int(uint32(prev))) + "]"}
	if at.line > 0 {
		return &solvers.InputError{Code: apitype.CodeInvalidRequest, Field: "custom_id", Line: at.line,
			Msg: fmt.Sprintf("custom_id: %q is already the custom_id of %s", truncateID(id), first)}
	}
	field := at.field + ".custom_id"
	return &solvers.InputError{Code: apitype.CodeInvalidRequest, Field: field,
		Msg: fmt.Sprintf("%s: %q is already the custom_id of %s", field, truncateID(id), first)}
}

// truncateID keeps an echoed custom_id short; it is at most 64 bytes, so
// this only guards the message's size against a change of that bound.
func truncateID(id string) string {
	if len(id) <= apitype.MaxCustomIDBytes {
		return id
	}
	return id[:apitype.MaxCustomIDBytes] + "..."
}

// decodeFactor is the memory a batch decode takes for a moment beyond its
// body, per body byte: measured for 1000x1000 fills (the worst case:
// each cell's two bytes of JSON become an 8-byte int while it is
// validated), the raw items and the payloads being encoded.
const decodeFactor = 4

// decodeBatchSlot decodes a batch body in one of the decode slots, with
// the memory the decode takes taken from the pool for its duration: a
// large body decodes only when there is room for it (or when it is the
// oldest request), so two 12 MB fill bodies are not blown up at once.
//
// The memory is taken before the slot, never while holding one: a request
// waiting for room with a slot in hand would keep the oldest request,
// whose room is certain, from decoding, and with it the pool from ever
// emptying.
func (d *Decoder) decodeBatchSlot(ctx context.Context, t *admission.Ticket, f puzzle.Format, body []byte) ([]*puzzle.Parsed, string, error) {
	if t != nil {
		n := decodeFactor * int64(len(body))
		if err := t.Take(ctx, n); err != nil {
			return nil, "", err
		}
		defer t.Put(n)
	}
	select {
	case d.decodes <- struct{}{}:
		defer func() { <-d.decodes }()
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
	return d.decodeBatch(f, body)
}

// decodeBatch decodes a batch body in format f (puzzle owns the formats)
// and returns the format as the batch stores it: "" for JSON.
func (d *Decoder) decodeBatch(f puzzle.Format, body []byte) ([]*puzzle.Parsed, string, error) {
	if f == puzzle.FormatJSON {
		reqs, err := puzzle.DecodeBatch(body, d.cfg.MaxItems)
		return reqs, "", err
	}
	reqs, err := puzzle.ReadRequests(bytes.NewReader(body), f)
	if err != nil {
		return nil, "", puzzle.PrefixField(err, "body")
	}
	return reqs, string(f), nil
}
