package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
)

// pool bounds the bytes that requests hold in the API's memory at once:
// request bodies as they arrive, and results on their way out. A request
// takes weight for each piece as it holds it, never ahead (a slow upload
// that has sent ten bytes holds ten bytes), and gives it all back when it
// ends.
//
// Taking weight bit by bit invites a deadlock that a plain weighted
// semaphore (golang.org/x/sync/semaphore) cannot avoid: when every request
// holds part of the pool and waits for more, none can finish. So the
// oldest holder may always take more, beyond the capacity: it can never be
// blocked, it finishes and gives back, and the next oldest goes on. The
// memory bound is thus the capacity plus one request's own limit (its body
// limit, or one result).
type pool struct {
	capacity int64

	mu      sync.Mutex
	used    int64
	holders []*ticket     // in the order of their first take; holders[0] may overdraw
	changed chan struct{} // closed and replaced whenever weight is given back
}

func newPool(capacity int64) *pool {
	return &pool{capacity: capacity, changed: make(chan struct{})}
}

// ticket is one request's share of the pool.
type ticket struct {
	p    *pool
	held int64
}

// ticket returns an empty share for one request; release it when the
// request ends.
func (p *pool) ticket() *ticket { return &ticket{p: p} }

// take adds n bytes to the share, waiting while the pool is full and the
// ticket is not the oldest holder. It fails only when ctx ends.
func (t *ticket) take(ctx context.Context, n int64) error { return t.takeUntil(ctx, time.Time{}, n) }

// takeUntil is take that also gives up at deadline (none when zero); it
// makes a timer only when it has to wait, so a body's reads, which take
// from a pool that is seldom full, cost no allocation for it.
func (t *ticket) takeUntil(ctx context.Context, deadline time.Time, n int64) error {
	if n <= 0 {
		return nil
	}
	p := t.p
	var expired <-chan time.Time
	for {
		p.mu.Lock()
		oldest := len(p.holders) == 0 || p.holders[0] == t
		if p.used+n <= p.capacity || oldest {
			if t.held == 0 {
				p.holders = append(p.holders, t)
			}
			t.held += n
			p.used += n
			p.mu.Unlock()
			return nil
		}
		changed := p.changed
		p.mu.Unlock()
		if expired == nil && !deadline.IsZero() {
			timer := time.NewTimer(time.Until(deadline))
			defer timer.Stop()
			expired = timer.C
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-expired:
			return context.DeadlineExceeded
		}
	}
}

