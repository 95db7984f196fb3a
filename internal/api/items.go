package api

// Batch items are not task records of their own: an item's ID is derived
// from its batch's ID and its index (apitype.ItemID), and its state lives
// in its batch's chunks (docs/batches.md). This file serves an item
// through the same routes as a single task, GET and DELETE
// /v1/tasks/{id}, so clients need not tell the two apart.

import (
	"context"
	"fmt"
	"net/http"
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
	renderTask(c, s.polledStatus(wait, t.State.Terminal()), &r)
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
	t, err = s.store.GetItem(ctx, batchID, index)
	if err != nil {
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
