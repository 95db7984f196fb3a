package api

// GET /v1/batches/{id}/results streams every item of a batch as one NDJSON
// line (apitype.ResultLine), in submission order, at any time: items that
// have not ended show their state. It reads the batch a chunk at a time,
// first the items' states and result sizes (and the small results, up to
// one piece a chunk: store.ChunkInfo.Result), then the other results a
// piece of at most resultPiece bytes at a time, taking each piece's bytes
// from the admission pool before it reads them. So forty clients
// downloading a batch of 12 MB hold the pool's bytes, not 480 MB.

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/klauspost/compress/gzip"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/admission"
	"github.com/puzzleq/puzzleq/internal/store"
)

// resultPiece is how many bytes of results one read takes.
const resultPiece = 256 << 10

// gzipBlock is the size of the writes the gzip writer compresses. It is
// stateless (klauspost/compress's StatelessCompression): it keeps no
// window between writes, so each write is compressed on its own and the
// lines are gathered into blocks this large first. Measured on /results
// lines (BenchmarkResultsGzip), 64 KiB blocks compress as well as
// compress/gzip at BestSpeed (5.7% against 5.5% of the size), faster, for
// 120 KiB a stream, block buffer included, instead of 1.2 MiB: forty
// gzip downloads hold 5 MiB, not 48 MiB.
const gzipBlock = 64 << 10

// gzipCost is what a gzip stream holds while it lives, taken from the
// pool like the results it compresses: the block buffer, and as much
// again for the encoder's state and the block it compresses into.
const gzipCost = 2 * gzipBlock

// resultsParams are the query parameters /results accepts; any other is a
// mistake (a misspelt "state" would silently return everything).
var resultsParams = []string{"wait", "state", "from"}

// streamedRoutes answer with a stream that a large batch makes longer
// than REQUEST_TIMEOUT: 1,000,000 result lines take longer than 10 s to
// reach most clients. The timeout middleware leaves them alone; they
// bound the wait and the work before their first byte as it would, and
// after it every step (streamContext), so a client that stops reading is
// cut within REQUEST_TIMEOUT and a slow one that keeps reading is not.
var streamedRoutes = map[string]bool{"/v1/batches/:id/results": true, "/v1/batches/:id/output": true,
	"/v1/batches/:id/events": true}

// loadStreamed reads a batch the caller may see, holding for ?wait= as
// loadBatchWaiting does, under the deadline the timeout middleware gives
// any request: RequestTimeout beyond the wait.
func (s *Server) loadStreamed(c *gin.Context, wait time.Duration) (*store.Batch, error) {
	req := c.Request
	ctx, cancel := context.WithTimeout(req.Context(), s.opts.RequestTimeout+wait)
	defer cancel()
	c.Request = req.WithContext(ctx)
	defer func() { c.Request = req }()
	return s.loadBatchWaiting(c, wait)
}

// streamContext is the context of a stream's work after its head: it
// ends when RequestTimeout passes without progress, and the
// connection's writes get the same deadline. progressed, called at every
// step (a piece read, every progressBytes written: see progressWriter),
// moves both on; stop ends them. So a client must take progressBytes per
// REQUEST_TIMEOUT (3 KiB/s by default), not the whole answer.
func (s *Server) streamContext(c *gin.Context) (ctx context.Context, progressed, stop func()) {
	ctx, cancel := context.WithCancel(c.Request.Context())
	d := s.opts.RequestTimeout
	rc := http.NewResponseController(c.Writer)
	timer := time.AfterFunc(d, cancel)
	progressed = func() {
		timer.Reset(d)
		// Not every writer has deadlines (httptest's recorder); the
		// context still bounds the reads and the pool's waits.
		_ = rc.SetWriteDeadline(time.Now().Add(d))
	}
	progressed()
	return ctx, progressed, func() {
		timer.Stop()
		cancel()
		_ = rc.SetWriteDeadline(time.Time{})
	}
}

// errStalled answers a stream that made no progress for RequestTimeout
// before its first byte: it waited that long for room in the pool, which
// other downloads filled. The client did nothing wrong and may retry.
var errStalled = newError(http.StatusServiceUnavailable, apitype.CodeUnavailable, "",
	"the server is busy sending other results; retry later")

