package api

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"os"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/admission"
	"github.com/puzzleq/puzzleq/internal/ingest"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
)

// The HTTP side of a batch body: its form from the request, its reading
// under the body's deadline and the pool (meteredBody), and the answers
// to its failures. internal/ingest decodes and stages the items.

// contentNDJSON is the media type of a batch of one item per line.
const contentNDJSON = "application/x-ndjson"

// ingest reads the request's batch body in the form its Content-Type and
// ?format= name and stages every item in w. On an error nothing it staged
// is left behind: the caller must Discard w (ingest does not, so that one
// path discards whatever failed).
func (s *Server) ingest(c *gin.Context, w ingest.Stager, withHash bool) (*ingest.Result, error) {
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
	ctx := c.Request.Context()
	if f != puzzle.FormatJSON {
		body, err := s.readBody(c, min(s.opts.MaxBatchBodyBytes, ingest.MaxJudgeBody))
		if err != nil {
			return nil, err
		}
		var t *admission.Ticket
		if v, ok := c.Get(ctxTicket); ok {
			t = v.(*admission.Ticket)
		}
		return s.batches.Judge(ctx, f, body, t, w, withHash)
	}
	body, done, err := s.openBody(c, s.opts.MaxBatchBodyBytes)
	if err != nil {
		return nil, err
	}
	defer done()
	// The reader marks its failures as the body's (bodyReader), with an
	// Idempotency-Key too: ingest hashes what it reads, failures included.
	in, err := s.batches.Stream(ctx, bodyReader{body}, streamBody{body, c}, w, ndjson, withHash)
	if err != nil {
		return nil, s.streamError(c, body, err)
	}
	return in, nil
}

// streamBody is a metered body as ingest takes from it.
type streamBody struct {
	mb *meteredBody
	c  *gin.Context
}

func (b streamBody) Ticket() *admission.Ticket { return b.mb.t }
func (b streamBody) Take(n int64) error        { return b.mb.take(n) }
func (b streamBody) Failed(err error)          { b.mb.err = err }

// CutOff closes the connection with this answer: a read that fails on it
// cancels net/http's context for the whole connection.
func (b streamBody) CutOff() {
	b.c.Header("Connection", "close")
	b.mb.cutOff()
}

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
