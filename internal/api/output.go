package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/admission"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
)

// batchOutput renders a finished batch in its judge format (JSON lines of
// results for a JSON batch), exactly as puzzlectl solve --local prints it.
//
// It is streamed like /results (results.go): a chunk's states and result
// sizes first, then its results a piece at a time, each piece's bytes
// taken from the admission pool before they are read. The judge formats
// other than JSON lines need every result at once to render; they take
// the pool for all of them, which for them is small (sweep boards) or one
// case.
func (s *Server) batchOutput(c *gin.Context) {
	wait, err := s.parseWait(c)
	if err != nil {
		fail(c, err)
		return
	}
	b, err := s.loadStreamed(c, wait)
	if err != nil {
		fail(c, err)
		return
	}
	ctx, progressed, stop := s.streamContext(c)
	defer stop()
	if !b.Done() {
		fail(c, newError(http.StatusConflict, apitype.CodeIncomplete, "", "batch is not done: %d of %d tasks have ended; GET /v1/batches/%s/results shows each task's state",
			b.Ended(), b.Total, b.ID))
		return
	}
	// Every item must have completed before the answer starts: once it
	// has, it cannot become a 409. The states come without the results.
	err = s.eachChunk(ctx, b, func(_ int, infos []store.ChunkInfo) error {
		for _, it := range infos {
			if it.State != apitype.TaskStateCompleted {
				return s.incomplete(b, it.Index, it.State)
			}
		}
		progressed()
		return nil
	})
	if err != nil {
		fail(c, streamError(c, ctx, err))
		return
	}
	t := s.admit.Ticket(ownerOf(c))
	defer t.Release()
	if b.Format != "" {
		s.renderJudge(ctx, c, t, b, progressed)
		return
	}
	c.Header("Content-Type", "text/plain; charset=utf-8")
	c.Status(http.StatusOK)
	body := progressWriter{c.Writer, progressed}
	err = s.eachChunk(ctx, b, func(j int, infos []store.ChunkInfo) error {
		for i := 0; i < len(infos); {
			// A piece is up to resultPiece bytes of results, or one.
			k, n := i+1, infos[i].ResultBytes
			for k < len(infos) && n+infos[k].ResultBytes <= resultPiece {
				n += infos[k].ResultBytes
				k++
			}
			// Reading a result takes about twice its size for a moment
			// (the reply's buffer and the string).
			if err := t.Take(ctx, 2*n); err != nil {
				return err
			}
			res, err := s.chunkResults(ctx, b, j, infos[i:k])
			if err != nil {
				return err
			}
			for _, r := range res {
				if _, err := io.WriteString(body, r); err != nil {
					return err
				}
				if _, err := io.WriteString(body, "\n"); err != nil {
					return err
				}
			}
			c.Writer.Flush()
			t.Put(2 * n)
			progressed()
			i = k
		}
		return nil
	})
	if err != nil && !c.Writer.Written() {
		// Nothing was sent (gin sends the status with the first byte):
		// an ordinary error answer still can be.
		c.Header("Content-Type", "")
		fail(c, streamError(c, ctx, err))
		return
	}
	if err != nil {
		// The answer has started: cut it, so that the client cannot take
		// a short body for the whole output.
		s.log.Warn("batch output cut off", "batch_id", b.ID, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// incomplete is the 409 of /output for item i, which did not complete; it
// points to /results, which shows every item whatever its state.
func (s *Server) incomplete(b *store.Batch, i int, st apitype.TaskState) error {
	state := apitype.CodeExpired
	if st != "" {
		state = string(st)
	}
	return newError(http.StatusConflict, apitype.CodeIncomplete, "",
		"case %d did not complete (%s); the judge output needs every case; GET /v1/batches/%s/results has every task's state and error",
		i+1, state, b.ID)
}

// eachChunk calls fn with each chunk of b's items, in order, without
// their results; it stops at fn's first error.
func (s *Server) eachChunk(ctx context.Context, b *store.Batch, fn func(j int, infos []store.ChunkInfo) error) error {
	if b.Stride <= 0 && b.Total > 0 {
		return fmt.Errorf("batch %s has no stride", b.ID)
	}
	for j := range b.Chunks() {
		infos, err := s.store.ChunkInfos(ctx, b, j)
		if err != nil {
			return err
		}
		if want := min(b.Stride, b.Total-j*b.Stride); len(infos) != want {
			return s.incomplete(b, j*b.Stride+len(infos), "")
		}
		if err := fn(j, infos); err != nil {
			return err
		}
	}
	return nil
}

// chunkResults returns the results of infos, items of chunk j that all
// completed, reading those that ChunkInfos did not bring; a result that
// is gone is the 409 of an expired case. The caller holds the pool for
// all of them, read now or with the states.
func (s *Server) chunkResults(ctx context.Context, b *store.Batch, j int, infos []store.ChunkInfo) ([]string, error) {
	out := make([]string, len(infos))
	var idx, at []int
	for i, it := range infos {
		if it.Result != "" {
			out[i] = it.Result
			continue
		}
		idx, at = append(idx, it.Index), append(at, i)
	}
	if len(idx) == 0 {
		return out, nil
	}
	res, ok, err := s.store.ChunkResults(ctx, b, j, idx)
	if err != nil {
		return nil, err
	}
	if len(res) != len(idx) || len(ok) != len(idx) {
		return nil, s.incomplete(b, idx[min(len(res), len(ok))], "")
	}
	for i := range ok {
		if !ok[i] {
			return nil, s.incomplete(b, idx[i], "")
		}
		out[at[i]] = res[i]
	}
	return out, nil
}

// renderJudge writes a judge-format batch's output, which its renderer
// needs whole; it takes the pool for all of it.
func (s *Server) renderJudge(ctx context.Context, c *gin.Context, t *admission.Ticket, b *store.Batch, progressed func()) {
	results := make([]json.RawMessage, 0, b.Total)
	err := s.eachChunk(ctx, b, func(j int, infos []store.ChunkInfo) error {
		var n int64
		for _, it := range infos {
			n += it.ResultBytes
		}
		if err := t.Take(ctx, 3*n); err != nil {
			return err
		}
		res, err := s.chunkResults(ctx, b, j, infos)
		if err != nil {
			return err
		}
		for _, r := range res {
			results = append(results, json.RawMessage(r))
		}
		progressed()
		return nil
	})
	if err != nil {
		fail(c, streamError(c, ctx, err))
		return
	}
	var buf bytes.Buffer
	if err := puzzle.WriteResults(&buf, puzzle.Format(b.Format), results); err != nil {
		fail(c, err)
		return
	}
	c.Data(http.StatusOK, "text/plain; charset=utf-8", buf.Bytes())
}
