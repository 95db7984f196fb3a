package api

// Batch items are not task records of their own: an item's ID is derived
// from its batch's ID and its index (apitype.ItemID), and its state lives
// in its batch's chunks (docs/batches.md). This file serves an item
// through the same routes as a single task, GET and DELETE
// /v1/tasks/{id}, so clients need not tell the two apart.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
)

// ItemStore is what the API reads and cancels of batch items, which the
// batch layout keeps in chunks; *store.Store satisfies it.
type ItemStore interface {
	// GetItem returns item index of a batch as a task record.
	GetItem(ctx context.Context, batchID string, index int) (*store.Task, error)
	// ChunkInfos returns chunk j's items without their results, and
	// the results' sizes.
	ChunkInfos(ctx context.Context, b *store.Batch, j int) ([]store.ChunkInfo, error)
	// ChunkResults returns the results of completed items of chunk j.
	ChunkResults(ctx context.Context, b *store.Batch, j int, idx []int) ([]string, []bool, error)
	// CancelItem cancels item index of b unless it has ended.
	CancelItem(ctx context.Context, b *store.Batch, index int) (apitype.TaskState, error)
	// ItemRequest returns item index of b's canonical request.
	ItemRequest(ctx context.Context, b *store.Batch, index int) ([]byte, error)
	// FindCustomID returns the index of b's item, from index from on,
	// whose custom_id is id (unique in a batch), reading at most
	// maxChunks chunks' lists; or -1 and where the search stopped.
	FindCustomID(ctx context.Context, b *store.Batch, id string, from, maxChunks int) (found, next int, err error)
}

// chunkOf returns the chunk that holds item i of b. The stride is the
// batch's own (fixed when it was staged), never the current CHUNK_SIZE.
func chunkOf(b *store.Batch, i int) (int, error) {
	if b.Stride <= 0 {
		// Written by this code, so never expected: a batch record
		// without a stride cannot be read, and guessing one would
		// answer with another item's state.
		return 0, fmt.Errorf("batch %s has no stride", b.ID)
	}
	return i / b.Stride, nil
}

// loadItem reads the batch of an item ID for the caller, and the item. As
// with loadOwned, another owner's item, and an index beyond the batch,
// are "not found", so IDs reveal nothing.
func (s *Server) loadItem(c *gin.Context, batchID string, index int) (*store.Batch, *store.Task, error) {
	ctx := c.Request.Context()
	b, err := s.store.GetBatch(ctx, batchID)
	if err != nil {
		return nil, nil, err
	}
	if b.Owner != ownerOf(c) || index >= b.Total {
		return nil, nil, store.ErrNotFound
	}
	t, err := s.store.GetItem(ctx, batchID, index)
	if err != nil {
		return nil, nil, err
	}
	return b, t, nil
}

// getItem answers GET /v1/tasks/{item_id}, holding for ?wait= until the
// item ends. The wait listens on the item's chunk, whose event fires when
// any of its items ends: at most a chunk's worth of re-reads.
func (s *Server) getItem(c *gin.Context, batchID string, index int, wait time.Duration) {
	b, t, err := s.loadItem(c, batchID, index)
	if err != nil {
		fail(c, err)
		return
	}
	if wait > 0 && !t.State.Terminal() {
		j, err := chunkOf(b, index)
		if err != nil {
			fail(c, err)
			return
		}
		ctx := c.Request.Context()
		t, err = waitFor(ctx, s.waiter, store.ChunkEventKey(batchID, j), wait,
			func() (*store.Task, error) { return s.store.GetItem(ctx, batchID, index) },
			func(t *store.Task) bool { return t.State.Terminal() })
		if err != nil {
			fail(c, err)
			return
		}
	}
	r := resource(t)
	renderTask(c, s.polledStatus(c, wait, t.State.Terminal()), &r)
}

// cancelItem answers DELETE /v1/tasks/{item_id} as cancelTask does for a
// single task: the canceled item, also when it was canceled before; 409
// when it completed or failed.
func (s *Server) cancelItem(c *gin.Context, batchID string, index int) {
	b, t, err := s.loadItem(c, batchID, index)
	if err != nil {
		fail(c, err)
		return
	}
	if t.State == apitype.TaskStateCanceled {
		if !s.confirm(c) {
			return
		}
		r := resource(t)
		renderTask(c, http.StatusOK, &r)
		return
	}
	if t.State.Terminal() {
		fail(c, errEnded(t.State))
		return
	}
	ctx := c.Request.Context()
	prev, err := s.store.CancelItem(ctx, b, index)
	if err != nil {
		fail(c, err)
		return
	}
	if prev.Terminal() && prev != apitype.TaskStateCanceled {
		// It ended between the read and the cancel.
		fail(c, errEnded(prev))
		return
	}
	if !s.confirm(c) {
		return
	}
	t, err = s.store.GetItem(ctx, batchID, index)
	if err != nil {
		fail(c, err)
		return
	}
	r := resource(t)
	renderTask(c, http.StatusOK, &r)
}

