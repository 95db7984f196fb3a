package api

// GET /v1/batches/{id}/results streams every item of a batch as one NDJSON
// line (apitype.ResultLine), in submission order, at any time: items that
// have not ended show their state. It reads the batch a chunk at a time,
// first the items' states and result sizes, then the results a piece of
// at most resultPiece bytes at a time, taking each piece's bytes from the
// admission pool before it reads them. So forty clients downloading a
// batch of 12 MB hold the pool's bytes, not 480 MB.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/klauspost/compress/gzip"

	"github.com/puzzleq/puzzleq/apitype"
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
var resultsParams = []string{"wait", "state"}

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
	b, err := s.loadBatchWaiting(c, wait)
	if err != nil {
		fail(c, err)
		return
	}
	if b.Stride <= 0 && b.Total > 0 {
		fail(c, fmt.Errorf("batch %s has no stride", b.ID))
		return
	}
	t := s.admit.ticket()
	defer t.release()
	out := &lazyResponse{c: c, t: t, gzip: acceptsGzip(c.GetHeader("Accept-Encoding"))}
	err = s.streamResults(c.Request.Context(), b, state, t, out)
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
			fail(c, err)
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
	for k := range c.Request.URL.Query() {
		if !slices.Contains(allowed, k) {
			return newError(http.StatusBadRequest, apitype.CodeInvalidRequest, truncate(k, 40),
				"unknown query parameter %q; this route takes %s", truncate(k, 40), strings.Join(allowed, ", "))
		}
	}
	return nil
}

// streamResults writes b's items, those in state only when it is set, as
// NDJSON lines to w, chunk by chunk and, within a chunk, a piece of
// results at a time.
func (s *Server) streamResults(ctx context.Context, b *store.Batch, state apitype.TaskState, t *ticket, w *lazyResponse) error {
	var line []byte
	for j := range b.Chunks() {
		infos, err := s.store.ChunkInfos(ctx, b, j)
		if err != nil {
			return err
		}
		if want := min(b.Stride, b.Total-j*b.Stride); len(infos) != want {
			// The chunk's keys are gone: the batch expired under us.
			return fmt.Errorf("chunk %d: %w", j, errResultGone)
		}
		for i := 0; i < len(infos); {
			// A piece is the items up to resultPiece bytes of results,
			// or up to one result past it.
			k, n, idx := i, int64(0), []int(nil)
			for ; k < len(infos); k++ {
				in := &infos[k]
				if state != "" && in.State != state || in.State != apitype.TaskStateCompleted {
					continue
				}
				if len(idx) > 0 && n+in.ResultBytes > resultPiece {
					break
				}
				n += in.ResultBytes
				idx = append(idx, in.Index)
			}
			// Reading a result takes about twice its size for a moment
			// (the reply's buffer and the string).
			if err := t.take(ctx, 2*n); err != nil {
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
				if in.State == apitype.TaskStateCompleted {
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
			t.put(2 * n)
		}
	}
	return nil
}

// appendResultLine appends item in's line, with result (a completed
// item's JSON) written as it is: encoding it again through
// json.RawMessage would copy and re-scan every result.
func appendResultLine(dst []byte, batchID string, in *store.ChunkInfo, result string) ([]byte, error) {
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

// lazyResponse is the response of /results, begun at its first write so
// that a failure before any line (Redis down, the batch gone) is still an
// ordinary error answer, and gzipped when the client accepts it.
type lazyResponse struct {
	c       *gin.Context
	t       *ticket
	gzip    bool
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
	r.w = r.c.Writer
	if r.gzip {
		if err := r.t.take(r.c.Request.Context(), gzipCost); err != nil {
			return err
		}
		h.Set("Content-Encoding", "gzip")
		gz, err := gzip.NewWriterLevel(r.c.Writer, gzip.StatelessCompression)
		if err != nil {
			return err
		}
		r.gz, r.buf = gz, bufio.NewWriterSize(gz, gzipBlock)
		r.w = r.buf
	}
	r.started = true
	r.c.Status(http.StatusOK)
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
