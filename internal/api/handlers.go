package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers/fill"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/solvers/sweep"
	"github.com/puzzleq/puzzleq/tasks"
)

// TaskResource is the JSON form of a task.
type TaskResource struct {
	ID          string          `json:"id"`
	Kind        string          `json:"kind"`
	State       string          `json:"state"`
	Result      json.RawMessage `json:"result"`
	Error       *Error          `json:"error"`
	Cached      bool            `json:"cached"`
	BatchID     *string         `json:"batch_id"`
	CreatedAt   *time.Time      `json:"created_at"`
	StartedAt   *time.Time      `json:"started_at"`
	CompletedAt *time.Time      `json:"completed_at"`
	Attempts    int             `json:"attempts"`
	// Progress is what a long search last reported ({"bound", "nodes"});
	// null for everything but sliding boards solved by search.
	Progress json.RawMessage `json:"progress"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func resource(t *store.Task) TaskResource {
	r := TaskResource{
		ID: t.ID, Kind: t.Kind, State: string(t.State), Result: t.Result, Cached: t.Cached,
		CreatedAt: timePtr(t.CreatedAt), StartedAt: timePtr(t.StartedAt), CompletedAt: timePtr(t.CompletedAt),
		Attempts: t.Attempts, Progress: t.Progress,
	}
	if t.BatchID != "" {
		b := t.BatchID
		r.BatchID = &b
	}
	if t.ErrCode != "" {
		r.Error = &Error{Code: t.ErrCode, Message: t.ErrMsg}
	}
	return r
}

// timeout bounds a request. Long polls extend it by their wait.
func (s *Server) timeout() gin.HandlerFunc {
	return func(c *gin.Context) {
		d := s.opts.RequestTimeout
		if w, err := s.parseWait(c); err == nil {
			d += w
		}
		ctx, cancel := context.WithTimeout(c.Request.Context(), d)
		defer cancel()
		c.Request = c.Request.WithContext(ctx)
		c.Next()
	}
}

// readBody reads at most limit bytes, failing with 413 beyond that.
func readBody(c *gin.Context, limit int64) ([]byte, error) {
	if c.Request.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	b, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, limit))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, err
		}
		return nil, newError(http.StatusBadRequest, "invalid_request", "", "could not read the request body")
	}
	return b, nil
}

func (s *Server) createTask(c *gin.Context) {
	wait, err := s.parseWait(c)
	if err != nil {
		fail(c, err)
		return
	}
	body, err := readBody(c, s.opts.MaxBodyBytes)
	if err != nil {
		fail(c, err)
		return
	}
	p, err := puzzle.Decode(body)
	if err != nil {
		fail(c, err)
		return
	}
	ctx := c.Request.Context()
	owner := ownerOf(c)
	id := newID()
	// One round trip answers from the cache, or admits the task against
	// the owner's quota and records it.
	hit, created, err := s.store.SubmitTask(ctx, store.NewTask{ID: id, Kind: string(p.Kind()), Owner: owner, CacheKey: p.Key()}, s.quotaFor(c))
	if errors.Is(err, store.ErrQuota) {
		err = s.quotaError(c)
	}
	if err != nil {
		fail(c, err)
		return
	}
	s.metrics.submitted.WithLabelValues(string(p.Kind())).Inc()
	tr := TaskResource{ID: id, Kind: string(p.Kind()), State: string(store.StatePending), CreatedAt: &created}
	if hit != nil {
		s.metrics.cacheHits.Inc()
		tr.State, tr.Result, tr.Cached, tr.CompletedAt = string(store.StateCompleted), hit, true, &created
		c.JSON(http.StatusOK, tr)
		return
	}
	t, err := tasks.NewSolveTask(id, "", owner, p, tasks.QueueInteractive, s.opts.Limits)
	if err == nil {
		_, err = s.enq.EnqueueContext(ctx, t)
	}
	if err != nil {
		// Not acknowledged, so not accepted: undo the record and the quota
		// and let the client retry.
		_ = s.store.DeleteTasks(context.WithoutCancel(ctx), "", []string{id})
		_ = s.store.ReleasePending(context.WithoutCancel(ctx), owner, 1)
		fail(c, fmt.Errorf("enqueue: %w", err))
		return
	}
	c.Header("Location", "/v1/tasks/"+id)
	if wait > 0 {
		// Submit and wait in one request: 200 with the ended task, or 202
		// with its state when the wait runs out first.
		rec, err := s.waitTask(ctx, id, wait)
		if err != nil {
			fail(c, err)
			return
		}
		status := http.StatusAccepted
		if rec.State.Terminal() {
			status = http.StatusOK
		}
		c.JSON(status, resource(rec))
		return
	}
	c.JSON(http.StatusAccepted, tr)
}

func (s *Server) respondTask(c *gin.Context, status int, id string) {
	t, err := s.store.Get(c.Request.Context(), id)
	if err != nil {
		fail(c, err)
		return
	}
	c.JSON(status, resource(t))
}

// ownerOf returns the API key name of the caller; "" while auth is off.
func ownerOf(c *gin.Context) string { return c.GetString(ctxOwner) }

const ctxOwner = "puzzleq.owner"

// loadTask reads a task the caller may see.
func (s *Server) loadTask(c *gin.Context) (*store.Task, error) {
	return loadOwned(c, s.store.Get, func(t *store.Task) string { return t.Owner })
}

// loadOwned reads the record named by the path's id for the caller. A
// malformed ID never reaches Redis, and another owner's record is "not
// found", never "forbidden", so IDs reveal nothing.
func loadOwned[T any](c *gin.Context, get func(context.Context, string) (T, error), owner func(T) string) (T, error) {
	var zero T
	id := c.Param("id")
	if !validID(id) {
		return zero, store.ErrNotFound
	}
	v, err := get(c.Request.Context(), id)
	if err != nil {
		return zero, err
	}
	if owner(v) != ownerOf(c) {
		return zero, store.ErrNotFound
	}
	return v, nil
}

func (s *Server) getTask(c *gin.Context) {
	wait, err := s.parseWait(c)
	if err != nil {
		fail(c, err)
		return
	}
	t, err := s.loadTask(c)
	if err != nil {
		fail(c, err)
		return
	}
	if wait > 0 && !t.State.Terminal() {
		t, err = s.waitTask(c.Request.Context(), t.ID, wait)
		if err != nil {
			fail(c, err)
			return
		}
	}
	c.JSON(http.StatusOK, resource(t))
}

// recheckEvery bounds how long a long poll trusts pub/sub alone. Events
// sent while the subscription was reconnecting are lost; a rare re-read
// makes such a loss cost seconds, not the whole wait.
const recheckEvery = 5 * time.Second

// waitTask holds until the task ends, the wait runs out or the client
// leaves, and returns the latest record.
func (s *Server) waitTask(ctx context.Context, id string, wait time.Duration) (*store.Task, error) {
	return waitFor(ctx, s.waiter, store.TaskEventKey(id), wait,
		func() (*store.Task, error) { return s.store.Get(ctx, id) },
		func(t *store.Task) bool { return t.State.Terminal() })
}

// waitFor is the long-poll loop shared by tasks and batches: subscribe
// first, then read, so an event between the two cannot be missed.
func waitFor[T any](ctx context.Context, w Waiter, key string, wait time.Duration, read func() (T, error), done func(T) bool) (T, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		fired, release := w.Wait(key)
		v, err := read()
		if err != nil || done(v) {
			release()
			return v, err
		}
		recheck := time.NewTimer(recheckEvery)
		select {
		case <-fired:
		case <-recheck.C:
		case <-deadline.C:
			release()
			recheck.Stop()
			return read()
		case <-ctx.Done():
			release()
			recheck.Stop()
			return v, nil
		}
		release()
		recheck.Stop()
	}
}

func (s *Server) cancelTask(c *gin.Context) {
	t, err := s.loadTask(c)
	if err != nil {
		fail(c, err)
		return
	}
	if t.State.Terminal() {
		fail(c, newError(http.StatusConflict, CodeConflict, "", "task has already ended (%s)", t.State))
		return
	}
	prev, err := s.store.Cancel(c.Request.Context(), t.ID, t.BatchID, t.Owner)
	if err != nil {
		fail(c, err)
		return
	}
	if prev.Terminal() {
		fail(c, newError(http.StatusConflict, CodeConflict, "", "task has already ended (%s)", prev))
		return
	}
	s.respondTask(c, http.StatusOK, t.ID)
}

// batchRequest is the JSON body of POST /v1/batches.
type batchRequest struct {
	Tasks []json.RawMessage `json:"tasks"`
}

// Judge formats accepted by POST /v1/batches?format=.
const (
	FormatBOJ1525 = "boj1525"
	FormatBOJ9944 = "boj9944"
	FormatP84021  = "p84021"
)

func (s *Server) createBatch(c *gin.Context) {
	// Bound how many large bodies are decoded at once.
	select {
	case s.batchSem <- struct{}{}:
		defer func() { <-s.batchSem }()
	case <-c.Request.Context().Done():
		fail(c, c.Request.Context().Err())
		return
	}
	body, err := readBody(c, s.opts.MaxBatchBodyBytes)
	if err != nil {
		fail(c, err)
		return
	}
	format := c.Query("format")
	var reqs []*puzzle.Parsed
	if format == "" || format == "json" {
		format = ""
		reqs, err = s.decodeJSONBatch(body)
	} else {
		reqs, err = decodeJudgeBatch(format, body)
	}
	if err != nil {
		fail(c, err)
		return
	}
	if len(reqs) == 0 {
		fail(c, newError(http.StatusBadRequest, "invalid_request", "tasks", "a batch needs at least one task"))
		return
	}
	if len(reqs) > s.opts.MaxBatchItems {
		fail(c, newError(http.StatusBadRequest, "too_large", "tasks", "a batch holds at most %d tasks, got %d", s.opts.MaxBatchItems, len(reqs)))
		return
	}
	batchID := newID()
	if key := c.GetHeader("Idempotency-Key"); key != "" {
		if len(key) > 200 || strings.ContainsAny(key, " \t\r\n") {
			fail(c, newError(http.StatusBadRequest, "invalid_request", "Idempotency-Key", "Idempotency-Key must be at most 200 characters without spaces"))
			return
		}
		sum := sha256.Sum256(append([]byte(format+"\n"), body...))
		hash := hex.EncodeToString(sum[:])
		claimed, prevID, prevHash, err := s.store.ClaimIdempotency(c.Request.Context(), ownerOf(c), key, batchID, hash)
		if err != nil {
			fail(c, err)
			return
		}
		if !claimed {
			if prevHash != hash {
				fail(c, newError(http.StatusUnprocessableEntity, "idempotency_key_reused", "Idempotency-Key",
					"this Idempotency-Key was used for a different request body"))
				return
			}
			s.replayBatch(c, prevID)
			return
		}
		defer func() {
			if c.Writer.Status() != http.StatusAccepted {
				_ = s.store.ReleaseIdempotency(context.WithoutCancel(c.Request.Context()), ownerOf(c), key)
			}
		}()
	}
	ids, err := s.submitBatch(c, batchID, format, reqs)
	if err != nil {
		fail(c, err)
		return
	}
	c.Header("Location", "/v1/batches/"+batchID)
	c.JSON(http.StatusAccepted, gin.H{"id": batchID, "total": len(ids), "task_ids": ids})
}

// replayBatch answers a retried submission with the batch the first one
// created, so a client that lost the response does not double the work.
// The first request may still be writing it; wait a little for it.
func (s *Server) replayBatch(c *gin.Context, id string) {
	ctx := c.Request.Context()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := s.store.GetBatch(ctx, id)
		if err == nil && b.Owner == ownerOf(c) {
			ids, err := s.store.BatchItems(ctx, id, 0, b.Total)
			if err != nil {
				fail(c, err)
				return
			}
			c.Header("Location", "/v1/batches/"+id)
			c.Header("Idempotent-Replayed", "true")
			c.JSON(http.StatusAccepted, gin.H{"id": id, "total": b.Total, "task_ids": ids})
			return
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			fail(c, err)
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.Header("Retry-After", "1")
			fail(c, newError(http.StatusConflict, "in_progress", "Idempotency-Key",
				"a request with this Idempotency-Key is still being processed; retry shortly"))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) decodeJSONBatch(body []byte) ([]*puzzle.Parsed, error) {
	var br batchRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&br); err != nil {
		return nil, puzzle.DecodeError(err)
	}
	if dec.More() {
		return nil, newError(http.StatusBadRequest, "invalid_request", "", "unexpected data after the JSON value")
	}
	if err := puzzle.CheckDuplicateKeys(body); err != nil {
		return nil, err
	}
	if br.Tasks == nil {
		return nil, newError(http.StatusBadRequest, "invalid_request", "tasks", "tasks is required")
	}
	if len(br.Tasks) > s.opts.MaxBatchItems {
		return nil, newError(http.StatusBadRequest, "too_large", "tasks", "a batch holds at most %d tasks, got %d", s.opts.MaxBatchItems, len(br.Tasks))
	}
	reqs := make([]*puzzle.Parsed, len(br.Tasks))
	for i, raw := range br.Tasks {
		// The whole body was scanned for duplicate keys above.
		p, err := puzzle.DecodePayload(raw)
		if err != nil {
			return nil, puzzle.PrefixField(err, "tasks["+strconv.Itoa(i)+"]")
		}
		reqs[i] = p
	}
	return reqs, nil
}

func decodeJudgeBatch(format string, body []byte) ([]*puzzle.Parsed, error) {
	r := bytes.NewReader(body)
	var (
		p   *puzzle.Parsed
		err error
	)
	switch format {
	case FormatBOJ1525:
		var pz sliding.Puzzle
		if pz, err = sliding.ParseBOJ1525(r); err == nil {
			p, err = puzzle.FromSliding(pz, sliding.Options{})
		}
	case FormatP84021:
		var pz fill.Puzzle
		if pz, err = fill.ParseP84021(r); err == nil {
			p, err = puzzle.FromFill(pz, fill.Options{})
		}
	case FormatBOJ9944:
		pzs, err := sweep.ParseBOJ9944(r)
		if err != nil {
			return nil, puzzle.PrefixField(err, "body")
		}
		out := make([]*puzzle.Parsed, len(pzs))
		for i, pz := range pzs {
			if out[i], err = puzzle.FromSweep(pz, sweep.Options{}); err != nil {
				return nil, puzzle.PrefixField(err, fmt.Sprintf("body.case[%d]", i+1))
			}
		}
		return out, nil
	default:
		return nil, newError(http.StatusBadRequest, "invalid_request", "format",
			"unknown format %q: expected boj1525, boj9944, p84021 or json", truncate(format, 20))
	}
	if err != nil {
		return nil, puzzle.PrefixField(err, "body")
	}
	return []*puzzle.Parsed{p}, nil
}

// submitBatch records a batch and enqueues it: cheap items grouped into
// chunk tasks, expensive ones one task each, all on the bulk queue.
func (s *Server) submitBatch(c *gin.Context, batchID, format string, reqs []*puzzle.Parsed) ([]string, error) {
	ctx, owner := c.Request.Context(), ownerOf(c)
	keys := make([]string, len(reqs))
	for i, p := range reqs {
		keys[i] = p.Key()
	}
	hits, err := s.store.CachedResults(ctx, keys)
	if err != nil {
		return nil, err
	}
	misses := 0
	for _, h := range hits {
		if h == nil {
			misses++
		}
	}
	if err := s.reserve(c, misses); err != nil {
		return nil, err
	}
	ids, err := s.recordAndEnqueue(ctx, batchID, owner, format, reqs, keys, hits)
	if err != nil {
		_ = s.store.ReleasePending(context.WithoutCancel(ctx), owner, misses)
		return nil, err
	}
	return ids, nil
}

func (s *Server) recordAndEnqueue(ctx context.Context, batchID, owner, format string, reqs []*puzzle.Parsed, keys []string, hits []json.RawMessage) ([]string, error) {
	ids := make([]string, len(reqs))
	items := make([]store.NewTask, len(reqs))
	for i, p := range reqs {
		ids[i] = newID()
		items[i] = store.NewTask{ID: ids[i], Kind: string(p.Kind()), Owner: owner, CacheKey: keys[i], Result: hits[i]}
		if hits[i] != nil {
			s.metrics.cacheHits.Inc()
		}
		s.metrics.submitted.WithLabelValues(string(p.Kind())).Inc()
	}
	if err := s.store.CreateBatch(ctx, store.NewBatch{ID: batchID, Owner: owner, Format: format}, items); err != nil {
		// The transaction may have been applied and only its reply lost;
		// nothing was enqueued, so such records would stay pending for a
		// day. Deleting records that were never written is harmless.
		_ = s.store.DeleteTasks(context.WithoutCancel(ctx), batchID, ids)
		return nil, err
	}

	var queued []*asynq.Task
	var chunkIDs []string
	var chunkReqs []*puzzle.Parsed
	flushChunk := func() error {
		if len(chunkIDs) == 0 {
			return nil
		}
		t, err := tasks.NewChunkTask(batchID, owner, chunkIDs, chunkReqs, tasks.QueueBulk, s.opts.Limits)
		if err != nil {
			return err
		}
		queued = append(queued, t)
		chunkIDs, chunkReqs = nil, nil
		return nil
	}
	for i, p := range reqs {
		if hits[i] != nil {
			continue
		}
		if !tasks.Cheap(p) {
			t, err := tasks.NewSolveTask(ids[i], batchID, owner, p, tasks.QueueBulk, s.opts.Limits)
			if err != nil {
				return nil, err
			}
			queued = append(queued, t)
			continue
		}
		chunkIDs = append(chunkIDs, ids[i])
		chunkReqs = append(chunkReqs, p)
		if len(chunkIDs) == s.opts.ChunkSize {
			if err := flushChunk(); err != nil {
				return nil, err
			}
		}
	}
	if err := flushChunk(); err != nil {
		return nil, err
	}
	if err := s.enqueueAll(ctx, queued); err != nil {
		// Some tasks may be queued already; with their records gone they
		// are skipped when they run. The client was not told the batch
		// exists, so it will retry.
		_ = s.store.DeleteTasks(context.WithoutCancel(ctx), batchID, ids)
		return nil, fmt.Errorf("enqueue batch: %w", err)
	}
	return ids, nil
}

// enqueueAll enqueues with bounded parallelism; asynq v0.26 has no bulk
// enqueue, and one round trip per task in series is too slow for 10,000.
func (s *Server) enqueueAll(ctx context.Context, ts []*asynq.Task) error {
	if len(ts) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan *asynq.Task)
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range min(s.opts.EnqueueParallelism, len(ts)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range work {
				if _, err := s.enq.EnqueueContext(ctx, t); err != nil {
					once.Do(func() { firstErr = err; cancel() })
				}
			}
		}()
	}
	for _, t := range ts {
		select {
		case work <- t:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

// loadBatchWaiting reads a batch the caller may see and, with a wait,
// holds until it is done or the wait runs out, returning its latest
// record.
func (s *Server) loadBatchWaiting(c *gin.Context, wait time.Duration) (*store.Batch, error) {
	b, err := s.loadBatch(c)
	if err != nil || wait <= 0 || b.Done() {
		return b, err
	}
	ctx := c.Request.Context()
	return waitFor(ctx, s.waiter, store.BatchEventKey(b.ID), wait,
		func() (*store.Batch, error) { return s.store.GetBatch(ctx, b.ID) },
		func(b *store.Batch) bool { return b.Done() })
}

// loadBatch reads a batch the caller may see.
func (s *Server) loadBatch(c *gin.Context) (*store.Batch, error) {
	return loadOwned(c, s.store.GetBatch, func(b *store.Batch) string { return b.Owner })
}

// BatchResource is the JSON form of a batch.
type BatchResource struct {
	ID         string         `json:"id"`
	Total      int            `json:"total"`
	Counts     map[string]int `json:"counts"`
	Done       bool           `json:"done"`
	Format     *string        `json:"format"`
	CreatedAt  *time.Time     `json:"created_at"`
	DoneAt     *time.Time     `json:"done_at"`
	Tasks      []TaskResource `json:"tasks"`
	NextCursor *string        `json:"next_cursor"`
}

const (
	defaultPageLimit = 100
	maxPageLimit     = 1000
)

func (s *Server) getBatch(c *gin.Context) {
	wait, err := s.parseWait(c)
	if err != nil {
		fail(c, err)
		return
	}
	cursor, limit, err := pageParams(c)
	if err != nil {
		fail(c, err)
		return
	}
	b, err := s.loadBatchWaiting(c, wait)
	if err != nil {
		fail(c, err)
		return
	}
	ctx := c.Request.Context()
	ids, err := s.store.BatchItems(ctx, b.ID, cursor, limit)
	if err != nil {
		fail(c, err)
		return
	}
	recs, err := s.store.GetMany(ctx, ids)
	if err != nil {
		fail(c, err)
		return
	}
	res := BatchResource{ID: b.ID, Total: b.Total, Counts: map[string]int{}, Done: b.Done(),
		CreatedAt: timePtr(b.CreatedAt), DoneAt: timePtr(b.DoneAt), Tasks: make([]TaskResource, 0, len(recs))}
	for st, n := range b.Counts {
		res.Counts[string(st)] = n
	}
	if b.Format != "" {
		f := b.Format
		res.Format = &f
	}
	for i, r := range recs {
		if r == nil { // expired a moment before its batch (they share a TTL)
			r = &store.Task{ID: ids[i], BatchID: b.ID, State: store.StateFailed, ErrCode: "expired", ErrMsg: "the task record has expired"}
		}
		res.Tasks = append(res.Tasks, resource(r))
	}
	if next := cursor + len(ids); next < b.Total {
		n := strconv.Itoa(next)
		res.NextCursor = &n
	}
	c.JSON(http.StatusOK, res)
}

func pageParams(c *gin.Context) (cursor, limit int, err error) {
	limit = defaultPageLimit
	if v := c.Query("cursor"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 0 {
			return 0, 0, newError(http.StatusBadRequest, "invalid_request", "cursor", "cursor must be a value returned as next_cursor")
		}
		cursor = n
	}
	if v := c.Query("limit"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 1 || n > maxPageLimit {
			return 0, 0, newError(http.StatusBadRequest, "invalid_request", "limit", "limit must be between 1 and %d", maxPageLimit)
		}
		limit = n
	}
	return cursor, limit, nil
}

func (s *Server) cancelBatch(c *gin.Context) {
	b, err := s.loadBatch(c)
	if err != nil {
		fail(c, err)
		return
	}
	if b.Done() {
		fail(c, newError(http.StatusConflict, CodeConflict, "", "batch has already ended"))
		return
	}
	n, err := s.store.CancelBatch(c.Request.Context(), b.ID, b.Owner)
	if err != nil {
		fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"id": b.ID, "canceled": n})
}

// batchOutput renders a finished batch in its judge format (JSON lines of
// results for a JSON batch), exactly as puzzlectl solve --local prints it.
func (s *Server) batchOutput(c *gin.Context) {
	wait, err := s.parseWait(c)
	if err != nil {
		fail(c, err)
		return
	}
	b, err := s.loadBatchWaiting(c, wait)
	if err != nil {
		fail(c, err)
		return
	}
	ctx := c.Request.Context()
	if !b.Done() {
		fail(c, newError(http.StatusConflict, CodeIncomplete, "", "batch is not done: %d of %d tasks have ended",
			b.Counts[store.StateCompleted]+b.Counts[store.StateFailed]+b.Counts[store.StateCanceled], b.Total))
		return
	}
	results := make([]json.RawMessage, 0, b.Total)
	for start := 0; start < b.Total; start += maxPageLimit {
		ids, err := s.store.BatchItems(ctx, b.ID, start, maxPageLimit)
		if err != nil {
			fail(c, err)
			return
		}
		recs, err := s.store.GetMany(ctx, ids)
		if err != nil {
			fail(c, err)
			return
		}
		for i, r := range recs {
			if r == nil || r.State != store.StateCompleted {
				state := "expired"
				if r != nil {
					state = string(r.State)
				}
				fail(c, newError(http.StatusConflict, CodeIncomplete, "", "case %d did not complete (%s); the judge output needs every case", start+i+1, state))
				return
			}
			results = append(results, r.Result)
		}
	}
	var buf bytes.Buffer
	if err := renderOutput(&buf, b.Format, results); err != nil {
		fail(c, err)
		return
	}
	c.Data(http.StatusOK, "text/plain; charset=utf-8", buf.Bytes())
}

// renderOutput formats results with the solvers' own judge formatters.
func renderOutput(w io.Writer, format string, results []json.RawMessage) error {
	switch format {
	case FormatBOJ1525:
		var r sliding.Result
		if err := json.Unmarshal(results[0], &r); err != nil {
			return err
		}
		return sliding.FormatBOJ1525(w, r)
	case FormatP84021:
		var r fill.Result
		if err := json.Unmarshal(results[0], &r); err != nil {
			return err
		}
		return fill.FormatP84021(w, r)
	case FormatBOJ9944:
		rs := make([]sweep.Result, len(results))
		for i, raw := range results {
			if err := json.Unmarshal(raw, &rs[i]); err != nil {
				return err
			}
		}
		return sweep.FormatBOJ9944(w, rs)
	default:
		for _, raw := range results {
			w.Write(raw)
			w.Write([]byte{'\n'})
		}
		return nil
	}
}
