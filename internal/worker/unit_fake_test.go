package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// The unit handler's paths on a fake store: cancellation, interruption,
// panics, redelivery and feeding, each provoked at a precise point. The
// same handler on the real store is tested in unit_redis_test.go.

const (
	sample8b   = `{"kind":"sliding","puzzle":{"board":[[2,1],[3,0]]}}`
	sampleFill = `{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[1,0]]}}`
	// sampleSweep is a search, so it runs in its own unit and is cached.
	sampleSweep = `{"kind":"sweep","puzzle":{"board":["...",".*.","..."]}}`
	badRequest  = `{"kind":"sliding","puzzle":{"board":[[9]]}}`
)

// unitTask builds the task of unit u of batch "b".
func unitTask(t *testing.T, u string) *asynq.Task {
	t.Helper()
	task, err := tasks.NewUnitTask(tasks.UnitRef{BatchID: "b", Unit: u, Timeout: time.Minute}, tasks.QueueBulk)
	if err != nil {
		t.Fatal(err)
	}
	return task
}

// mustEnd returns how item index ended, failing the test if it has not.
func mustEnd(t *testing.T, f *fakeStore, index int) worker.ItemOutcome {
	t.Helper()
	o, ok := f.entry(index)
	if !ok {
		t.Fatalf("item %d has not ended", index)
	}
	return o
}

// fakeFeeder is a Feeder holding units waiting to be fed.
type fakeFeeder struct {
	mu      sync.Mutex
	waiting []tasks.UnitRef
	feedErr error
	// enqFail maps a unit's task ID to the error its enqueue meets; the
	// others are acknowledged.
	enqFail map[string]error
	// calls records each Feed call's queue, depth and max, and queues
	// each EnqueueFed call's queue.
	calls  []feedCall
	queues []string
	acked  []tasks.UnitRef
}

type feedCall struct {
	queue      string
	depth, max int
}

func (f *fakeFeeder) Feed(_ context.Context, queue string, depth, max int) ([]tasks.UnitRef, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, feedCall{queue, depth, max})
	if f.feedErr != nil {
		return nil, f.feedErr
	}
	// Each lane's bulk queue takes the units of its lane, as the
	// store's two feeds give them; another queue takes any.
	var refs, left []tasks.UnitRef
	for _, r := range f.waiting {
		lane := queue != tasks.QueueBulk && queue != tasks.QueueCheapBulk || tasks.UnitQueue(r.Unit) == queue
		if lane && len(refs) < max {
			refs = append(refs, r)
		} else {
			left = append(left, r)
		}
	}
	f.waiting = left
	return refs, nil
}

func (f *fakeFeeder) EnqueueFed(_ context.Context, queue string, refs []tasks.UnitRef) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queues = append(f.queues, queue)
	var errs []error
	n := 0
	for _, r := range refs {
		if err := f.enqFail[r.TaskID()]; err != nil {
			errs = append(errs, err)
			continue
		}
		f.acked = append(f.acked, r)
		n++
	}
	return n, errors.Join(errs...)
}

