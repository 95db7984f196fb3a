package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/admission"
	"github.com/puzzleq/puzzleq/internal/store"
)

// readChunk is the most a body read takes from the connection at once, so
// that weight follows the bytes closely.
const readChunk = 32 << 10

// meteredBody reads a request body under a read deadline that moves with
// the bytes (bodyClock), taking the bytes it returns from the request's
// ticket. Make it with meterBody and call done once the body is read.
type meteredBody struct {
	ctx   context.Context // the request's
	r     io.Reader
	t     *admission.Ticket
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
	t := s.admit.Ticket(ownerOf(c))
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
	if err == io.EOF && b.rc != nil && !b.cut.Load() {
		// The body is whole, and the read that ended it started the
		// server's background read of the connection: with the body's
		// deadline left on it, that read would fail at the deadline and
		// cancel the request while the handler still waits for room
		// (below, or for the items it decodes), and a client still
		// there would be answered as if it had gone.
		_ = b.rc.SetReadDeadline(time.Time{})
		if b.cut.Load() { // cutOff ran between the check and the clear
			_ = b.rc.SetReadDeadline(time.Now())
		}
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

// maxAdmissionWait bounds how long a request body waits for room in the
// pool at any one take (each read, and the room ingest settles for its
// buffers): a body that cannot get room is refused within it, 503 with
// Retry-After (429 when its own key's requests hold its share), while its
// client waits, never at its body's deadline. The pool's fair shares
// (internal/admission) keep room free for a key that arrives, so a
// request of a key under its share seldom waits at all. The memory a
// large item's decoding takes is not a body's read: it waits for room as
// for a decode slot, until the request's context ends.
const maxAdmissionWait = time.Second

// take adds n bytes to the body's ticket, waiting for the pool at most
// maxAdmissionWait, and never past the body's deadline.
func (b *meteredBody) take(n int64) error {
	deadline := time.Now().Add(maxAdmissionWait)
	if dl := time.Unix(0, b.dl.Load()); dl.Before(deadline) {
		deadline = dl
	}
	return b.t.TakeUntil(b.ctx, deadline, n)
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

// errAdmission marks a body that could not be admitted within
// maxAdmissionWait because others filled the API's memory.
var errAdmission = newError(http.StatusServiceUnavailable, apitype.CodeUnavailable, "",
	"the server is busy reading other requests; retry later")

// errKeyShare marks a body that could not be admitted within
// maxAdmissionWait because the same key's other requests held its whole
// share of the API's memory (at most MAX_KEY_BYTES_IN_FLIGHT, less while
// other keys use it too).
var errKeyShare = newError(http.StatusTooManyRequests, apitype.CodeRateLimited, "",
	"this key's requests in progress hold its share of the server's memory, smaller while other keys use it (MAX_KEY_BYTES_IN_FLIGHT); retry when one of them ends")

// readBody reads at most limit bytes of the body under the body's
// deadline (bodyClock), counting them against the pool as they arrive.
// The ticket is released when the request ends, so the bytes count for
// as long as the handler holds what it made of them. Errors: 413 beyond
// limit, 408 when the body is too slow, 503 when the pool stayed full
// for maxAdmissionWait, 429 when the key's own share of it did.
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
	// A context cancelled after the handler cut the body off (cutOff) was
	// cancelled by that cut, as net/http's read of the connection failed
	// on it, not by a client that went away: its client still waits for
	// the answer.
	gone := c.Request.Context().Err() != nil && !mb.cut.Load()
	switch {
	case errors.As(err, &maxErr):
		return err
	case errors.Is(mb.err, admission.ErrKeyShareFull) && !gone:
		// The key's own requests held its share until the deadline.
		c.Header("Connection", "close")
		c.Header("Retry-After", "1")
		return errKeyShare
	case mb.err != nil && !gone:
		// The pool stayed full: the client did nothing wrong.
		c.Header("Connection", "close")
		c.Header("Retry-After", "1")
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
				t.(*admission.Ticket).Release()
			}
		}()
		c.Next()
	}
}