// put gives back n bytes of the share, which must hold them.
func (t *ticket) put(n int64) {
	p := t.p
	p.mu.Lock()
	defer p.mu.Unlock()
	n = min(n, t.held)
	if n <= 0 {
		return
	}
	t.held -= n
	p.used -= n
	if t.held == 0 {
		p.drop(t)
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// drop takes t out of the holders: one that holds nothing is no holder,
// or it would stay first for good and no other could ever be the oldest.
// The caller holds p.mu.
func (p *pool) drop(t *ticket) {
	for i, h := range p.holders {
		if h == t {
			p.holders = append(p.holders[:i], p.holders[i+1:]...)
			return
		}
	}
}

// holding is the share's weight now. The body's reader may take more
// meanwhile, on another goroutine.
func (t *ticket) holding() int64 {
	t.p.mu.Lock()
	defer t.p.mu.Unlock()
	return t.held
}

// release gives back the whole share. The ticket may take again after.
func (t *ticket) release() {
	p := t.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.held == 0 {
		return
	}
	p.used -= t.held
	t.held = 0
	p.drop(t)
	close(p.changed)
	p.changed = make(chan struct{})
}

// inUse reports the bytes held, for the metrics and tests.
func (p *pool) inUse() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

// readChunk is the most a body read takes from the connection at once, so
// that weight follows the bytes closely.
const readChunk = 32 << 10

// meteredBody reads a request body under a read deadline that moves with
// the bytes (bodyClock), taking the bytes it returns from the request's
// ticket. Make it with meterBody and call done once the body is read.
type meteredBody struct {
	ctx   context.Context // the request's
	r     io.Reader
	t     *ticket
	err   error     // a failed take, reported instead of the read's error
	clock bodyClock // touched by the reading goroutine only
	// rc sets the connection's read deadline; nil when the writer has
	// none (httptest's recorder), and the pool still bounds the memory.
	rc *http.ResponseController
	dl atomic.Int64 // the body's deadline now, in Unix nanoseconds
	// timedOut is set when a read failed at the body's deadline, which
	// also cancels the request's context (net/http's connReader).
	timedOut atomic.Bool
	// cut is set when the handler ended the body itself (cutOff): a read
	// that fails after it did not time out, and no read moves the
	// deadline back.
	cut atomic.Bool
}

// cutOff ends a body that the handler stopped reading for a reason of
// its own (staging failed): a reader waiting for bytes returns at once,
// not at the body's deadline, and the failure is not the client's.
func (b *meteredBody) cutOff() {
	b.cut.Store(true)
	if b.rc != nil {
		_ = b.rc.SetReadDeadline(time.Now())
	}
}

// meterBody starts reading the request's body, at most limit bytes, under
// the body's deadline, with a new ticket of the pool that the request
// releases when it ends (admitted).
//
// The deadline is the connection's read deadline, set here for the body
// alone and cleared once it is in (Go's server also clears it when it
// starts reading the connection in the background), so a long poll is
// never cut by it. A server-wide ReadTimeout would instead count the
// headers too, and could not tell a batch body from a one-line task.
func (s *Server) meterBody(c *gin.Context, limit int64) *meteredBody {
	t := s.admit.ticket()
	c.Set(ctxTicket, t)
	b := &meteredBody{ctx: c.Request.Context(), r: http.MaxBytesReader(c.Writer, c.Request.Body, limit), t: t,
		clock: bodyClock{start: time.Now(), grace: s.opts.BodyReadTimeout, rate: s.opts.BodyMinRate}}
	dl := b.clock.deadline()
	b.dl.Store(dl.UnixNano())
	if rc := http.NewResponseController(c.Writer); rc.SetReadDeadline(dl) == nil {
		b.rc = rc
	}
	return b
}

// done clears the connection's read deadline.
func (b *meteredBody) done() {
	if b.rc != nil {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
}

func (b *meteredBody) Read(p []byte) (int, error) {
	if len(p) > readChunk {
		p = p[:readChunk]
	}
	n, err := b.r.Read(p)
	if errors.Is(err, os.ErrDeadlineExceeded) && !b.cut.Load() {
		b.timedOut.Store(true)
	}
	if n > 0 {
		b.clock.got += int64(n)
		dl := b.clock.deadline()
		b.dl.Store(dl.UnixNano())
		// Not at the end: the read that hits it starts the server's
		// background read, whose deadline must stay cleared. Nor once
		// the handler cut the body off.
		if err == nil && b.rc != nil && !b.cut.Load() {
			_ = b.rc.SetReadDeadline(dl)
			if b.cut.Load() { // cutOff ran between the check and the set
				_ = b.rc.SetReadDeadline(time.Now())
			}
		}
		if terr := b.take(int64(n)); terr != nil {
			b.err = terr
			return 0, terr
		}
	}
	return n, err
}

// take adds n bytes to the body's ticket, waiting for the pool at most
// until the body's deadline.
func (b *meteredBody) take(n int64) error {
	return b.t.takeUntil(b.ctx, time.Unix(0, b.dl.Load()), n)
}

// maxBodyTime bounds any body's arrival, however steadily it comes: a
// batch's items are staged in Redis as they arrive and kept there for
// store.StagingTTL until the commit, so an upload must end well within
// that, decoding and commit included.
const maxBodyTime = store.StagingTTL * 4 / 5

// bodyClock is the deadline of a body as it arrives: grace
// (BodyReadTimeout) from its start, plus the time its bytes so far are
// allowed at rate (BodyMinRate), and never more than maxBodyTime. A body
// that keeps coming at the rate or faster is never cut, whatever its
// size within the limits; one that stalls is cut grace after the time
// its bytes bought, so a trickle of a byte every few seconds holds its
// connection for little more than grace.
type bodyClock struct {
	start time.Time
	grace time.Duration
	rate  int64 // bytes a second
	got   int64 // bytes arrived
}

func (k *bodyClock) deadline() time.Time { return k.start.Add(bodyTime(k.grace, k.rate, k.got)) }

// bodyTime is the time a body of n bytes may take: grace, plus n bytes
// at rate, at most maxBodyTime.
func bodyTime(grace time.Duration, rate, n int64) time.Duration {
	if rate <= 0 {
		return min(grace, maxBodyTime)
	}
	return min(grace+time.Duration(float64(n)/float64(rate)*float64(time.Second)), maxBodyTime)
}

// errBodyTimeout marks a body that did not arrive within the read deadline.
var errBodyTimeout = newError(http.StatusRequestTimeout, apitype.CodeRequestTimeout, "",
	"the request body did not arrive in time")

// errAdmission marks a body that could not be admitted before its deadline
// because others filled the API's memory.
var errAdmission = newError(http.StatusServiceUnavailable, apitype.CodeUnavailable, "",
	"the server is busy reading other requests; retry later")

// readBody reads at most limit bytes of the body under the body's
// deadline (bodyClock), counting them against the pool as they arrive.
// The ticket is released when the request ends, so the bytes count for
// as long as the handler holds what it made of them. Errors: 413 beyond
// limit, 408 when the body is too slow, 503 when the pool stayed full
// until the deadline.
func (s *Server) readBody(c *gin.Context, limit int64) ([]byte, error) {
	if c.Request.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	mb := s.meterBody(c, limit)
	defer mb.done()
	// The buffer grows with what has arrived, never to the declared
	// length ahead of the bytes: a client declaring 16 MiB and sending a
	// byte every few seconds must not make us allocate 16 MiB. Growth
	// doubles, capped at the declared length, so a body that does arrive
	// ends in a buffer of its exact size.
	declared := c.Request.ContentLength
	buf := make([]byte, 0, min(max(declared+1, 512), readChunk))
	for {
		if len(buf) == cap(buf) {
			n := 2 * cap(buf)
			if declared > 0 && int64(n) > declared+1 {
				n = int(declared + 1)
			}
			buf = append(make([]byte, 0, max(n, cap(buf)+1)), buf...)
		}
		n, err := mb.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, s.bodyError(c, mb, err)
		}
	}
}

// bodyError maps a failed body read to its answer.
func (s *Server) bodyError(c *gin.Context, mb *meteredBody, err error) error {
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		return err
	case mb.err != nil && c.Request.Context().Err() == nil:
		// The pool stayed full: the client did nothing wrong.
		c.Header("Connection", "close")
		return errAdmission
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.Header("Connection", "close")
		s.metrics.bodyTimeouts.Inc()
		return errBodyTimeout
	case c.Request.Context().Err() != nil:
		return c.Request.Context().Err()
	}
	return newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "", "could not read the request body")
}

// ctxTicket is where readBody leaves the request's ticket, for the
// middleware that releases it.
const ctxTicket = "puzzleq.ticket"

// admitted releases the request's share of the pool when it ends.
func (s *Server) admitted() gin.HandlerFunc {
	return func(c *gin.Context) {
		c.Next()
		if t, ok := c.Get(ctxTicket); ok {
			t.(*ticket).release()
		}
	}
}
