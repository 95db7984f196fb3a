package recovery

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// The reconciler's tests run it on a real Redis against a real asynq
// queue, with batches staged through the store (feedStack, stack_test.go).

// queued lists the task IDs waiting on the cheap lane's bulk queue, where
// the chunks' units of cheap items go, failing on one queued twice.
func (s *feedStack) queued(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for page := 1; ; page++ {
		ts, err := s.insp.ListPendingTasks(tasks.QueueCheapBulk, asynq.Page(page), asynq.PageSize(100))
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Fatal(err)
		}
		for _, ti := range ts {
			if out[ti.ID] {
				t.Fatalf("task %s queued twice", ti.ID)
			}
			if ti.Type != tasks.TypeUnit {
				t.Fatalf("task %s has type %s", ti.ID, ti.Type)
			}
			out[ti.ID] = true
		}
		if len(ts) < 100 {
			return out
		}
	}
}

// TestReconcilerReenqueuesStaleUnits: a feeder took a batch's units from
// the feed and died, having enqueued one of them and acknowledged none.
// One pass of the reconciler queues each unit once, under its fixed ID,
// and a second replica, without the lease, does nothing.
func TestReconcilerReenqueuesStaleUnits(t *testing.T) {
	t.Parallel()
	s := newFeedStack(t)
	ctx := context.Background()
	id := s.stage(t, 6, 2)
	refs, err := s.st.Feed(ctx, tasks.QueueCheapBulk, 64, 64)
	if err != nil || len(refs) != 3 {
		t.Fatalf("feed: %v %v, want the batch's 3 units", refs, err)
	}
	u0, err := tasks.NewUnitTask(refs[0], tasks.QueueCheapBulk)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.enq.EnqueueContext(ctx, u0); err != nil {
		t.Fatal(err)
	}
	r1 := NewReconciler(s.st, s.enq, nil, ReconcilerOptions{Grace: time.Nanosecond, FeedDepth: 64})
	r2 := NewReconciler(s.st, s.enq, nil, ReconcilerOptions{Grace: time.Nanosecond, FeedDepth: 64})
	if n, err := r1.RunOnce(ctx); err != nil || n != 3 {
		t.Fatalf("reconcile: %d units, %v; want the 3 stale ones", n, err)
	}
	q := s.queued(t)
	if len(q) != 3 {
		t.Fatalf("queued %v, want 3 units", q)
	}
	for j := range 3 {
		if !q[id+":"+tasks.ChunkUnit(j)] {
			t.Errorf("unit c%d not queued under its fixed ID", j)
		}
	}
	if stale, err := s.st.StaleFed(ctx, time.Now().Add(time.Hour), 10); err != nil || len(stale) != 0 {
		t.Fatalf("still being fed after the pass: %v %v", stale, err)
	}
	if n, err := r2.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("a second replica: %d units, %v; want 0", n, err)
	}
	if n, err := r1.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("a second pass: %d units, %v; want 0", n, err)
	}
}

// TestReconcilerFeedsACommittedBatch: the API died right after the
// commit, so the batch's units are only in the feed. One pass queues them,
// up to the feed depth, and later passes top the queue up as it drains.
func TestReconcilerFeedsACommittedBatch(t *testing.T) {
	t.Parallel()
	s := newFeedStack(t)
	ctx := context.Background()
	id := s.stage(t, 10, 2) // 5 units
	r := NewReconciler(s.st, s.enq, nil, ReconcilerOptions{Grace: time.Hour, FeedDepth: 3})
	if n, err := r.RunOnce(ctx); err != nil || n != 3 {
		t.Fatalf("first pass: %d units, %v; want FeedDepth 3", n, err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("with the queue full: %d units, %v; want 0", n, err)
	}
	// Workers take two units off the queue.
	q := s.queued(t)
	for j := range 2 {
		tid := id + ":" + tasks.ChunkUnit(j)
		if !q[tid] {
			t.Fatalf("unit c%d, first in the feed, not queued: %v", j, q)
		}
		if err := s.insp.DeleteTask(tasks.QueueCheapBulk, tid); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 2 {
		t.Fatalf("after two were taken: %d units, %v; want the last 2", n, err)
	}
	q = s.queued(t)
	for j := 2; j < 5; j++ {
		if !q[id+":"+tasks.ChunkUnit(j)] {
			t.Errorf("unit c%d not queued: %v", j, q)
		}
	}
	if stale, err := s.st.StaleFed(ctx, time.Now().Add(time.Hour), 10); err != nil || len(stale) != 0 {
		t.Fatalf("units left unacknowledged: %v %v", stale, err)
	}
}

// TestReconcilerReenqueuesStaleUnitsOnTheirLanes: a feeder that died
// holding a mixed batch's units left chunk units of cheap items and
// items' own units in the feeding set; the reconciler queues each on its
// lane's bulk queue: the chunks' on the cheap lane's, the own units on
// the solvers'.
func TestReconcilerReenqueuesStaleUnitsOnTheirLanes(t *testing.T) {
	t.Parallel()
	s := newFeedStack(t)
	ctx := context.Background()
	id := "6c616e65730000000000000000000000"
	w := s.st.NewBatchWriter(id, 2)
	for i := range 4 { // c0 = {0}, x1, c1 = {2}, x3
		it := store.StagedItem{Kind: puzzle.KindSliding, Request: sliding8(t, i), Timeout: time.Minute, Own: i%2 == 1}
		if err := w.Add(ctx, it); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.st.CommitBatch(ctx, w, store.CommitBatch{ID: id, Owner: "alice"}); err != nil {
		t.Fatal(err)
	}
	// Taken from both feeds and never enqueued.
	for _, q := range []string{tasks.QueueCheapBulk, tasks.QueueBulk} {
		if refs, err := s.st.Feed(ctx, q, 64, 64); err != nil || len(refs) != 2 {
			t.Fatalf("feed %s: %v %v, want 2 units", q, refs, err)
		}
	}
	r := NewReconciler(s.st, s.enq, nil, ReconcilerOptions{Grace: time.Nanosecond, FeedDepth: 64})
	if n, err := r.RunOnce(ctx); err != nil || n != 4 {
		t.Fatalf("reconcile: %d units, %v; want the 4 stale ones", n, err)
	}
	for q, want := range map[string][]string{tasks.QueueCheapBulk: {"c0", "c1"}, tasks.QueueBulk: {"x1", "x3"}} {
		ts, err := s.insp.ListPendingTasks(q)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, ti := range ts {
			got[ti.ID] = true
		}
		if len(got) != len(want) {
			t.Errorf("%s holds %v, want %v", q, got, want)
		}
		for _, u := range want {
			if !got[id+":"+u] {
				t.Errorf("%s: unit %s not queued (%v)", q, u, got)
			}
		}
	}
}