func TestUnitRunsItsItems(t *testing.T) {
	t.Parallel()
	st := newUnitStore(map[string][]int{"c0": {0, 1, 2, 3}, "x4": {4}},
		map[int]string{0: sample8, 1: sampleFill, 2: badRequest, 3: sample8b, 4: sampleSweep})
	m := worker.NewMetrics(prometheus.NewRegistry())
	h := worker.NewHandler(st, nil, testLimits(), m, nil)
	for _, u := range []string{"c0", "x4"} {
		if err := h.ProcessTask(context.Background(), unitTask(t, u)); err != nil {
			t.Fatalf("unit %s: %v", u, err)
		}
	}
	sweepKey := mustParse(t, sampleSweep).Key()
	for _, tc := range []struct {
		index          int
		state          apitype.TaskState
		code, cacheKey string
	}{
		{0, apitype.TaskStateCompleted, "", ""},
		{1, apitype.TaskStateCompleted, "", ""},
		{2, apitype.TaskStateFailed, apitype.CodeInvalidPuzzle, ""},
		{3, apitype.TaskStateCompleted, "", ""},
		// Only the own unit's search is cached, under its puzzle's key.
		{4, apitype.TaskStateCompleted, "", sweepKey},
	} {
		o := mustEnd(t, st, tc.index)
		if o.State != tc.state || o.Code != tc.code || o.CacheKey != tc.cacheKey || o.Cached ||
			(o.State == apitype.TaskStateCompleted) != (len(o.Result) > 0) || (o.Code != "") != (o.Msg != "") {
			t.Errorf("item %d ended %+v, want %s %q with cache key %q", tc.index, o, tc.state, tc.code, tc.cacheKey)
		}
	}
	if got := string(mustEnd(t, st, 0).Result); got != `{"moves":3,"solvable":true,"path":"DRD"}` {
		t.Errorf("item 0's result: %s", got)
	}
	// The chunk's cheap items are never looked up; the search is.
	if len(st.cacheReads) != 1 || st.cacheReads[0] != sweepKey {
		t.Errorf("cache reads %q, want only the sweep's", st.cacheReads)
	}
	if n := testutil.ToFloat64(m.Tasks.WithLabelValues("sliding", "completed")); n != 2 {
		t.Errorf("sliding completions counted %v, want 2", n)
	}
	if n := testutil.ToFloat64(m.Tasks.WithLabelValues("unknown", apitype.CodeInvalidPuzzle)); n != 1 {
		t.Errorf("invalid items counted %v, want 1", n)
	}
}

// An own unit's search found in the cache is not run again, and its
// entry refers to the cache entry rather than holding a second copy.
func TestOwnUnitUsesTheCache(t *testing.T) {
	t.Parallel()
	st := newUnitStore(map[string][]int{"x7": {7}}, map[int]string{7: sampleSweep})
	key := mustParse(t, sampleSweep).Key()
	st.cache[key] = json.RawMessage(`{"cached":"answer"}`)
	m := worker.NewMetrics(prometheus.NewRegistry())
	h := worker.NewHandler(st, nil, testLimits(), m, nil)
	*worker.SolveFnOf(h) = func(context.Context, *puzzle.Parsed) (json.RawMessage, error) {
		t.Error("a cached search was solved again")
		return nil, errors.New("solved")
	}
	if err := h.ProcessTask(context.Background(), unitTask(t, "x7")); err != nil {
		t.Fatal(err)
	}
	o := mustEnd(t, st, 7)
	if o.State != apitype.TaskStateCompleted || !o.Cached || o.CacheKey != key || string(o.Result) != `{"cached":"answer"}` {
		t.Fatalf("item ended %+v", o)
	}
	if n := testutil.ToFloat64(m.CacheHits); n != 1 {
		t.Fatalf("cache hits counted %v", n)
	}
}

func TestUndecodableUnitIsDropped(t *testing.T) {
	t.Parallel()
	for _, payload := range []string{
		`{`,
		`{"unit":"c0"}`,
		`{"batch_id":"b","unit":"y0"}`,
		`{"batch_id":"b","unit":"c01"}`,
		`{"BATCH_ID":"b","unit":"c0"}`,
		`{"batch_id":"b","batch_id":"c","unit":"c0"}`,
	} {
		st := newUnitStore(map[string][]int{"c0": {0}}, map[int]string{0: sample8})
		h := worker.NewHandler(st, nil, testLimits(), nil, nil)
		err := h.ProcessTask(context.Background(), asynq.NewTask(tasks.TypeUnit, []byte(payload)))
		if !errors.Is(err, asynq.SkipRetry) || st.starts != 0 {
			t.Errorf("payload %s: error %v after %d starts, want SkipRetry before any", payload, err, st.starts)
		}
	}
}

