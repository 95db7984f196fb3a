package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
)

// loadBatch reads a batch the caller may see.
func (s *Server) loadBatch(c *gin.Context) (*store.Batch, error) {
	return loadOwned(c, s.store.GetBatch, func(b *store.Batch) string { return b.Owner })
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
	var recs []*store.Task
	next := b.Total
	if cursor < b.Total {
		// Bounded by its results' size too (itemsPage), and taken from
		// the admission pool while it is held.
		var idx []int
		var size int64
		idx, next, size, err = s.itemsPage(c.Request.Context(), b, cursor, limit, "")
		if err != nil {
			fail(c, err)
			return
		}
		var done func()
		recs, done, err = s.readPage(c.Request.Context(), b, idx, size)
		if err != nil {
			fail(c, err)
			return
		}
		defer done()
	}
	res := apitype.Batch{ID: b.ID, Total: b.Total, Done: b.Done(),
		Counts: apitype.Counts{Pending: b.Counts[apitype.TaskStatePending], Active: b.Counts[apitype.TaskStateActive],
			Completed: b.Counts[apitype.TaskStateCompleted], Failed: b.Counts[apitype.TaskStateFailed],
			Canceled: b.Counts[apitype.TaskStateCanceled]},
		CreatedAt: timePtr(b.CreatedAt), DoneAt: timePtr(b.DoneAt), Tasks: make([]apitype.Task, 0, len(recs))}
	if b.Format != "" {
		f := b.Format
		res.Format = &f
	}
	res.Webhook = b.Webhook
	for i, r := range recs {
		if r == nil { // expired a moment before its batch (they share a TTL)
			r = &store.Task{ID: apitype.ItemID(b.ID, cursor+i), BatchID: b.ID, State: apitype.TaskStateFailed, ErrCode: apitype.CodeExpired, ErrMsg: "the item has expired"}
		}
		res.Tasks = append(res.Tasks, resource(r))
	}
	if next < b.Total {
		n := strconv.Itoa(next)
		res.NextCursor = &n
	}
	c.JSON(s.polledStatus(c, wait, b.Done()), res)
}

func pageParams(c *gin.Context) (cursor, limit int, err error) {
	limit = defaultPageLimit
	if v := c.Query("cursor"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 0 {
			return 0, 0, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "cursor", "cursor must be a value returned as next_cursor")
		}
		cursor = n
	}
	if v := c.Query("limit"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 1 || n > maxPageLimit {
			return 0, 0, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "limit", "limit must be between 1 and %d", maxPageLimit)
		}
		limit = n
	}
	return cursor, limit, nil
}

// cancelBatch answers DELETE /v1/batches/{id}. It is safe to retry, as
// the client does on a timeout or a lost answer: a repeat finishes a
// cancel that was cut off, and once a cancel has ended the batch, a repeat
// answers 200 with nothing more canceled. Only a batch that ended without
// a cancel is a 409. The store's mark script tells these apart, in the
// same step that marks the batch, so the handler does not guess from the
// record it read.
func (s *Server) cancelBatch(c *gin.Context) {
	purge, err := purgeParam(c)
	if err != nil {
		fail(c, err)
		return
	}
	if purge {
		s.deleteBatch(c)
		return
	}
	b, err := s.loadBatch(c)
	if err != nil {
		fail(c, err)
		return
	}
	n, err := s.store.CancelBatch(c.Request.Context(), b.ID, b.Owner)
	if errors.Is(err, store.ErrBatchEnded) {
		err = errBatchEnded
	}
	if err != nil {
		fail(c, err)
		return
	}
	if !s.confirm(c) {
		return
	}
	c.JSON(http.StatusOK, apitype.BatchCanceled{ID: b.ID, Canceled: n})
}

// purgeParam reads DELETE's ?purge=: true deletes an ended batch, false
// (or none) cancels it.
func purgeParam(c *gin.Context) (bool, error) {
	switch v := c.Query("purge"); v {
	case "", "false", "0":
		return false, nil
	case "true", "1":
		return true, nil
	default:
		return false, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "purge",
			"purge must be true or false, got %.40q", v)
	}
}

