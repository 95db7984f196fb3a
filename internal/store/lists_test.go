package store_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// listAll pages through a list with limit per page and returns the IDs in
// order.
func listAll(t *testing.T, limit int, page func(cursor string) ([]string, *string)) []string {
	t.Helper()
	var out []string
	cursor := ""
	for range 1000 {
		ids, next := page(cursor)
		out = append(out, ids...)
		if next == nil {
			return out
		}
		cursor = *next
	}
	t.Fatal("the list did not end in 1000 pages")
	return nil
}

// TestListBatchesNewestFirst: an owner's batches list newest first across
// pages (members of one millisecond too), filters by state and kind and
// creation time, shows no other owner's batch, and skips and drops a
// batch whose record is gone.
func TestListBatchesNewestFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	var ids []string
	for i := range 7 {
		id := bid(fmt.Sprintf("list%d", i))
		items := []store.StagedItem{cheap(`{"p":0}`)}
		if i%2 == 1 {
			items = append(items, own(`{"p":1}`))
		}
		e.commit(t, store.CommitBatch{ID: id, Owner: "alice"}, 4, items)
		ids = append(ids, id)
		if i%3 == 0 {
			time.Sleep(2 * time.Millisecond) // some share a millisecond, some do not
		}
	}
	e.commit(t, store.CommitBatch{ID: bid("bob"), Owner: "bob"}, 4, []store.StagedItem{cheap(`{"p":0}`)})
	byTime := slices.Clone(ids)
	// Newest first; within a millisecond, by ID descending.
	created := map[string]time.Time{}
	for _, id := range ids {
		b, _ := e.s.GetBatch(e.ctx, id)
		created[id] = b.CreatedAt
	}
	slices.SortStableFunc(byTime, func(a, b string) int {
		if c := created[b].Compare(created[a]); c != 0 {
			return c
		}
		if a > b {
			return -1
		}
		return 1
	})
	for _, limit := range []int{1, 2, 3, 100} {
		got := listAll(t, limit, func(cursor string) ([]string, *string) {
			bs, next, err := e.s.ListBatches(e.ctx, "alice", store.ListFilter{}, cursor, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(bs) > limit {
				t.Fatalf("%d batches on a page of %d", len(bs), limit)
			}
			var out []string
			for _, b := range bs {
				out = append(out, b.ID)
			}
			return out, next
		})
		if !slices.Equal(got, byTime) {
			t.Fatalf("limit %d: listed %v, want %v", limit, got, byTime)
		}
	}
	kinds := func(f store.ListFilter) []string {
		bs, _, err := e.s.ListBatches(e.ctx, "alice", f, "", 100)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, b := range bs {
			out = append(out, b.ID)
		}
		return out
	}
	if got := kinds(store.ListFilter{Kind: "sweep"}); len(got) != 3 {
		t.Fatalf("kind=sweep listed %d batches, want 3", len(got))
	}
	if got := kinds(store.ListFilter{State: apitype.TaskStatePending}); len(got) != 7 {
		t.Fatalf("state=pending listed %d batches, want 7", len(got))
	}
	if got := kinds(store.ListFilter{State: apitype.TaskStateCompleted}); len(got) != 0 {
		t.Fatalf("state=completed listed %v", got)
	}
	if got := kinds(store.ListFilter{CreatedAfter: created[ids[3]]}); slices.Contains(got, ids[0]) || !slices.Contains(got, ids[6]) {
		t.Fatalf("created_after listed %v", got)
	}
	if bs, _, _ := e.s.ListBatches(e.ctx, "bob", store.ListFilter{}, "", 100); len(bs) != 1 || bs[0].ID != bid("bob") {
		t.Fatalf("bob lists %v", bs)
	}
	if _, _, err := e.s.ListBatches(e.ctx, "alice", store.ListFilter{}, "nonsense", 10); err != store.ErrBadCursor {
		t.Fatalf("a bad cursor: %v", err)
	}
	// A record that is gone is skipped and leaves the index.
	e.rdb.Del(e.ctx, e.prefix+"batch:"+ids[6])
	if got := kinds(store.ListFilter{}); slices.Contains(got, ids[6]) || len(got) != 6 {
		t.Fatalf("after a record went: %v", got)
	}
	if n := e.rdb.ZCard(e.ctx, e.prefix+"owner:alice:batches").Val(); n != 6 {
		t.Fatalf("the index holds %d members, want 6", n)
	}
	if ttl := e.rdb.TTL(e.ctx, e.prefix+"owner:alice:batches").Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("the index's TTL is %v", ttl)
	}
}