// A cancel stops the item's solve; the item keeps its canceled entry, and
// the unit ends without a retry.
func TestCancelDuringAUnit(t *testing.T) {
	t.Parallel()
	st := newUnitStore(map[string][]int{"c0": {0, 1}}, map[int]string{0: sample8, 1: sample8b})
	c := worker.NewCancels()
	h := worker.NewHandler(st, c, testLimits(), nil, nil)
	started := make(chan struct{})
	*worker.SolveFnOf(h) = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		if p.Cells() == 9 {
			close(started)
			<-ctx.Done() // item 0 runs until it is canceled
			return nil, ctx.Err()
		}
		return p.Solve(ctx)
	}
	errc := make(chan error, 1)
	go func() { errc <- h.ProcessTask(context.Background(), unitTask(t, "c0")) }()
	<-started
	st.cancelItem(0)
	c.Cancel(apitype.ItemID("b", 0)) // what the cancel listener does
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("a unit with a canceled item must end without a retry: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the canceled solve did not stop")
	}
	if o := mustEnd(t, st, 0); o.State != apitype.TaskStateCanceled {
		t.Errorf("canceled item ended %+v", o)
	}
	if o := mustEnd(t, st, 1); o.State != apitype.TaskStateCompleted {
		t.Errorf("the other item ended %+v", o)
	}
	for _, outs := range st.unitFinishes {
		for _, o := range outs {
			if o.Index == 0 {
				t.Errorf("the canceled item's outcome was written: %+v", o)
			}
		}
	}
	if c.Running() != 0 {
		t.Error("cancel registrations leaked")
	}
}

// An own unit's item is registered before StartUnit reads it, so a
// cancel that lands in between still stops its search.
func TestCancelBeforeAnOwnUnitStarts(t *testing.T) {
	t.Parallel()
	st := newUnitStore(map[string][]int{"x3": {3}}, map[int]string{3: sampleSweep})
	c := worker.NewCancels()
	h := worker.NewHandler(st, c, testLimits(), nil, nil)
	// The store has not recorded the cancel yet when StartUnit reads, so
	// the item is returned to run: only the registration can stop it.
	st.onStart = func(tasks.UnitRef) { c.Cancel(apitype.ItemID("b", 3)) }
	*worker.SolveFnOf(h) = func(ctx context.Context, _ *puzzle.Parsed) (json.RawMessage, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Second):
			return nil, errors.New("the cancel was missed")
		}
	}
	if err := h.ProcessTask(context.Background(), unitTask(t, "x3")); err != nil {
		t.Fatal(err)
	}
	if o, ok := st.entry(3); ok {
		t.Fatalf("the canceled search's outcome was written: %+v", o)
	}
}

// Shutdown in the middle of a unit writes the items that are done and
// returns a retryable error; the redelivery runs only the rest and counts
// nothing twice.
func TestInterruptedUnitWritesDoneItems(t *testing.T) {
	t.Parallel()
	st := newUnitStore(map[string][]int{"c0": {0, 1, 2}}, map[int]string{0: sample8, 1: sample8b, 2: sampleFill})
	m := worker.NewMetrics(prometheus.NewRegistry())
	h := worker.NewHandler(st, nil, testLimits(), m, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var solved []puzzle.Kind
	*worker.SolveFnOf(h) = func(sctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		solved = append(solved, p.Kind())
		if len(solved) == 2 {
			cancel() // the worker shuts down during the second item
			return nil, sctx.Err()
		}
		return p.Solve(sctx)
	}
	task := unitTask(t, "c0")
	err := h.ProcessTask(ctx, task)
	if err == nil || errors.Is(err, asynq.SkipRetry) || !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted unit returned %v, want a retryable error wrapping context.Canceled", err)
	}
	if o := mustEnd(t, st, 0); o.State != apitype.TaskStateCompleted {
		t.Fatalf("the item done before the shutdown was not written: %+v", o)
	}
	for _, i := range []int{1, 2} {
		if o, ok := st.entry(i); ok {
			t.Fatalf("item %d, not done, was written: %+v", i, o)
		}
	}
	first := mustEnd(t, st, 0)

	solved = nil
	if err := h.ProcessTask(context.Background(), task); err != nil {
		t.Fatal(err)
	}
	if len(solved) != 2 {
		t.Errorf("the redelivery solved %v, want only the two items left", solved)
	}
	for _, i := range []int{1, 2} {
		if o := mustEnd(t, st, i); o.State != apitype.TaskStateCompleted {
			t.Errorf("item %d after the redelivery: %+v", i, o)
		}
	}
	if o := mustEnd(t, st, 0); string(o.Result) != string(first.Result) {
		t.Errorf("item 0 was written again: %+v", o)
	}
	if n := testutil.ToFloat64(m.Tasks.WithLabelValues("sliding", "completed")) +
		testutil.ToFloat64(m.Tasks.WithLabelValues("fill", "completed")); n != 3 {
		t.Errorf("completions counted %v times, want 3", n)
	}
}

