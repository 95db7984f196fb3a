package api

import (
	"context"
	"time"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/tracing"
)

// The long poll: GET /v1/tasks/{id}?wait= (waitTask), GET
// /v1/batches/{id}?wait= (loadBatchWaiting) and a batch item's wait
// (waitFor) hold the request until what they read ends or the wait runs
// out, woken by the store's events (store.Hub) and rechecked now and then
// in case an event was lost.

// recheckEvery bounds how long a long poll trusts pub/sub alone. Events
// sent while the subscription was reconnecting are lost; a rare re-read
// makes such a loss cost seconds, not the whole wait.
const recheckEvery = 5 * time.Second

// waitTask holds until the task ends, the wait runs out or the client
// leaves (or the server's EndWaits), and returns the latest record. cur
// is the record as last known, and wake (released with release) a
// subscription to its event taken before cur was read or written, so no
// end after cur is missed. The event carries the ended record, so the usual wait reads nothing; only a
// recheck, the end of the wait, an event without the record, or a task
// with a webhook (whose delivery the event does not carry) reads it.
func (s *Server) waitTask(ctx context.Context, cur *store.Task, wait time.Duration, wake *store.Wake, release func()) (*store.Task, error) {
	id, key := cur.ID, store.TaskEventKey(cur.ID)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	ending := endingOf(ctx)
	for {
		recheck := time.NewTimer(recheckEvery)
		select {
		case <-wake.C:
			release()
			recheck.Stop()
			woken(ctx)
			// The event's record lacks the webhook's delivery, which
			// lives beside the record: a task with one is read.
			if t := store.DecodeEventTask(id, wake.Data()); t != nil && t.State.Terminal() && cur.Webhook == nil {
				return t, nil
			}
		case <-recheck.C:
			release()
		case <-deadline.C:
			release()
			recheck.Stop()
			return s.store.Get(ctx, id)
		case <-ending: // the server's EndWaits: like the wait running out
			release()
			recheck.Stop()
			return s.store.Get(ctx, id)
		case <-ctx.Done():
			release()
			recheck.Stop()
			return cur, nil
		}
		// No record came with the event, or pub/sub was quiet too long:
		// subscribe again, then read.
		wake, release = s.waiter.Subscribe(key)
		t, err := s.store.Get(ctx, id)
		if err != nil || t.State.Terminal() {
			release()
			return t, err
		}
		cur = t
	}
}

// waitFor is the long-poll loop of batches and batch items: subscribe
// first, then read, so an event between the two cannot be missed. The
// server's EndWaits (its channel in ctx: endingOf) ends it like the
// wait running out, with a fresh read.
func waitFor[T any](ctx context.Context, w Waiter, key string, wait time.Duration, read func() (T, error), done func(T) bool) (T, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	ending := endingOf(ctx)
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
		case <-ending:
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

// woken marks the wait's span with the event that woke it: the worker's
// write of the result, published by the store.
func woken(ctx context.Context) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("woken")
	}
}

// endWait ends a wait's span with the state the wait ended in.
func endWait(span trace.Span, t *store.Task, err error) {
	if span.IsRecording() {
		tracing.Fail(span, err)
		if t != nil {
			span.SetAttributes(attribute.String("puzzleq.task.state", string(t.State)))
		}
	}
	span.End()
}