// TestListTasks: single tasks list newest first with their results, by
// state and kind, each owner its own.
func TestListTasks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	for i := range 5 {
		kind := "sliding"
		if i == 4 {
			kind = "fill"
		}
		if _, _, err := e.s.SubmitTask(e.ctx, store.NewTask{ID: bid(fmt.Sprintf("t%d", i)), Kind: kind, Owner: "alice"}, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	e.s.SubmitTask(e.ctx, store.NewTask{ID: bid("tb"), Kind: "sliding", Owner: "bob"}, 0)
	if _, err := e.s.Finish(e.ctx, []worker.Transition{{ID: bid("t1"), Owner: "alice", State: apitype.TaskStateCompleted,
		Result: json.RawMessage(`{"moves":1}`)}}, nil); err != nil {
		t.Fatal(err)
	}
	got := listAll(t, 2, func(cursor string) ([]string, *string) {
		ts, next, err := e.s.ListTasks(e.ctx, "alice", store.ListFilter{}, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, x := range ts {
			out = append(out, x.ID)
		}
		return out, next
	})
	want := []string{bid("t4"), bid("t3"), bid("t2"), bid("t1"), bid("t0")}
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	ts, next, err := e.s.ListTasks(e.ctx, "alice", store.ListFilter{State: apitype.TaskStateCompleted}, "", 10)
	if err != nil || len(ts) != 1 || next != nil || string(ts[0].Result) != `{"moves":1}` {
		t.Fatalf("state=completed: %v %v %v", ts, next, err)
	}
	if ts, _, _ := e.s.ListTasks(e.ctx, "alice", store.ListFilter{Kind: "fill"}, "", 10); len(ts) != 1 || ts[0].ID != bid("t4") {
		t.Fatalf("kind=fill: %v", ts)
	}
	if ts, _, _ := e.s.ListTasks(e.ctx, "bob", store.ListFilter{}, "", 10); len(ts) != 1 {
		t.Fatalf("bob lists %d tasks", len(ts))
	}
}

// TestRetryBatch: a done batch's failed and canceled items are pending
// again with their IDs and custom_ids, counted in the batch and the
// quota, fed again and run; the quota is checked.
func TestRetryBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	id := bid("retry")
	a := cheap(`{"p":0}`)
	a.CustomID = "zero"
	items := []store.StagedItem{a, cheap(`{"p":1}`), own(`{"p":2}`), cheap(`{"p":3}`), own(`{"p":4}`)}
	b := e.commit(t, store.CommitBatch{ID: id, Owner: "alice"}, 2, items)
	timeout := func(puzzle.Kind, bool) time.Duration { return time.Second }
	if n, err := e.s.RetryBatch(e.ctx, b, 0, timeout); err != nil || n != 0 {
		t.Fatalf("retry of a batch with nothing failed: %d, %v", n, err)
	}
	// Run everything: 0 fails, 2 fails, 1 and 4 complete; 3 is canceled.
	if _, err := e.s.CancelItem(e.ctx, b, 3); err != nil {
		t.Fatal(err)
	}
	outcome := map[int]worker.ItemOutcome{
		0: {Index: 0, State: apitype.TaskStateFailed, Code: apitype.CodeTimeout, Msg: "slow"},
		1: {Index: 1, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":1}`)},
		2: {Index: 2, State: apitype.TaskStateFailed, Code: apitype.CodeBudgetExceeded, Msg: "big"},
		4: {Index: 4, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":4}`)},
	}
	run := func(refs []tasks.UnitRef) {
		t.Helper()
		for _, r := range refs {
			w, err := e.s.StartUnit(e.ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			var outs []worker.ItemOutcome
			for _, it := range w.Items {
				outs = append(outs, outcome[it.Index])
			}
			if _, err := e.s.FinishUnit(e.ctx, r, "", outs); err != nil {
				t.Fatal(err)
			}
		}
	}
	run(e.feedAll(t))
	e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStateCompleted: 2, apitype.TaskStateFailed: 2, apitype.TaskStateCanceled: 1})
	e.pending(t, "alice", 0)
	if _, err := e.s.RetryBatch(e.ctx, b, 2, timeout); err != store.ErrQuota {
		t.Fatalf("retry of 3 items with a quota of 2: %v", err)
	}
	n, err := e.s.RetryBatch(e.ctx, b, 0, timeout)
	if err != nil || n != 3 {
		t.Fatalf("retried %d, %v; want 3", n, err)
	}
	b = e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStateCompleted: 2, apitype.TaskStatePending: 3})
	if b.Done() || !b.DoneAt.IsZero() {
		t.Fatalf("a retried batch is done: %+v", b)
	}
	e.pending(t, "alice", 3)
	it, err := e.s.GetItem(e.ctx, id, 0)
	if err != nil || it.State != apitype.TaskStatePending || it.CustomID == nil || *it.CustomID != "zero" || it.ErrCode != "" {
		t.Fatalf("item 0 after the retry: %+v %v", it, err)
	}
	refs := e.feedAll(t)
	if got := fmt.Sprint(units(refs)); got != "[c0 c1 x2]" {
		t.Fatalf("fed %s after the retry, want [c0 c1 x2]", got)
	}
	// The second run completes them all, counted once.
	for i := range outcome {
		outcome[i] = worker.ItemOutcome{Index: i, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":0}`)}
	}
	outcome[3] = worker.ItemOutcome{Index: 3, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":3}`)}
	run(refs)
	b = e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStateCompleted: 5})
	if !b.Done() || b.DoneAt.IsZero() {
		t.Fatalf("the batch is not done again: %+v", b)
	}
	e.pending(t, "alice", 0)
	if n, err := e.s.RetryBatch(e.ctx, b, 0, timeout); err != nil || n != 0 {
		t.Fatalf("a second retry retried %d, %v", n, err)
	}
	if bs, _, _ := e.s.ListBatches(e.ctx, "alice", store.ListFilter{State: apitype.TaskStateCompleted}, "", 10); len(bs) != 1 {
		t.Fatalf("the batch is not listed completed: %v", bs)
	}
}