// A redelivered unit whose items all ended does nothing but feed.
func TestRedeliveredUnitSkipsEndedItems(t *testing.T) {
	t.Parallel()
	st := newUnitStore(map[string][]int{"c0": {0, 1}}, map[int]string{0: sample8, 1: sample8b})
	h := worker.NewHandler(st, nil, testLimits(), nil, nil)
	solves := 0
	*worker.SolveFnOf(h) = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		solves++
		return p.Solve(ctx)
	}
	st.cancelItem(1)
	for range 3 {
		if err := h.ProcessTask(context.Background(), unitTask(t, "c0")); err != nil {
			t.Fatal(err)
		}
	}
	if solves != 1 || len(st.unitFinishes) != 1 {
		t.Fatalf("three deliveries solved %d times and wrote %d times, want once each", solves, len(st.unitFinishes))
	}
	if o := mustEnd(t, st, 1); o.State != apitype.TaskStateCanceled {
		t.Fatalf("the canceled item became %+v", o)
	}
}

// A solver panic fails its item as internal, not the unit nor the worker.
func TestUnitPanicIsInternal(t *testing.T) {
	t.Parallel()
	st := newUnitStore(map[string][]int{"c0": {0, 1}}, map[int]string{0: sampleFill, 1: sample8})
	h := worker.NewHandler(st, nil, testLimits(), nil, nil)
	*worker.SolveFnOf(h) = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		if p.Kind() == puzzle.KindFill {
			panic("boom")
		}
		return p.Solve(ctx)
	}
	if err := h.ProcessTask(context.Background(), unitTask(t, "c0")); err != nil {
		t.Fatal(err)
	}
	if o := mustEnd(t, st, 0); o.State != apitype.TaskStateFailed || o.Code != apitype.CodeInternal || o.Msg == "" {
		t.Errorf("panicking item ended %+v", o)
	}
	if o := mustEnd(t, st, 1); o.State != apitype.TaskStateCompleted {
		t.Errorf("the next item ended %+v", o)
	}
}

// Outcomes are written every flushEvery, so a long unit shows progress.
func TestUnitFlushesAsItGoes(t *testing.T) {
	t.Parallel()
	st := newUnitStore(map[string][]int{"c0": {0, 1, 2}}, map[int]string{0: sample8, 1: sample8b, 2: sampleFill})
	h := worker.NewHandler(st, nil, testLimits(), nil, nil)
	worker.SetFlushEvery(h, 0)
	if err := h.ProcessTask(context.Background(), unitTask(t, "c0")); err != nil {
		t.Fatal(err)
	}
	if len(st.unitFinishes) != 3 {
		t.Fatalf("with flushEvery 0, 3 items were written in %d calls, want 3", len(st.unitFinishes))
	}
}

// A result that cannot be written fails the unit retryably.
func TestUnitWriteFailureIsRetried(t *testing.T) {
	t.Parallel()
	st := newUnitStore(map[string][]int{"c0": {0}}, map[int]string{0: sample8})
	st.finishErr = errors.New("redis: connection reset")
	feeder := &fakeFeeder{waiting: []tasks.UnitRef{{BatchID: "b", Unit: "c1", Timeout: time.Minute}}}
	h := worker.NewHandler(st, nil, testLimits(), nil, nil)
	h.SetFeed(feeder, 64)
	err := h.ProcessTask(context.Background(), unitTask(t, "c0"))
	if err == nil || errors.Is(err, asynq.SkipRetry) || !errors.Is(err, st.finishErr) {
		t.Fatalf("ProcessTask = %v, want the store's error, retryable", err)
	}
	if len(feeder.calls) != 0 {
		t.Fatalf("a unit that did not finish fed %v", feeder.calls)
	}
}

