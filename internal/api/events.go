package api

// GET /v1/batches/{id}/events streams a batch's progress as Server-Sent
// Events: a progress event whenever its counts change, an item event for
// each task as it ends, and a done event once every task has ended, when
// the stream ends. Everything is read from the record store (the batch's
// counts and its chunks, as /results reads them), so a stream holds no
// state that a resume could not rebuild.
//
// An item event's id is the stream's watermark after it: the index below
// which every task has ended and been sent. A client that reconnects
// with that id as Last-Event-ID (EventSource does by itself) is sent
// every ended task from it on again, so nothing is lost; a task that
// ended ahead of the watermark (out of submission order) may be sent
// twice, and its index tells the copies apart.
//
// A stream's memory is bounded whatever the batch: it remembers which
// tasks it sent in a window of eventsWindow items from the watermark on
// (a bitmap of at most eventsWindowBytes), so a slow first task cannot
// make it grow with the tasks that end after it, and a resume from id 0
// rebuilds no more than that. A task that ends further ahead than the
// window is sent once the watermark comes within the window of it.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/admission"
	"github.com/puzzleq/puzzleq/internal/store"
)

// eventsParams are the query parameters of /events: from, as
// Last-Event-ID, for clients that cannot set headers.
var eventsParams = []string{"from"}

// eventsPoll is how often a stream re-reads its batch when no event woke
// it: the chunk events it waits on are those of its watermark's chunk,
// and tasks further on end without waking it.
const eventsPoll = 500 * time.Millisecond

// eventsHeartbeat is how often an idle stream sends a comment, so that
// proxies and the client see it is alive.
const eventsHeartbeat = 15 * time.Second

// errStreamEnded ends a stream when the server shuts down (EndWaits).
var errStreamEnded = errors.New("the server is shutting down")

// eventsRetry is the reconnection delay the stream asks of EventSource.
const eventsRetry = 2 * time.Second

// eventsWindow is how many tasks from its watermark on a stream keeps
// track of (a bit each): a stream holds at most eventsWindowBytes of
// such state, a key at most MAX_STREAMS_PER_KEY times that on a replica.
// 131,072 covers a batch of 100,000 whole, so only a larger batch whose
// tasks end far out of order sees its later item events wait.
const (
	eventsWindow      = 1 << 17
	eventsWindowBytes = eventsWindow / 8
)

func (s *Server) batchEvents(c *gin.Context) {
	if err := onlyParams(c, eventsParams); err != nil {
		fail(c, err)
		return
	}
	from, err := eventsFrom(c)
	if err != nil {
		fail(c, err)
		return
	}
	b, err := s.loadStreamed(c, 0)
	if err != nil {
		fail(c, err)
		return
	}
	if b.Stride <= 0 && b.Total > 0 {
		fail(c, fmt.Errorf("batch %s has no stride", b.ID))
		return
	}
	// Each stream polls Redis until it ends, so a key holds a bounded
	// number open at once on this replica (SECURITY.md).
	owner := ownerOf(c)
	if !s.streams.open(owner, s.opts.MaxStreamsPerKey) {
		fail(c, newError(http.StatusTooManyRequests, apitype.CodeRateLimited, "",
			"this key has %d event streams open, the most allowed (MAX_STREAMS_PER_KEY); close one first", s.opts.MaxStreamsPerKey))
		return
	}
	defer s.streams.close(owner)
	// A stream lasts at most MAX_WAIT; EventSource reconnects by itself,
	// from the last id.
	ctx, cancel := context.WithTimeout(c.Request.Context(), s.opts.MaxWait)
	defer cancel()
	t := s.admit.Ticket(owner)
	defer t.Release()
	es := &eventStream{s: s, c: c, rc: http.NewResponseController(c.Writer), t: t,
		sent: newSentWindow(min(from, b.Total), b.Total-min(from, b.Total), eventsWindow)}
	// The connection may carry another request after the stream.
	defer func() { _ = es.rc.SetWriteDeadline(time.Time{}) }()
	h := c.Writer.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	c.Status(http.StatusOK)
	if err := es.write([]byte("retry: " + strconv.Itoa(int(eventsRetry/time.Millisecond)) + "\n\n")); err != nil {
		return
	}
	if err := es.run(ctx, b); err != nil && ctx.Err() == nil && !errors.Is(err, errStreamEnded) {
		s.log.Info("batch events ended early", "batch_id", b.ID, "err", err)
	}
}

// eventsFrom reads where a stream starts: ?from= or Last-Event-ID, an
// item index; 0 when neither is set.
func eventsFrom(c *gin.Context) (int, error) {
	field, v := "from", c.Query("from")
	if v == "" {
		field, v = "Last-Event-ID", c.GetHeader("Last-Event-ID")
	}
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || strconv.Itoa(n) != v {
		return 0, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, field,
			"%s must be an event id of this stream (an item index); got %q", field, truncate(v, 20))
	}
	return n, nil
}