// TestRetryCanceledBatch: a canceled batch's items, those never started
// included, run after a retry, and the batch is no longer canceled.
func TestRetryCanceledBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	id := bid("retrycancel")
	b := e.commit(t, store.CommitBatch{ID: id, Owner: "alice"}, 2, []store.StagedItem{cheap(`{"p":0}`), cheap(`{"p":1}`), own(`{"p":2}`)})
	if n, err := e.s.CancelBatch(e.ctx, id, "alice"); err != nil || n != 3 {
		t.Fatalf("canceled %d, %v", n, err)
	}
	if refs := e.feedAll(t); len(refs) != 0 {
		t.Fatalf("a canceled batch fed %v", refs)
	}
	b, _ = e.s.GetBatch(e.ctx, id)
	if store.BatchState(b) != apitype.TaskStateCanceled {
		t.Fatalf("state %s", store.BatchState(b))
	}
	n, err := e.s.RetryBatch(e.ctx, b, 0, func(puzzle.Kind, bool) time.Duration { return time.Second })
	if err != nil || n != 3 {
		t.Fatalf("retried %d, %v", n, err)
	}
	b = e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStatePending: 3})
	if !b.CanceledAt.IsZero() || store.BatchState(b) != apitype.TaskStatePending {
		t.Fatalf("after the retry: %+v", b)
	}
	e.pending(t, "alice", 3)
	// The chunk's unit of cheap items is back in the cheap lane's feed,
	// the own unit in the solvers'.
	if c, x := e.rdb.ZRange(e.ctx, e.prefix+"feed:cheap", 0, -1).Val(), e.rdb.ZRange(e.ctx, e.prefix+"feed", 0, -1).Val(); len(c) != 1 || !strings.Contains(c[0], "/c0/") ||
		len(x) != 1 || !strings.Contains(x[0], "/x2/") {
		t.Fatalf("retried units in the feeds: cheap %v, solvers' %v", c, x)
	}
	refs := e.feedAll(t)
	if got := fmt.Sprint(units(refs)); got != "[c0 x2]" {
		t.Fatalf("fed %s", got)
	}
	if n := e.rdb.ZCard(e.ctx, e.prefix+"backlog").Val(); n != 0 {
		t.Fatalf("the backlog holds %d members once everything is fed", n)
	}
	for _, r := range refs {
		w, err := e.s.StartUnit(e.ctx, r)
		if err != nil || len(w.Items) == 0 {
			t.Fatalf("start %s: %v %v", r.Unit, w, err)
		}
	}
	e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStateActive: 3})
}