// retryTask answers POST /v1/tasks/{id}/retry: a failed or canceled
// batch item runs again under its ID, as the batch's retry would re-run
// it; one that has not ended is answered as it is. A single task is run again by submitting its request again, which
// gives it a new ID, so its ID answers 409 saying so.
func (s *Server) retryTask(c *gin.Context) {
	batchID, index, ok := apitype.ParseItemID(c.Param("id"))
	if !ok {
		t, err := s.loadTask(c)
		if err != nil {
			fail(c, err)
			return
		}
		fail(c, newError(http.StatusConflict, apitype.CodeConflict, "",
			"task %s is a single task: submit its request again to run it again (a batch item is retried here)", t.ID))
		return
	}
	b, t, err := s.loadItem(c, batchID, index)
	if err != nil {
		fail(c, err)
		return
	}
	switch t.State {
	case apitype.TaskStateCompleted:
		fail(c, newError(http.StatusConflict, apitype.CodeConflict, "",
			"the item has completed; only a failed or canceled item is retried"))
		return
	case apitype.TaskStatePending, apitype.TaskStateActive:
		// It will run: re-opened by an earlier retry whose answer was
		// lost, say. Answered as a retry is, so a retry is safe to repeat.
		r := resource(t)
		renderTask(c, http.StatusOK, &r)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), maxRetryTime)
	defer cancel()
	reopened, err := s.store.RetryItem(ctx, b, index, s.quotaFor(c), s.retryTimeout)
	switch {
	case errors.Is(err, store.ErrQuota):
		err = s.quotaError(c)
	case errors.Is(err, store.ErrItemBusy):
		err = newError(http.StatusConflict, apitype.CodeConflict, "",
			"the item's chunk still runs other items; retry it once they have ended")
	}
	if err != nil {
		fail(c, err)
		return
	}
	if reopened {
		s.feedAfterCommit(ctx, b.ID)
		if err := s.store.Confirm(ctx); err != nil {
			fail(c, err)
			return
		}
	}
	// Re-opened here or by a retry just before: the item as it is now.
	if t, err = s.store.GetItem(ctx, batchID, index); err != nil {
		fail(c, err)
		return
	}
	r := resource(t)
	renderTask(c, http.StatusOK, &r)
}

// respondCanceled answers a task cancel that found the task ended (st):
// the task when an earlier cancel ended it, so that a retried DELETE (the
// client retries one whose answer was lost) succeeds as the first did,
// else the 409 of a cancel that came too late.
func (s *Server) respondCanceled(c *gin.Context, id string, st apitype.TaskState) {
	if st != apitype.TaskStateCanceled {
		fail(c, errEnded(st))
		return
	}
	s.respondTask(c, http.StatusOK, id)
}

// errEnded is the 409 of a cancel that came too late.
func errEnded(st apitype.TaskState) error {
	return newError(http.StatusConflict, apitype.CodeConflict, "", "task has already ended (%s)", st)
}

// itemsScanChunks bounds the chunks one filtered items page reads the
// states of: a filter that matches little answers a short page with a
// cursor rather than reading a million items in one request. An
// unfiltered page takes every item it reads, so limit bounds it: a page
// of the largest limit is whole whatever CHUNK_SIZE is.
const itemsScanChunks = 16

// pageResultBytes bounds the results one page of a batch's items carries
// (GET /v1/batches/{id} and its /items): past it the page ends early,
// with a cursor, always after one item at least. Without it a page of
// 1,000 items read them all whole: a page of eight 1000x1000 fills (19.5
// MB of result each) held 156 MB of response and took the API from 159
// MB to 950 MB resident, whatever MAX_BYTES_IN_FLIGHT said. A page takes
// twice its results from the admission pool, and admission.Pool.PageBytes lowers the
// bound so that a page needs at most half of its key's share.
const pageResultBytes = 8 << 20

// itemsPage picks the items of a page of b from index from on: at most
// limit, those in state only when it is set, up to pageResultBytes of
// results, reading the states of at most itemsScanChunks chunks. It
// returns their indexes, where the next page starts, and the size of
// their results.
func (s *Server) itemsPage(ctx context.Context, b *store.Batch, from, limit int, state apitype.TaskState) ([]int, int, int64, error) {
	var idx []int
	var size int64
	pageBytes := s.admit.PageBytes(b.Owner, pageResultBytes)
	next := max(from, 0)
	if b.Stride <= 0 || next >= b.Total {
		return nil, b.Total, 0, nil
	}
	for j, read := next/b.Stride, 0; j < b.Chunks() && (state == "" || read < itemsScanChunks); j, read = j+1, read+1 {
		infos, err := s.store.ChunkInfos(ctx, b, j)
		if err != nil {
			return nil, 0, 0, err
		}
		next = min(b.Total, (j+1)*b.Stride)
		for _, ci := range infos {
			if ci.Index < from || (state != "" && ci.State != state) {
				continue
			}
			if len(idx) > 0 && size+ci.ResultBytes > pageBytes {
				return idx, ci.Index, size, nil
			}
			idx = append(idx, ci.Index)
			size += ci.ResultBytes
			if len(idx) == limit {
				return idx, ci.Index + 1, size, nil
			}
		}
	}
	return idx, next, size, nil
}