// streamCounts counts the open event streams of each key.
type streamCounts struct {
	mu sync.Mutex
	n  map[string]int
}

// open counts one more stream of owner, unless it has limit open already.
func (sc *streamCounts) open(owner string, limit int) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.n[owner] >= limit {
		return false
	}
	if sc.n == nil {
		sc.n = map[string]int{}
	}
	sc.n[owner]++
	return true
}

// close counts one stream of owner fewer.
func (sc *streamCounts) close(owner string) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.n[owner]--; sc.n[owner] <= 0 {
		delete(sc.n, owner)
	}
}

// eventStream is one client's stream.
type eventStream struct {
	s  *Server
	c  *gin.Context
	rc *http.ResponseController
	t  *admission.Ticket
	// sent is the watermark and the tasks sent ahead of it.
	sent *sentWindow
	// last is the progress last sent.
	last     *apitype.BatchProgress
	scanned  int // the batch's ended count at the last scan; -1 before
	scannedW int // the watermark after the last scan
}

// write sends p and flushes it, under a write deadline of
// REQUEST_TIMEOUT, so a client that stops reading is cut.
func (e *eventStream) write(p []byte) error {
	_ = e.rc.SetWriteDeadline(time.Now().Add(e.s.opts.RequestTimeout))
	if _, err := e.c.Writer.Write(p); err != nil {
		return err
	}
	return e.rc.Flush()
}

// event sends one event; id < 0 sends none (the client's last id stays).
func (e *eventStream) event(name string, id int, data any) error {
	j, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("encode %s event: %w", name, err)
	}
	var buf bytes.Buffer
	if id >= 0 {
		buf.WriteString("id: " + strconv.Itoa(id) + "\n")
	}
	buf.WriteString("event: " + name + "\ndata: ")
	buf.Write(j)
	buf.WriteString("\n\n")
	return e.write(buf.Bytes())
}

func progressOf(b *store.Batch) *apitype.BatchProgress {
	return &apitype.BatchProgress{ID: b.ID, Total: b.Total, Done: b.Done(), DoneAt: timePtr(b.DoneAt),
		Counts: apitype.Counts{Pending: b.Counts[apitype.TaskStatePending], Active: b.Counts[apitype.TaskStateActive],
			Completed: b.Counts[apitype.TaskStateCompleted], Failed: b.Counts[apitype.TaskStateFailed],
			Canceled: b.Counts[apitype.TaskStateCanceled]}}
}

// run sends events until the batch is done and every task was sent, or
// ctx ends.
func (e *eventStream) run(ctx context.Context, b *store.Batch) error {
	e.scanned = -1
	heartbeat := time.NewTicker(eventsHeartbeat)
	defer heartbeat.Stop()
	for {
		// Subscribe first, then read, so an event between the two
		// wakes the next wait.
		fired, release := e.s.waiter.Wait(store.BatchEventKey(b.ID))
		cfired, crelease := e.s.waiter.Wait(store.ChunkEventKey(b.ID, e.chunk(b)))
		err := e.round(ctx, b)
		if err == nil && b.Done() && e.sent.w >= b.Total {
			err = e.event("done", e.sent.w, progressOf(b))
			release()
			crelease()
			return err
		}
		if err != nil {
			release()
			crelease()
			return err
		}
		poll := time.NewTimer(eventsPoll)
		select {
		case <-fired:
		case <-cfired:
		case <-poll.C:
		case <-heartbeat.C:
			err = e.write([]byte(": keepalive\n\n"))
		case <-ctx.Done():
			err = ctx.Err()
		case <-e.s.ending:
			// Shutting down: end the stream now rather than be cut at
			// SHUTDOWN_TIMEOUT; EventSource reconnects, to another
			// replica, from the last id.
			err = errStreamEnded
		}
		poll.Stop()
		release()
		crelease()
		if err != nil {
			return err
		}
		nb, rerr := e.s.store.GetBatch(ctx, b.ID)
		if rerr != nil {
			return rerr
		}
		*b = *nb
	}
}

// chunk is the chunk of the watermark.
func (e *eventStream) chunk(b *store.Batch) int {
	if b.Stride <= 0 {
		return 0
	}
	return min(e.sent.w, max(b.Total-1, 0)) / b.Stride
}