// streamError is the answer to a stream that failed before its first
// byte: when its progress deadline passed while the client was still
// there, errKeyShare if the key's own requests held its share of the pool
// all along, else errStalled.
func streamError(c *gin.Context, ctx context.Context, err error) error {
	if ctx.Err() != nil && c.Request.Context().Err() == nil {
		if errors.Is(err, admission.ErrKeyShareFull) {
			return errKeyShare
		}
		return errStalled
	}
	return err
}

// progressBytes is how much written counts as progress.
const progressBytes = 32 << 10

// progressWriter writes to w progressBytes at a time, calling progressed
// after each, so that one large result (a 1000x1000 fill's is megabytes)
// is not one step that a slow client must take within REQUEST_TIMEOUT.
type progressWriter struct {
	w          io.Writer
	progressed func()
}

func (p progressWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k, err := p.w.Write(b[:min(len(b), progressBytes)])
		n += k
		if err != nil {
			return n, err
		}
		p.progressed()
		b = b[k:]
	}
	return n, nil
}

// errResultGone marks a result that expired between its item's state and
// its read.
var errResultGone = errors.New("a result expired while the results were written")

func (s *Server) batchResults(c *gin.Context) {
	if err := onlyParams(c, resultsParams); err != nil {
		fail(c, err)
		return
	}
	wait, err := s.parseWait(c)
	if err != nil {
		fail(c, err)
		return
	}
	var state apitype.TaskState
	if v, ok := c.GetQuery("state"); ok {
		state = apitype.TaskState(v)
		if !slices.Contains(apitype.TaskStates(), state) {
			fail(c, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "state",
				"state must be one of pending, active, completed, failed, canceled; got %q", truncate(v, 20)))
			return
		}
	}
	from := 0
	if v, ok := c.GetQuery("from"); ok {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 0 || strconv.Itoa(n) != v {
			fail(c, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "from",
				"from must be an item index (0, 1, ...); got %q", truncate(v, 20)))
			return
		}
		from = n
	}
	b, err := s.loadStreamed(c, wait)
	if err != nil {
		fail(c, err)
		return
	}
	if b.Stride <= 0 && b.Total > 0 {
		fail(c, fmt.Errorf("batch %s has no stride", b.ID))
		return
	}
	ctx, progressed, stop := s.streamContext(c)
	defer stop()
	t := s.admit.Ticket(ownerOf(c))
	defer t.Release()
	out := &lazyResponse{ctx: ctx, c: c, t: t, gzip: acceptsGzip(c.GetHeader("Accept-Encoding")),
		body: progressWriter{c.Writer, progressed}, status: s.polledStatus(c, wait, b.Done())}
	err = s.streamResults(ctx, b, state, from, t, out, progressed)
	if err == nil {
		err = out.close()
	}
	if err != nil {
		if !out.started {
			if errors.Is(err, errResultGone) {
				// Nothing was sent: the batch expired under the
				// request, as if it had a moment earlier.
				err = store.ErrNotFound
			}
			fail(c, streamError(c, ctx, err))
			return
		}
		// The answer has started: cut it, so that the client cannot
		// take a short body for the whole batch.
		s.log.Warn("batch results cut off", "batch_id", b.ID, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// onlyParams answers 400, naming the parameter, for a query parameter
// not in allowed.
func onlyParams(c *gin.Context, allowed []string) error {
	for k, vs := range c.Request.URL.Query() {
		if !slices.Contains(allowed, k) {
			return newError(http.StatusBadRequest, apitype.CodeInvalidRequest, truncate(k, 40),
				"unknown query parameter %q; this route takes %s", truncate(k, 40), strings.Join(allowed, ", "))
		}
		if len(vs) > 1 {
			// The handlers read the first value only: ?limit=1&limit=5
			// or ?state=failed&state=completed would silently mean less
			// than was asked.
			return newError(http.StatusBadRequest, apitype.CodeInvalidRequest, truncate(k, 40),
				"query parameter %q is given %d times; give it once", truncate(k, 40), len(vs))
		}
	}
	return nil
}

// streamResults writes b's items from index from on, those in state only
// when it is set, as NDJSON lines to w, chunk by chunk and, within a
// chunk, a piece of results at a time. A client that has the lines up to
// some index asks from there (from), so reading a large batch's results
// while it runs costs each line once, not once per poll.
func (s *Server) streamResults(ctx context.Context, b *store.Batch, state apitype.TaskState, from int, t *admission.Ticket, w *lazyResponse, progressed func()) error {
	var line []byte
	first := 0
	if b.Stride > 0 {
		first = from / b.Stride
	}
	for j := first; j < b.Chunks(); j++ {
		infos, err := s.store.ChunkInfos(ctx, b, j)
		if err != nil {
			return err
		}
		if want := min(b.Stride, b.Total-j*b.Stride); len(infos) != want {
			// The chunk's keys are gone: the batch expired under us.
			return fmt.Errorf("chunk %d: %w", j, errResultGone)
		}
		if skip := min(from-j*b.Stride, len(infos)); skip > 0 {
			infos = infos[skip:]
		}
		for i := 0; i < len(infos); {
			// A piece is the items up to resultPiece bytes of results,
			// or up to one result past it.
			// Results that ChunkInfos brought (small ones) count in
			// the piece's bytes like those it reads.
			k, n, m, idx := i, int64(0), 0, []int(nil)
			for ; k < len(infos); k++ {
				in := &infos[k]
				if state != "" && in.State != state || in.State != apitype.TaskStateCompleted {
					continue
				}
				if m > 0 && n+in.ResultBytes > resultPiece {
					break
				}
				n, m = n+in.ResultBytes, m+1
				if in.Result == "" {
					idx = append(idx, in.Index)
				}
			}
			// Reading a result takes about twice its size for a moment
			// (the reply's buffer and the string). For the results read
			// with the states, at most one piece of them a chunk, the
			// pool is taken after they came.
			if err := t.Take(ctx, 2*n); err != nil {
				return err
			}
			var res []string
			if len(idx) > 0 {
				var ok []bool
				res, ok, err = s.store.ChunkResults(ctx, b, j, idx)
				if err != nil {
					return err
				}
				if len(res) != len(idx) {
					return fmt.Errorf("chunk %d: %d results for %d items: %w", j, len(res), len(idx), errResultGone)
				}
				for r := range ok {
					if !ok[r] {
						return fmt.Errorf("item %d: %w", idx[r], errResultGone)
					}
				}
			}
			for ; i < k; i++ {
				in := &infos[i]
				if state != "" && in.State != state {
					continue
				}
				var result string
				switch {
				case in.State != apitype.TaskStateCompleted:
				case in.Result != "":
					result = in.Result
				default:
					result, res = res[0], res[1:]
				}
				if line, err = appendResultLine(line[:0], b.ID, in, result); err != nil {
					return err
				}
				if err := w.write(line); err != nil {
					return err
				}
			}
			if err := w.flush(); err != nil {
				return err
			}
			t.Put(2 * n)
			progressed()
		}
		if len(infos) == 0 {
			progressed()
		}
	}
	return nil
}

// appendResultLine appends item in's line, with result (a completed
// item's JSON) written as it is: encoding it again through
// json.RawMessage would copy and re-scan every result.
func appendResultLine(dst []byte, batchID string, in *store.ChunkInfo, result string) ([]byte, error) {
	if in.Error == nil && plainJSONString(batchID) && plainJSONString(string(in.State)) {
		// The line encoding/json would write, without its reflection (a
		// tenth of the API's CPU per 8-puzzle read): every string here
		// but the custom ID needs no escaping, and the custom ID is
		// encoded by encoding/json itself. TestAppendResultLineAsJSON
		// holds the two to the same bytes.
		dst = strconv.AppendInt(append(dst, `{"index":`...), int64(in.Index), 10)
		dst = append(append(append(dst, `,"id":"`...), batchID...), '-')
		dst = append(strconv.AppendInt(dst, int64(in.Index), 10), `","custom_id":`...)
		if in.CustomID == nil {
			dst = append(dst, "null"...)
		} else {
			id, err := json.Marshal(*in.CustomID)
			if err != nil {
				return dst, fmt.Errorf("encode result line: %w", err)
			}
			dst = append(dst, id...)
		}
		dst = append(append(append(dst, `,"state":"`...), in.State...), '"')
		if in.State == apitype.TaskStateCompleted {
			dst = append(append(dst, `,"result":`...), result...)
		}
		return append(dst, "}\n"...), nil
	}
	return appendResultLineJSON(dst, batchID, in, result)
}

// appendResultLineJSON is appendResultLine by encoding/json, for every
// line: an error member, and strings that need escaping.
func appendResultLineJSON(dst []byte, batchID string, in *store.ChunkInfo, result string) ([]byte, error) {
	head, err := json.Marshal(apitype.ResultLine{Index: in.Index, ID: apitype.ItemID(batchID, in.Index),
		CustomID: in.CustomID, State: in.State, Error: in.Error})
	if err != nil {
		return dst, fmt.Errorf("encode result line: %w", err)
	}
	if in.State != apitype.TaskStateCompleted {
		return append(append(dst, head...), '\n'), nil
	}
	// head ends in '}': the result goes last, after "state".
	dst = append(dst, head[:len(head)-1]...)
	dst = append(dst, `,"result":`...)
	dst = append(dst, result...)
	return append(dst, "}\n"...), nil
}

// plainJSONString reports whether encoding/json writes s as itself
// between quotes: ASCII letters, digits, '-' and '_' only.
func plainJSONString(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// lazyResponse is the response of /results, begun at its first write so
// that a failure before any line (Redis down, the batch gone) is still an
// ordinary error answer, and gzipped when the client accepts it.
type lazyResponse struct {
	ctx     context.Context
	c       *gin.Context
	body    io.Writer // c.Writer, with progress
	t       *admission.Ticket
	gzip    bool
	status  int // 200, or 202 for a long poll cut short (polledStatus)
	started bool
	w       io.Writer
	buf     *bufio.Writer // the gzip blocks
	gz      *gzip.Writer
}

func (r *lazyResponse) begin() error {
	if r.started {
		return nil
	}
	h := r.c.Writer.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Add("Vary", "Accept-Encoding")
	r.w = r.body
	if r.gzip {
		if err := r.t.Take(r.ctx, gzipCost); err != nil {
			return err
		}
		h.Set("Content-Encoding", "gzip")
		gz, err := gzip.NewWriterLevel(r.body, gzip.StatelessCompression)
		if err != nil {
			return err
		}
		r.gz, r.buf = gz, bufio.NewWriterSize(gz, gzipBlock)
		r.w = r.buf
	}
	r.started = true
	r.c.Status(cmp.Or(r.status, http.StatusOK))
	return nil
}

func (r *lazyResponse) write(p []byte) error {
	if err := r.begin(); err != nil {
		return err
	}
	_, err := r.w.Write(p)
	return err
}

// flush sends what is buffered, so the client sees each piece as it is
// read, and the gzip writer holds no more than its window.
func (r *lazyResponse) flush() error {
	if !r.started {
		return nil
	}
	if r.gz != nil {
		if err := r.buf.Flush(); err != nil {
			return err
		}
		if err := r.gz.Flush(); err != nil {
			return err
		}
	}
	r.c.Writer.Flush()
	return nil
}

// close ends the answer; an empty one (no line matched) is still 200.
func (r *lazyResponse) close() error {
	if err := r.begin(); err != nil {
		return err
	}
	if r.gz != nil {
		if err := r.buf.Flush(); err != nil {
			return err
		}
		if err := r.gz.Close(); err != nil {
			return err
		}
	}
	r.c.Writer.Flush()
	return nil
}

// acceptsGzip reports whether an Accept-Encoding header allows gzip: it
// is listed, or "*" is, without q=0.
func acceptsGzip(h string) bool {
	gz, star := -1.0, -1.0
	for _, part := range strings.Split(h, ",") {
		name, params, _ := strings.Cut(part, ";")
		q := 1.0
		for _, p := range strings.Split(params, ";") {
			k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
			if ok && strings.EqualFold(k, "q") {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					f = 0
				}
				q = f
			}
		}
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "gzip", "x-gzip":
			gz = q
		case "*":
			star = q
		}
	}
	if gz >= 0 {
		return gz > 0
	}
	return star > 0
}