// After a unit, the worker feeds the bulk queues: it takes units from
// each lane's feed and enqueues them, in one call per lane, its own
// lane's first. (What the store's enqueue makes of a unit asynq holds
// already is the store's TestEnqueueFedOverAsynqStates.)
func TestFeedAfterUnit(t *testing.T) {
	t.Parallel()
	st := newUnitStore(map[string][]int{"c0": {0}}, map[int]string{0: sample8})
	var waiting []tasks.UnitRef
	for _, u := range []string{"c1", "c2", "x9"} {
		waiting = append(waiting, tasks.UnitRef{BatchID: "b", Unit: u, Timeout: 90 * time.Second})
	}
	feeder := &fakeFeeder{waiting: waiting}
	h := worker.NewHandler(st, nil, testLimits(), nil, nil)
	h.SetFeed(feeder, 17)
	if err := h.ProcessTask(context.Background(), unitTask(t, "c0")); err != nil {
		t.Fatal(err)
	}
	if _, ok := st.entry(0); !ok {
		t.Fatal("the unit's item was not written")
	}
	if want := []feedCall{{tasks.QueueCheapBulk, 17, 8}, {tasks.QueueBulk, 17, 8}}; !slices.Equal(feeder.calls, want) {
		t.Fatalf("feed calls %+v, want %+v: the cheap unit's lane first, depth 17, max 8", feeder.calls, want)
	}
	if want := []string{tasks.QueueCheapBulk, tasks.QueueBulk}; !slices.Equal(feeder.queues, want) {
		t.Fatalf("enqueue calls on %v, want %v", feeder.queues, want)
	}
	if fmt.Sprint(feeder.acked) != fmt.Sprint(waiting) {
		t.Fatalf("enqueued and acknowledged %v, want all three fed: %v", feeder.acked, waiting)
	}
}

// A feed that fails does not fail the unit, which is done: the reconciler
// feeds too. A unit whose enqueue failed is not acknowledged, so that the
// reconciler finds it in the feeding set.
func TestFeedErrorDoesNotFailTheUnit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		feedErr   error
		enqFail   map[string]error
		wantAcked int
	}{
		{"feed fails", errors.New("redis: i/o timeout"), nil, 0},
		{"an enqueue fails", nil, map[string]error{"b:c1": errors.New("redis: i/o timeout")}, 1},
	} {
		st := newUnitStore(map[string][]int{"c0": {0}}, map[int]string{0: sample8})
		feeder := &fakeFeeder{feedErr: tc.feedErr, waiting: []tasks.UnitRef{
			{BatchID: "b", Unit: "c1", Timeout: time.Minute}, {BatchID: "b", Unit: "c2", Timeout: time.Minute}}}
		h := worker.NewHandler(st, nil, testLimits(), nil, nil)
		feeder.enqFail = tc.enqFail
		h.SetFeed(feeder, 64)
		if err := h.ProcessTask(context.Background(), unitTask(t, "c0")); err != nil {
			t.Errorf("%s: the unit failed: %v", tc.name, err)
		}
		if o, ok := st.entry(0); !ok || o.State != apitype.TaskStateCompleted {
			t.Errorf("%s: item ended %+v %v", tc.name, o, ok)
		}
		if len(feeder.acked) != tc.wantAcked || (tc.wantAcked == 1 && feeder.acked[0].Unit != "c2") {
			t.Errorf("%s: acked %v, want %d (not the failed one)", tc.name, feeder.acked, tc.wantAcked)
		}
	}
}

// When asynq gives up on a unit (a plain context reports 0 of 0
// retries), its items that have not ended fail as internal, so the batch
// can end; the ones that ended keep their entries.
func TestErrorHandlerFailsTheUnitsOpenItems(t *testing.T) {
	t.Parallel()
	st := newUnitStore(map[string][]int{"c0": {0, 1, 2}}, map[int]string{0: sample8, 1: sample8b, 2: sampleFill})
	st.ended[apitype.ItemID("b", 0)] = worker.ItemOutcome{Index: 0, State: apitype.TaskStateCompleted, Result: json.RawMessage(`1`)}
	h := worker.NewHandler(st, nil, testLimits(), nil, nil)
	h.ErrorHandler()(context.Background(), unitTask(t, "c0"), errors.New("redis: connection refused"))
	if o := mustEnd(t, st, 0); o.State != apitype.TaskStateCompleted {
		t.Errorf("the ended item became %+v", o)
	}
	for _, i := range []int{1, 2} {
		if o := mustEnd(t, st, i); o.State != apitype.TaskStateFailed || o.Code != apitype.CodeInternal {
			t.Errorf("open item %d after the last retry: %+v", i, o)
		}
	}
}