// round sends a progress event when the counts changed, and an item
// event for every task that ended since the last round.
func (e *eventStream) round(ctx context.Context, b *store.Batch) error {
	if p := progressOf(b); e.last == nil || p.Counts != e.last.Counts || p.Done != e.last.Done {
		if err := e.event("progress", -1, p); err != nil {
			return err
		}
		e.last = p
	}
	ended := b.Ended()
	if ended == e.scanned && e.sent.w == e.scannedW {
		return nil
	}
	e.scanned = ended
	// Every task below the watermark and marked ahead of it was sent:
	// once as many as have ended were, the rest of the batch has nothing
	// new; past the window nothing is sent yet.
	for j := e.chunk(b); j < b.Chunks() && j*b.Stride < e.sent.end() && e.sent.count() < ended; j++ {
		if err := e.sendChunk(ctx, b, j); err != nil {
			return err
		}
	}
	e.scannedW = e.sent.w
	return nil
}

// sendChunk sends the tasks of chunk j that have ended and were not sent.
func (e *eventStream) sendChunk(ctx context.Context, b *store.Batch, j int) error {
	infos, err := e.s.store.ChunkInfos(ctx, b, j)
	if err != nil {
		return err
	}
	if want := min(b.Stride, b.Total-j*b.Stride); len(infos) != want {
		return fmt.Errorf("chunk %d: %w", j, errResultGone)
	}
	var send []*store.ChunkInfo
	var fetch []int
	var bytes int64
	for i := range infos {
		in := &infos[i]
		if !in.State.Terminal() || !e.sent.covers(in.Index) || e.sent.has(in.Index) {
			continue
		}
		send = append(send, in)
		if in.State == apitype.TaskStateCompleted && in.Result == "" && in.ResultBytes <= apitype.MaxEventResult {
			fetch = append(fetch, in.Index)
			bytes += in.ResultBytes
		}
	}
	if len(send) == 0 {
		return nil
	}
	results := map[int]string{}
	if len(fetch) > 0 {
		// As /results does: what a read of results holds is taken from
		// the admission pool first.
		if err := e.t.Take(ctx, 2*bytes); err != nil {
			return err
		}
		defer e.t.Put(2 * bytes)
		res, ok, err := e.s.store.ChunkResults(ctx, b, j, fetch)
		if err != nil {
			return err
		}
		for k, idx := range fetch {
			if k < len(res) && k < len(ok) && ok[k] {
				results[idx] = res[k]
			}
		}
	}
	for _, in := range send {
		ev := apitype.ItemEvent{Index: in.Index, ID: apitype.ItemID(b.ID, in.Index), CustomID: in.CustomID,
			State: in.State, Error: in.Error}
		if in.State == apitype.TaskStateCompleted {
			ev.ResultBytes = in.ResultBytes
			r := in.Result
			if r == "" {
				r = results[in.Index]
			}
			if r != "" {
				ev.Result = json.RawMessage(r)
			}
		}
		e.sent.mark(in.Index)
		if err := e.event("item", e.sent.w, ev); err != nil {
			return err
		}
	}
	return nil
}

// sentWindow is a stream's watermark w and which tasks of the window
// [w, w+size) it sent: a ring of bits, task i at bit i mod size, so its
// memory is fixed at its start (size/8 bytes, size at most the window
// asked for and no more than the batch needs).
type sentWindow struct {
	w     int
	ahead int // tasks at or above w marked sent
	bits  []uint64
}

// newSentWindow starts a window at w for a batch with left tasks from w
// on, covering at most window tasks.
func newSentWindow(w, left, window int) *sentWindow {
	words := (min(max(left, 1), window) + 63) / 64
	return &sentWindow{w: w, bits: make([]uint64, words)}
}

// end is the first task past the window.
func (s *sentWindow) end() int { return s.w + 64*len(s.bits) }

// count is how many tasks were sent: those below w and those ahead.
func (s *sentWindow) count() int { return s.w + s.ahead }

// covers reports whether task i is in the window, at or above w.
func (s *sentWindow) covers(i int) bool { return i >= s.w && i < s.end() }

// has reports whether task i was sent: every one below w was; one past
// the window was not.
func (s *sentWindow) has(i int) bool {
	if i < s.w {
		return true
	}
	if i >= s.end() {
		return false
	}
	b := i % (64 * len(s.bits))
	return s.bits[b/64]&(1<<(b%64)) != 0
}

// mark records task i, in the window, as sent, and moves w past every
// task sent from it on, freeing their bits for the tasks the window
// then reaches.
func (s *sentWindow) mark(i int) {
	if !s.covers(i) || s.has(i) {
		return
	}
	n := 64 * len(s.bits)
	b := i % n
	s.bits[b/64] |= 1 << (b % 64)
	s.ahead++
	for s.ahead > 0 {
		b := s.w % n
		if s.bits[b/64]&(1<<(b%64)) == 0 {
			return
		}
		s.bits[b/64] &^= 1 << (b % 64)
		s.ahead--
		s.w++
	}
}