// deleteBatch answers DELETE /v1/batches/{id}?purge=true: the batch and
// its results are deleted once every item has ended, and read as not
// found from then on; a repeat by its owner answers as the first did.
// The store's script checks the owner, so the record is not read first.
func (s *Server) deleteBatch(c *gin.Context) {
	id := c.Param("id")
	if !validID(id) {
		fail(c, store.ErrNotFound)
		return
	}
	err := s.store.DeleteBatch(c.Request.Context(), id, ownerOf(c))
	switch {
	case errors.Is(err, store.ErrNotEnded):
		err = newError(http.StatusConflict, apitype.CodeConflict, "purge",
			"batch has items that have not ended; cancel it (DELETE without purge), wait for it to end, then delete it")
	case errors.Is(err, store.ErrRetryRunning):
		err = newError(http.StatusConflict, apitype.CodeConflict, "purge",
			"a retry of this batch is running; delete it once the retry has answered and its items have ended")
	case errors.Is(err, store.ErrChunksLeft):
		// Deleted: the chunks left are read by nothing and expire.
		s.log.WarnContext(c.Request.Context(), "batch deleted; some result chunks are left to expire", "batch_id", id, "err", err)
		err = nil
	}
	if err != nil {
		fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

// errBatchEnded is the 409 of a batch cancel that came after every item
// had ended on its own.
var errBatchEnded = newError(http.StatusConflict, apitype.CodeConflict, "", "batch has already ended")

// listBatches answers GET /v1/batches.
func (s *Server) listBatches(c *gin.Context) {
	f, cursor, limit, err := listQuery(c)
	if err != nil {
		fail(c, err)
		return
	}
	bs, next, err := s.store.ListBatches(c.Request.Context(), ownerOf(c), f, cursor, limit)
	if err != nil {
		fail(c, listError(err))
		return
	}
	out := apitype.BatchList{Batches: make([]apitype.BatchSummary, 0, len(bs)), NextCursor: next}
	for _, b := range bs {
		out.Batches = append(out.Batches, summary(b))
	}
	c.JSON(http.StatusOK, out)
}

// maxRetryTime bounds one retry's work: far more than the 15 s that the
// largest batch (1,000,000 items, all failed) takes.
const maxRetryTime = 2 * time.Minute

// retryBatch answers POST /v1/batches/{id}/retry.
func (s *Server) retryBatch(c *gin.Context) {
	b, err := s.loadBatch(c)
	if err != nil {
		fail(c, err)
		return
	}
	// Not cut by REQUEST_TIMEOUT nor by the client leaving: a retry of a
	// million items takes about 15 s, and one cut short would have to
	// read its re-opened chunks again before it reached the rest.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), maxRetryTime)
	defer cancel()
	n, err := s.store.RetryBatch(ctx, b, s.quotaFor(c), s.retryTimeout)
	if errors.Is(err, store.ErrQuota) {
		err = s.quotaError(c)
	}
	if errors.Is(err, store.ErrRetryRunning) {
		err = newError(http.StatusConflict, apitype.CodeConflict, "",
			"a retry of this batch is running; wait for its answer, then retry again if items are still failed")
	}
	if err != nil && n == 0 {
		fail(c, err)
		return
	}
	if n > 0 {
		s.feedAfterCommit(ctx, b.ID)
	}
	if cerr := s.store.Confirm(ctx); cerr != nil {
		fail(c, cerr)
		return
	}
	if err != nil {
		// Some chunks were re-opened and are running: that is done and
		// said (a 503 would hide it), and the rest are re-opened by the
		// next retry, which the answer asks for.
		_ = c.Error(err)
		c.Header("Retry-After", "1")
		c.JSON(http.StatusOK, apitype.BatchRetried{ID: b.ID, Retried: n})
		return
	}
	c.JSON(http.StatusOK, apitype.BatchRetried{ID: b.ID, Retried: n, Complete: true})
}

// retryTimeout is what a retried item adds to its unit's timeout, as at
// submission (ingest's staged).
func (s *Server) retryTimeout(k puzzle.Kind, own bool) time.Duration {
	return s.batches.Timeout(k, own)
}
