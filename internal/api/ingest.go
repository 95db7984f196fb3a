package api

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
	"mime"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
)

// A batch body is read as a stream and staged item by item (see
// docs/batches.md): never the whole body, never all the items. What the
// request holds in memory at once is the reader's buffer, the item being
// decoded and the chunks the writer has not yet sent to Redis, and that is
// what it holds of the admission pool: bytes are taken as they arrive
// (meteredBody) and given back as items are staged and chunks written.

// stager is where ingest puts a batch's items; *store.BatchWriter.
type stager interface {
	Add(ctx context.Context, it store.StagedItem) error
	Total() int
	Buffered() int64
	CustomIDAt(ctx context.Context, index int) (string, error)
	Close(ctx context.Context) error
	Discard(ctx context.Context) error
}

// contentNDJSON is the media type of a batch of one item per line.
const contentNDJSON = "application/x-ndjson"

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

// maxJudgeBody bounds a judge-format batch body, which is read whole (the
// judges' parsers are not streams); their inputs are a few megabytes.
const maxJudgeBody = 16 << 20

// cheapItemTimeout caps what a cheap item adds to its chunk's timeout, as
// tasks.NewChunkUnit does: a kind's deadline is sized for its hardest
// boards, which never ride in a chunk.
const cheapItemTimeout = time.Minute

// ingested is what reading a batch body made.
type ingested struct {
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

// ingest reads the request's batch body in the form its Content-Type and
// ?format= name and stages every item in w. On an error nothing it staged
// is left behind: the caller must Discard w (ingest does not, so that one
// path discards whatever failed).
func (s *Server) ingest(c *gin.Context, w stager, withHash bool) (*ingested, error) {
	f, err := puzzle.ParseFormat(c.Query("format"))
	if err != nil {
		return nil, err
	}
	ndjson := false
	if ct := c.GetHeader("Content-Type"); ct != "" {
		mt, _, _ := mime.ParseMediaType(ct)
		ndjson = mt == contentNDJSON
	}
	if ndjson && f != puzzle.FormatJSON {
		return nil, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "format",
			"format=%s takes the judge's text, not %s", f, contentNDJSON)
	}
	g := &ingestRun{s: s, c: c, w: w, out: &ingested{Kinds: map[puzzle.Kind]int{}}}
	if f != puzzle.FormatJSON {
		return g.out, g.judge(f, withHash)
	}
	form := "json"
	if ndjson {
		form = "ndjson"
	}
	body, done, err := s.openBody(c, s.opts.MaxBatchBodyBytes)
	if err != nil {
		return nil, err
	}
	defer done()
	g.body = body
	var r io.Reader = bodyReader{body}
	if withHash {
		g.hash = sha256.New()
		g.hash.Write([]byte(form + "\n"))
		r = io.TeeReader(body, g.hash)
	}
	if ndjson {
		err = g.lines(r)
	} else {
		err = g.array(r)
	}
	if err != nil {
		return nil, s.streamError(c, body, err)
	}
	if err := w.Close(c.Request.Context()); err != nil {
		return nil, err
	}
	g.settle(0)
	if g.hash != nil {
		g.out.Hash = hex.EncodeToString(g.hash.Sum(nil))
	}
	return g.out, nil
}

// ingestRun is one body being staged.
type ingestRun struct {
	s    *Server
	c    *gin.Context
	w    stager
	body *meteredBody
	hash hash.Hash
	out  *ingested
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
func (g *ingestRun) lines(r io.Reader) error {
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
		// this answer closes it.
		g.c.Header("Connection", "close")
		g.body.cutOff()
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
		return newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "", "a batch needs at least one item: the body has no lines")
	}
	return nil
}

