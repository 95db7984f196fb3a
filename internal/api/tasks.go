package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/tracing"
)

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// resource renders a task record as the wire resource.
func resource(t *store.Task) apitype.Task {
	r := apitype.Task{
		ID: t.ID, CustomID: t.CustomID, Kind: t.Kind, State: t.State, Result: t.Result, Cached: t.Cached,
		CreatedAt: timePtr(t.CreatedAt), StartedAt: timePtr(t.StartedAt), CompletedAt: timePtr(t.CompletedAt),
		Attempts: t.Attempts, Progress: t.Progress, Webhook: t.Webhook,
	}
	if t.BatchID != "" {
		b := t.BatchID
		r.BatchID = &b
	}
	if t.ErrCode != "" {
		r.Error = &apitype.TaskError{Code: t.ErrCode, Message: t.ErrMsg}
	}
	return r
}

// batchBodyRoutes read a batch's body (openBody, MaxBatchBodyBytes); the
// others' bodies are at most MaxBodyBytes.
var batchBodyRoutes = map[string]bool{"/v1/batches": true}

// timeout bounds a request. Long polls extend it by their wait, and
// requests with a body by the time the body may take to arrive. Streamed
// answers (streamedRoutes) bound their progress instead.
func (s *Server) timeout() gin.HandlerFunc {
	return func(c *gin.Context) {
		// Every long poll ends at EndWaits (waitFor, waitTask), whatever
		// its route; only a request with a wait can hold, so only it
		// pays for the copy of the request that carries the channel.
		if c.Query("wait") != "" {
			c.Request = c.Request.WithContext(s.withEnding(c.Request.Context()))
		}
		if streamedRoutes[c.FullPath()] {
			// Bounded by progress instead (see streamContext).
			c.Next()
			return
		}
		d := s.opts.RequestTimeout
		if w, err := s.parseWait(c); err == nil {
			d += w
		}
		if c.Request.Body != nil && c.Request.Body != http.NoBody {
			// The body's own deadline comes on top: the request's work
			// starts once it is in. It is the longest the route's
			// largest body may take: the body clock (meterBody) cuts a
			// slower one.
			limit := s.opts.MaxBodyBytes
			if batchBodyRoutes[c.FullPath()] {
				limit = s.opts.MaxBatchBodyBytes
			}
			d += bodyTime(s.opts.BodyReadTimeout, s.opts.BodyMinRate, limit)
		}
		ctx, cancel := context.WithTimeout(c.Request.Context(), d)
		defer cancel()
		c.Request = c.Request.WithContext(ctx)
		c.Next()
	}
}

func (s *Server) respondTask(c *gin.Context, status int, id string) {
	t, err := s.store.Get(c.Request.Context(), id)
	if err != nil {
		fail(c, err)
		return
	}
	r := resource(t)
	renderTask(c, status, &r)
}

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
	id := c.Param("id")
	if batchID, index, ok := apitype.ParseItemID(id); ok {
		s.getItem(c, batchID, index, wait)
		return
	}
	var (
		wake    *store.Wake
		release func()
	)
	if wait > 0 && validID(id) {
		// Subscribed before the read, so an end between the two cannot
		// be missed, and the record is read once.
		wake, release = s.waiter.Subscribe(store.TaskEventKey(id))
	}
	t, err := s.loadTask(c)
	if err == nil && wake != nil && !t.State.Terminal() {
		ctx, span := tracing.Start(c.Request.Context(), s.opts.Tracer, "task.wait")
		t, err = s.waitTask(ctx, t, wait, wake, release)
		endWait(span, t, err)
	} else if release != nil {
		release()
	}
	if err != nil {
		fail(c, err)
		return
	}
	r := resource(t)
	renderTask(c, s.polledStatus(c, wait, t.State.Terminal()), &r)
}

// deleteTask answers DELETE /v1/tasks/{id}?purge=true for a single task:
// its record is deleted once it has ended, and reads as not found from
// then on; a repeat by its owner answers as the first did.
func (s *Server) deleteTask(c *gin.Context) {
	id := c.Param("id")
	if !validID(id) {
		fail(c, store.ErrNotFound)
		return
	}
	err := s.store.DeleteTask(c.Request.Context(), id, ownerOf(c))
	if errors.Is(err, store.ErrNotEnded) {
		err = newError(http.StatusConflict, apitype.CodeConflict, "purge",
			"task has not ended; cancel it (DELETE without purge), then delete it")
	}
	if err != nil {
		fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

func (s *Server) cancelTask(c *gin.Context) {
	purge, err := purgeParam(c)
	if err != nil {
		fail(c, err)
		return
	}
	if batchID, index, ok := apitype.ParseItemID(c.Param("id")); ok {
		if purge {
			fail(c, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "purge",
				"a batch item is deleted with its batch: DELETE /v1/batches/%s?purge=true", batchID))
			return
		}
		s.cancelItem(c, batchID, index)
		return
	}
	if purge {
		s.deleteTask(c)
		return
	}
	t, err := s.loadTask(c)
	if err != nil {
		fail(c, err)
		return
	}
	if t.State.Terminal() {
		if t.State == apitype.TaskStateCanceled && !s.confirm(c) {
			return
		}
		s.respondCanceled(c, t.ID, t.State)
		return
	}
	prev, err := s.store.Cancel(c.Request.Context(), t.ID, t.Owner)
	if err != nil {
		fail(c, err)
		return
	}
	if (!prev.Terminal() || prev == apitype.TaskStateCanceled) && !s.confirm(c) {
		return
	}
	if prev.Terminal() {
		s.respondCanceled(c, t.ID, prev)
		return
	}
	s.respondTask(c, http.StatusOK, t.ID)
}

// listTasks answers GET /v1/tasks.
func (s *Server) listTasks(c *gin.Context) {
	f, cursor, limit, err := listQuery(c)
	if err != nil {
		fail(c, err)
		return
	}
	ts, next, err := s.store.ListTasks(c.Request.Context(), ownerOf(c), f, cursor, limit)
	if err != nil {
		fail(c, listError(err))
		return
	}
	out := apitype.TaskList{Tasks: make([]apitype.Task, 0, len(ts)), NextCursor: next}
	for _, t := range ts {
		out.Tasks = append(out.Tasks, resource(t))
	}
	c.JSON(http.StatusOK, out)
}
