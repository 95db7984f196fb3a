package api

import (
	"context"
	"errors"
	"fmt"
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
//
// Each API key (owner) may also hold at most keyCapacity of the pool, so
// that one tenant's uploads, however many and however slow within the
// body deadline, leave the rest of the pool to the others. The same rule
// keeps a key's own requests from deadlocking: the key's oldest holder
// may go past the key's share. The pool's oldest holder is also its
// key's oldest, so it is never blocked by either bound, and the memory
// bound above stands. Requests without an owner (auth off: one tenant)
// are bound by the pool alone.
type pool struct {
	capacity    int64
	keyCapacity int64 // each owner's share; no share when it is the capacity or more

	mu      sync.Mutex
	used    int64
	holders []*ticket            // in the order of their first take; holders[0] may overdraw
	keys    map[string]*keyShare // the owners that hold weight now
	changed chan struct{}        // closed and replaced whenever weight is given back
}

// keyShare is what one owner's requests hold of the pool.
type keyShare struct {
	used    int64
	holders []*ticket // the owner's, in the order of their first take; holders[0] may go past keyCapacity
}

func newPool(capacity, keyCapacity int64) *pool {
	return &pool{capacity: capacity, keyCapacity: keyCapacity, keys: map[string]*keyShare{}, changed: make(chan struct{})}
}

// ticket is one request's share of the pool.
type ticket struct {
	p     *pool
	owner string // the API key's name, "" when auth is off
	held  int64
}

// ticket returns an empty share for one request of owner; release it
// when the request ends.
func (p *pool) ticket(owner string) *ticket { return &ticket{p: p, owner: owner} }

// errKeyShareFull marks a take that gave up while the ticket's owner held
// its whole share of the pool: the owner's own requests were in the way,
// not other tenants'. It wraps why the take gave up (its deadline, or its
// context's error), and a request that met it is answered 429
// rate_limited (errKeyShare), whether it was reading a body or a result.
var errKeyShareFull = errors.New("api: the key's share of the admission pool is full")

// take adds n bytes to the share, waiting while the pool (or the owner's
// share of it) is full and the ticket is not the oldest holder. It fails
// only when ctx ends: with errKeyShareFull wrapping ctx's error when the
// owner's share was what it waited for.
func (t *ticket) take(ctx context.Context, n int64) error { return t.takeUntil(ctx, time.Time{}, n) }

// takeUntil is take that also gives up at deadline (none when zero); it
// makes a timer only when it has to wait, so a body's reads, which take
// from a pool that is seldom full, cost no allocation for it. Giving up
// at the deadline while the owner's share was what stood in the way
// returns errKeyShareFull, which wraps context.DeadlineExceeded.
func (t *ticket) takeUntil(ctx context.Context, deadline time.Time, n int64) error {
	if n <= 0 {
		return nil
	}
	p := t.p
	var expired <-chan time.Time
	for {
		p.mu.Lock()
		poolOK := p.used+n <= p.capacity || len(p.holders) == 0 || p.holders[0] == t
		ks := p.share(t.owner)
		keyOK := ks == nil || ks.used+n <= p.keyCapacity || len(ks.holders) == 0 || ks.holders[0] == t
		if poolOK && keyOK {
			if t.held == 0 {
				p.holders = append(p.holders, t)
				if ks != nil {
					ks.holders = append(ks.holders, t)
				}
			}
			t.held += n
			p.used += n
			if ks != nil {
				ks.used += n
			}
			p.mu.Unlock()
			return nil
		}
		if ks != nil && len(ks.holders) == 0 {
			delete(p.keys, t.owner) // made for this take, which waits
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
			if poolOK {
				return fmt.Errorf("%w: %w", errKeyShareFull, ctx.Err())
			}
			return ctx.Err()
		case <-expired:
			if poolOK {
				return fmt.Errorf("%w: %w", errKeyShareFull, context.DeadlineExceeded)
			}
			return context.DeadlineExceeded
		}
	}
}

// share is owner's share, made when it takes its first bytes; nil when
// owners have no share of their own (no owner, or a share as large as
// the pool). The caller holds p.mu.
func (p *pool) share(owner string) *keyShare {
	if owner == "" || p.keyCapacity >= p.capacity {
		return nil
	}
	ks := p.keys[owner]
	if ks == nil {
		ks = &keyShare{}
		p.keys[owner] = ks
	}
	return ks
}

// pageBytes is the most result bytes one page of a batch's items should
// carry for owner: pageResultBytes, or a quarter of what the page may take
// from (the owner's share, or the pool without one) when that is less. A
// page takes twice its results, so it then needs half of it, and a key
// that has an upload in progress can still read its results instead of
// waiting for the upload to end.
func (p *pool) pageBytes(owner string) int64 {
	room := p.capacity
	if owner != "" {
		room = min(room, p.keyCapacity)
	}
	return max(1, min(pageResultBytes, room/4))
}

// put gives back n bytes of the share, which must hold them.
func (t *ticket) put(n int64) {
	p := t.p
	p.mu.Lock()
	defer p.mu.Unlock()
	p.giveBack(t, min(n, t.held))
}

// giveBack takes n bytes off t and wakes the waiters; when t holds
// nothing more it is no holder, of the pool or of its owner's share, or
// it would stay first for good and no other could ever be the oldest.
// The caller holds p.mu.
func (p *pool) giveBack(t *ticket, n int64) {
	if n <= 0 {
		return
	}
	t.held -= n
	p.used -= n
	ks := p.share(t.owner)
	if ks != nil {
		ks.used -= n
	}
	if t.held == 0 {
		p.holders = drop(p.holders, t)
		if ks != nil {
			ks.holders = drop(ks.holders, t)
		}
	}
	if ks != nil && len(ks.holders) == 0 {
		delete(p.keys, t.owner)
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// drop returns holders without t.
func drop(holders []*ticket, t *ticket) []*ticket {
	for i, h := range holders {
		if h == t {
			return append(holders[:i], holders[i+1:]...)
		}
	}
	return holders
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
	p.giveBack(t, t.held)
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
	t := s.admit.ticket(ownerOf(c))
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

// errKeyShare marks a body that could not be admitted before its
// deadline because the same key's other requests held its whole share of
// the API's memory (MAX_KEY_BYTES_IN_FLIGHT).
var errKeyShare = newError(http.StatusTooManyRequests, apitype.CodeRateLimited, "",
	"this key's requests in progress hold its share of the server's memory (MAX_KEY_BYTES_IN_FLIGHT); retry when one of them ends")

// readBody reads at most limit bytes of the body under the body's
// deadline (bodyClock), counting them against the pool as they arrive.
// The ticket is released when the request ends, so the bytes count for
// as long as the handler holds what it made of them. Errors: 413 beyond
// limit, 408 when the body is too slow, 503 when the pool stayed full
// until the deadline, 429 when the key's own share of it did.
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
	case errors.Is(mb.err, errKeyShareFull) && c.Request.Context().Err() == nil:
		// The key's own requests held its share until the deadline.
		c.Header("Connection", "close")
		c.Header("Retry-After", "1")
		return errKeyShare
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

// admitted releases the request's share of the pool when it ends, also
// when a handler panics: bytes kept by a panic would be lost to the pool
// for good, and the ticket would stay its key's oldest holder, taking the
// key's way past a full share with it.
func (s *Server) admitted() gin.HandlerFunc {
	return func(c *gin.Context) {
		defer func() {
			if t, ok := c.Get(ctxTicket); ok {
				t.(*ticket).release()
			}
		}()
		c.Next()
	}
}