// customIDScanChunks bounds the chunks' custom_id lists one page of a
// custom_id search reads: at the largest CHUNK_SIZE about 8.8 MB from
// Redis, held 2.2 MB at a time. A search that reads that much without a
// match answers an empty page with a cursor, as a filtered page does, so
// no request holds Redis or the API for a whole million-item batch.
const customIDScanChunks = 64

// customIDPage is the page of b's item whose custom_id is id, from index
// from on, when it is in state (or state is unset): a custom_id is unique
// in its batch, so the page holds that one item or none, and a match ends
// the list. It reads the batch's custom_id lists (store.FindCustomID) up
// to the match or customIDScanChunks chunks, then the states of the
// match's chunk.
func (s *Server) customIDPage(ctx context.Context, b *store.Batch, id string, from int, state apitype.TaskState) ([]int, int, int64, error) {
	i, next, err := s.store.FindCustomID(ctx, b, id, from, customIDScanChunks)
	if err != nil || i < 0 {
		return nil, next, 0, err
	}
	j, err := chunkOf(b, i)
	if err != nil {
		return nil, 0, 0, err
	}
	infos, err := s.store.ChunkInfos(ctx, b, j)
	if err != nil {
		return nil, 0, 0, err
	}
	k := i - j*b.Stride
	if k >= len(infos) || (state != "" && infos[k].State != state) {
		return nil, b.Total, 0, nil
	}
	return []int{i}, b.Total, infos[k].ResultBytes, nil
}

// customIDParam reads ?custom_id=: ok is false when it is absent; a value
// is 1 to apitype.MaxCustomIDBytes bytes, as a submitted one.
func customIDParam(c *gin.Context) (string, bool, error) {
	v, ok := c.GetQuery("custom_id")
	if !ok {
		return "", false, nil
	}
	if v == "" || len(v) > apitype.MaxCustomIDBytes {
		return "", false, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "custom_id",
			"custom_id must be 1 to %d bytes, got %d", apitype.MaxCustomIDBytes, len(v))
	}
	return v, true, nil
}

// readPage reads the items at idx of b, results included, having taken
// twice their results' size from the admission pool (the records, then
// their JSON), as /results does; the returned func gives it back.
func (s *Server) readPage(ctx context.Context, b *store.Batch, idx []int, size int64) ([]*store.Task, func(), error) {
	t := s.admit.Ticket(b.Owner)
	if err := t.Take(ctx, 2*size); err != nil {
		t.Release()
		return nil, func() {}, err
	}
	recs, err := s.store.ItemsAt(ctx, b, idx)
	if err != nil {
		t.Release()
		return nil, func() {}, err
	}
	return recs, t.Release, nil
}

// listItems answers GET /v1/batches/{id}/items: a page of the batch's
// items in submission order, those in state only when it is set (see
// itemsPage), and those whose custom_id is custom_id only when it is set
// (see customIDPage).
func (s *Server) listItems(c *gin.Context) {
	var state apitype.TaskState
	if v, ok := c.GetQuery("state"); ok {
		st, err := parseState(v)
		if err != nil {
			fail(c, err)
			return
		}
		state = st
	}
	cursor, _, err := pageParams(c)
	if err != nil {
		fail(c, err)
		return
	}
	limit, err := listLimit(c)
	if err != nil {
		fail(c, err)
		return
	}
	customID, byCustomID, err := customIDParam(c)
	if err != nil {
		fail(c, err)
		return
	}
	b, err := s.loadBatch(c)
	if err != nil {
		fail(c, err)
		return
	}
	ctx := c.Request.Context()
	var idx []int
	var next int
	var size int64
	if byCustomID {
		idx, next, size, err = s.customIDPage(ctx, b, customID, cursor, state)
	} else {
		idx, next, size, err = s.itemsPage(ctx, b, cursor, limit, state)
	}
	if err != nil {
		fail(c, err)
		return
	}
	recs, done, err := s.readPage(ctx, b, idx, size)
	if err != nil {
		fail(c, err)
		return
	}
	defer done()
	out := apitype.TaskList{Tasks: make([]apitype.Task, 0, len(recs))}
	for _, r := range recs {
		out.Tasks = append(out.Tasks, resource(r))
	}
	if next < b.Total {
		n := strconv.Itoa(next)
		out.NextCursor = &n
	}
	c.JSON(http.StatusOK, out)
}