// TestRetryWaitsForABusyChunk: while a chunk's unit still runs items, its
// failed cheap item is left for a later retry (the unit's marker counts
// the others active, and its task ID is taken); an own item is retried at
// once; once the chunk is idle, the cheap item is retried too, and every
// count stays exact.
func TestRetryWaitsForABusyChunk(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	id := bid("busy")
	b := e.commit(t, store.CommitBatch{ID: id, Owner: "alice"}, 4, []store.StagedItem{cheap(`{"p":0}`), cheap(`{"p":1}`), own(`{"p":2}`)})
	refs := e.feedAll(t)
	if got := fmt.Sprint(units(refs)); got != "[c0 x2]" {
		t.Fatalf("fed %s", got)
	}
	for _, r := range refs {
		if _, err := e.s.StartUnit(e.ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	fail := func(r tasks.UnitRef, i int) {
		t.Helper()
		if _, err := e.s.FinishUnit(e.ctx, r, "", []worker.ItemOutcome{{Index: i, State: apitype.TaskStateFailed, Code: apitype.CodeTimeout, Msg: "slow"}}); err != nil {
			t.Fatal(err)
		}
	}
	fail(refs[0], 0) // item 1 of the same unit still runs
	fail(refs[1], 2)
	e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStateFailed: 2, apitype.TaskStateActive: 1})
	timeout := func(puzzle.Kind, bool) time.Duration { return time.Second }
	if n, err := e.s.RetryBatch(e.ctx, b, 0, timeout); err != nil || n != 1 {
		t.Fatalf("retry while chunk 0 runs: %d, %v; want the own item alone", n, err)
	}
	e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStateFailed: 1, apitype.TaskStateActive: 1, apitype.TaskStatePending: 1})
	e.pending(t, "alice", 2)
	if got := fmt.Sprint(units(e.feedAll(t))); got != "[x2]" {
		t.Fatalf("fed %s after the first retry, want [x2]", got)
	}
	if _, err := e.s.FinishUnit(e.ctx, refs[0], "", []worker.ItemOutcome{{Index: 1, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":1}`)}}); err != nil {
		t.Fatal(err)
	}
	if n, err := e.s.RetryBatch(e.ctx, b, 0, timeout); err != nil || n != 1 {
		t.Fatalf("retry once chunk 0 is idle: %d, %v", n, err)
	}
	e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStateCompleted: 1, apitype.TaskStatePending: 2})
	e.pending(t, "alice", 2)
	refs = e.feedAll(t)
	if got := fmt.Sprint(units(refs)); got != "[c0]" {
		t.Fatalf("fed %s after the second retry, want [c0]", got)
	}
	w, err := e.s.StartUnit(e.ctx, refs[0])
	if err != nil || len(w.Items) != 1 || w.Items[0].Index != 0 {
		t.Fatalf("the re-fed chunk runs %+v, %v; want item 0 alone", w, err)
	}
	e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStateCompleted: 1, apitype.TaskStateActive: 1, apitype.TaskStatePending: 1})
}

// TestRetryOneAtATime: while a retry of a batch runs, another of it is
// refused (ErrRetryRunning) rather than reading every chunk again; once
// it has answered, the next may run, and every count is exact. The first
// retry is held inside its chunk scan by its timeout func.
func TestRetryOneAtATime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	id := bid("retryone")
	b := e.commit(t, store.CommitBatch{ID: id, Owner: "alice"}, 2, []store.StagedItem{cheap(`{"p":0}`), cheap(`{"p":1}`), own(`{"p":2}`)})
	if n, err := e.s.CancelBatch(e.ctx, id, "alice"); err != nil || n != 3 {
		t.Fatalf("canceled %d, %v", n, err)
	}
	b, _ = e.s.GetBatch(e.ctx, id)
	inside, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	held := func(puzzle.Kind, bool) time.Duration {
		once.Do(func() { close(inside); <-release })
		return time.Second
	}
	type answer struct {
		n   int
		err error
	}
	first := make(chan answer, 1)
	go func() {
		n, err := e.s.RetryBatch(e.ctx, b, 0, held)
		first <- answer{n, err}
	}()
	<-inside
	quick := func(puzzle.Kind, bool) time.Duration { return time.Second }
	for range 3 {
		if n, err := e.s.RetryBatch(e.ctx, b, 0, quick); !errors.Is(err, store.ErrRetryRunning) || n != 0 {
			t.Fatalf("a retry while another runs: %d, %v; want ErrRetryRunning", n, err)
		}
	}
	close(release)
	if a := <-first; a.err != nil || a.n != 3 {
		t.Fatalf("the held retry: %d, %v; want 3", a.n, a.err)
	}
	if n, err := e.s.RetryBatch(e.ctx, b, 0, quick); err != nil || n != 0 {
		t.Fatalf("a retry after it: %d, %v; want 0 and no error (the lock is released)", n, err)
	}
	e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStatePending: 3})
	e.pending(t, "alice", 3)
}