// readBlocks cuts the body into blocks and hands each to the stager (in
// order) and to the decoders, until the body ends or stop is closed. The
// last block carries how the body ended.
func (g *ingestRun) readBlocks(r io.Reader, ordered, work chan<- *block, stop <-chan struct{}) {
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
func (g *ingestRun) stageBlocks(ordered <-chan *block) error {
	ctx := g.c.Request.Context()
	for b := range ordered {
		<-b.done
		for i := range b.items {
			it := &b.items[i]
			at := where{line: it.line}
			if g.w.Total() >= g.s.opts.MaxBatchItems {
				return at.wrap(solvers.TooLarge("", "a batch holds at most %d items", g.s.opts.MaxBatchItems))
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
	return errors.New("api: batch reader stopped early")
}

// array stages a {"tasks": [...]} body.
func (g *ingestRun) array(r io.Reader) error {
	d := puzzle.NewBatchDecoder(r, g.s.opts.MaxBatchItems)
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

// judge stages a judge-format body, read whole: the formats' parsers are
// not streams, and their inputs are small.
func (g *ingestRun) judge(f puzzle.Format, withHash bool) error {
	body, err := g.s.readBody(g.c, min(g.s.opts.MaxBatchBodyBytes, maxJudgeBody))
	if err != nil {
		return err
	}
	reqs, _, err := g.s.decodeBatchSlot(g.c, body)
	if err != nil {
		return err
	}
	if len(reqs) == 0 {
		return newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "body", "a batch needs at least one case")
	}
	if len(reqs) > g.s.opts.MaxBatchItems {
		return newError(http.StatusBadRequest, apitype.CodeTooLarge, "body", "a batch holds at most %d tasks, got %d", g.s.opts.MaxBatchItems, len(reqs))
	}
	ctx := g.c.Request.Context()
	for _, p := range reqs {
		if err := g.w.Add(ctx, g.s.staged(p, "")); err != nil {
			return err
		}
		g.out.Kinds[p.Kind()]++
	}
	if err := g.w.Close(ctx); err != nil {
		return err
	}
	g.out.Format = string(f)
	if withHash {
		sum := sha256.Sum256(append([]byte(string(f)+"\n"), body...))
		g.out.Hash = hex.EncodeToString(sum[:])
	}
	return nil
}

// item decodes and stages one item.
func (g *ingestRun) item(raw []byte, at where) error {
	ctx := g.c.Request.Context()
	if at.line > 0 && g.w.Total() >= g.s.opts.MaxBatchItems {
		return at.wrap(solvers.TooLarge("", "a batch holds at most %d items", g.s.opts.MaxBatchItems))
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
func (g *ingestRun) stage(ctx context.Context, p *puzzle.Parsed, id string, at where) error {
	if id != "" {
		if err := g.checkDuplicate(ctx, id, at); err != nil {
			return err
		}
	}
	if err := g.w.Add(ctx, g.s.staged(p, id)); err != nil {
		return err
	}
	g.out.Kinds[p.Kind()]++
	return nil
}

// decode decodes one item; a large one takes a decode slot and the memory
// its decoding takes, so that several megabyte fills are not blown up at
// once.
func (g *ingestRun) decode(raw []byte) (*puzzle.Parsed, string, error) {
	if len(raw) <= bigItem {
		return puzzle.DecodeItem(raw)
	}
	ctx := g.c.Request.Context()
	n := decodeFactor * int64(len(raw))
	if err := g.body.t.take(ctx, n); err != nil {
		g.body.err = err
		return nil, "", err
	}
	defer g.body.t.put(n)
	select {
	case g.s.decodes <- struct{}{}:
		defer func() { <-g.s.decodes }()
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
func (g *ingestRun) settle(last int) error {
	if g.body == nil {
		return nil
	}
	t := g.body.t
	want := g.w.Buffered() + readSlack + g.window.Load() + int64(last)
	switch held := t.holding(); {
	case held > want:
		t.put(held - want)
	case held < want:
		if err := g.body.take(want - held); err != nil {
			g.body.err = err
			return err
		}
	}
	return nil
}

// staged is the stored form of a decoded item.
func (s *Server) staged(p *puzzle.Parsed, customID string) store.StagedItem {
	own := !p.Cheap() || len(p.Payload()) > min(ownPayload, chunkPayload/max(s.opts.ChunkSize, 1))
	d := s.opts.Limits.Deadline[p.Kind()]
	if !own {
		d = min(d, cheapItemTimeout)
	}
	return store.StagedItem{CustomID: customID, Kind: p.Kind(), Request: p.Payload(), Own: own, Timeout: d}
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
func (g *ingestRun) checkDuplicate(ctx context.Context, id string, at where) error {
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
func truncateID(id string) string { return truncate(id, apitype.MaxCustomIDBytes) }

// openBody prepares the request body to be read as a stream: under the
// body's deadline (bodyClock, as readBody has it), at most limit bytes,
// each byte taken from the request's ticket as it arrives. done clears
// the deadline.
func (s *Server) openBody(c *gin.Context, limit int64) (*meteredBody, func(), error) {
	if c.Request.ContentLength > limit {
		return nil, nil, &http.MaxBytesError{Limit: limit}
	}
	mb := s.meterBody(c, limit)
	return mb, mb.done, nil
}

// bodyReader marks the errors of reading the body, so that they are told
// from those of staging (Redis), which may look alike (a timeout).
type bodyReader struct{ r io.Reader }

func (b bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		err = &bodyReadError{err}
	}
	return n, err
}

// bodyReadError is an error of reading the request body.
type bodyReadError struct{ err error }

func (e *bodyReadError) Error() string { return "read request body: " + e.err.Error() }
func (e *bodyReadError) Unwrap() error { return e.err }

// streamError maps an error of a streamed body to its answer: the
// body's own failures (too large, too slow, cut off, no room in the pool)
// as readBody answers them, the items' and the store's as they are.
func (s *Server) streamError(c *gin.Context, mb *meteredBody, err error) error {
	var (
		ie *solvers.InputError
		ae *apiError
		re *bodyReadError
	)
	switch {
	case errors.As(err, &ie) || errors.As(err, &ae):
		return err
	case errors.As(err, &re):
		return s.bodyError(c, mb, re.err)
	case mb.timedOut.Load():
		// The body's deadline passed, and Go's server cancelled the
		// request's context as its read failed: staging, in flight
		// then, may have failed first, of that cancellation.
		return s.bodyError(c, mb, os.ErrDeadlineExceeded)
	case mb.err != nil:
		// Taking the memory of an item from the pool failed.
		return s.bodyError(c, mb, mb.err)
	}
	return err
}
