package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// The gate on the real store: identical expensive singles share one solve,
// canceling one of them leaves the others their answer, and a key over
// its cap waits.

const (
	board15  = `{"kind":"sliding","puzzle":{"board":[[0,12,9,13],[15,11,10,14],[3,7,2,5],[4,8,6,1]]}}`
	board15b = `{"kind":"sliding","puzzle":{"board":[[1,2,3,4],[5,6,7,8],[9,10,11,12],[13,14,0,15]]}}`
)

// blockingSolve replaces f's solver with one that counts its calls and
// answers only once release is closed (or fails when its context ends).
func (f *fixture) blockingSolve() (calls *atomic.Int32, release chan struct{}) {
	calls, release = &atomic.Int32{}, make(chan struct{})
	*f.solve = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		calls.Add(1)
		select {
		case <-release:
			return json.RawMessage(`{"solvable":true,"moves":80}`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return calls, release
}

// singleOf records a single task of owner, as the API does, and builds
// its asynq task.
func (f *fixture) singleOf(t *testing.T, id, owner, req string) *asynq.Task {
	t.Helper()
	p := mustParse(t, req)
	if _, _, err := f.store.SubmitTask(f.ctx, store.NewTask{ID: id, Kind: string(p.Kind()), Owner: owner, CacheKey: p.Key()}, 0); err != nil {
		t.Fatal(err)
	}
	task, err := tasks.NewSolveTask(id, owner, p, tasks.QueueInteractive, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	return task
}

func (f *fixture) waitState(t *testing.T, id string, want apitype.TaskState) *store.Task {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		tk, err := f.store.Get(f.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if tk.State == want {
			return tk
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is %s after 10 s, want %s", id, tk.State, want)
		}
	}
}

// run processes task in the background; the returned channel gets its
// error.
func (f *fixture) run(task *asynq.Task) <-chan error {
	done := make(chan error, 1)
	go func() { done <- f.handler.ProcessTask(f.ctx, task) }()
	return done
}

func TestGateOneSolvePerPuzzle(t *testing.T) {
	f := newFixture(t, testLimits())
	f.handler.SetGate(f.store, func() int { return 1 })
	calls, release := f.blockingSolve()

	lead := f.run(f.singleOf(t, "a", "k1", board15))
	f.waitState(t, "a", apitype.TaskStateActive)
	// Identical tasks of the same key and another join: their deliveries
	// end at once, holding no slot (the cap of 1 is the lead's).
	for _, id := range []string{"b", "c"} {
		owner := map[string]string{"b": "k1", "c": "k2"}[id]
		if err := f.handler.ProcessTask(f.ctx, f.singleOf(t, id, owner, board15)); err != nil {
			t.Fatalf("joining %s: %v", id, err)
		}
	}
	// A different expensive puzzle of k1 is over the cap: it waits.
	err := f.handler.ProcessTask(f.ctx, f.singleOf(t, "d", "k1", board15b))
	if d, ok := worker.IsWait(err); !ok || d < time.Second || d > 3*time.Second {
		t.Fatalf("over the cap: %v (wait %v), want a wait of 1-3 s", err, d)
	}
	if st, _ := f.store.Get(f.ctx, "d"); st.State != apitype.TaskStatePending {
		t.Errorf("waiting d is %s, want pending", st.State)
	}
	close(release)
	if err := <-lead; err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if st := f.waitState(t, id, apitype.TaskStateCompleted); string(st.Result) != `{"solvable":true,"moves":80}` {
			t.Errorf("%s: result %s", id, st.Result)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d solves for three identical tasks, want 1", n)
	}
	if n := testutil.ToFloat64(f.metrics.Joins); n != 2 {
		t.Errorf("puzzleq_solve_joins_total %v, want 2", n)
	}
	if n := testutil.ToFloat64(f.metrics.Tasks.WithLabelValues("sliding", "completed")); n != 3 {
		t.Errorf("puzzleq_tasks_total %v, want 3", n)
	}
	// The slot is free again: d runs (its answer now comes from its own
	// solve, which the new release lets through at once).
	if err := f.handler.ProcessTask(f.ctx, f.singleOf(t, "d2", "k1", board15b)); err != nil {
		t.Fatalf("after the slot freed: %v", err)
	}
	f.waitState(t, "d2", apitype.TaskStateCompleted)
}

func TestGateCancelOneOfJoined(t *testing.T) {
	f := newFixture(t, testLimits())
	f.handler.SetGate(f.store, func() int { return 0 })
	lctx, stop := context.WithCancel(f.ctx)
	defer stop()
	probes := make(chan string, 100)
	go f.store.ListenCancels(lctx, func(id string) {
		if strings.HasPrefix(id, "probe-") {
			probes <- id
			return
		}
		f.cancels.Cancel(id)
	})
	// The subscription is live once the cancel of an active task without
	// a solve comes back through it.
	for i := 0; ; i++ {
		id := fmt.Sprintf("probe-%d", i)
		if _, _, err := f.store.SubmitTask(f.ctx, store.NewTask{ID: id, Kind: "sliding"}, 0); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.store.Start(f.ctx, []worker.Transition{{ID: id}}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Cancel(f.ctx, id, ""); err != nil {
			t.Fatal(err)
		}
		select {
		case <-probes:
		case <-time.After(50 * time.Millisecond):
			if i < 100 {
				continue
			}
			t.Fatal("the cancel subscription never became live")
		}
		break
	}
	calls, release := f.blockingSolve()

	lead := f.run(f.singleOf(t, "a", "k1", board15))
	f.waitState(t, "a", apitype.TaskStateActive)
	if err := f.handler.ProcessTask(f.ctx, f.singleOf(t, "b", "k2", board15)); err != nil {
		t.Fatal(err)
	}
	// Canceling the task whose run solves does not stop the solve: b
	// still waits on it.
	if _, err := f.store.Cancel(f.ctx, "a", "k1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-lead:
		t.Fatalf("the solve stopped when one of its two tasks was canceled: %v", err)
	default:
	}
	close(release)
	if err := <-lead; err != nil {
		t.Fatal(err)
	}
	f.waitState(t, "b", apitype.TaskStateCompleted)
	f.waitState(t, "a", apitype.TaskStateCanceled)

	// Canceling the last task waiting stops the solve and frees the slot.
	calls, _ = f.blockingSolve()
	lead = f.run(f.singleOf(t, "c", "k1", board15b))
	f.waitState(t, "c", apitype.TaskStateActive)
	if _, err := f.store.Cancel(f.ctx, "c", "k1"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lead:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("canceling the only task did not stop its solve")
	}
	if n, err := f.store.Running(f.ctx, "k1"); err != nil || n != 0 {
		t.Errorf("k1 holds %d slots after its canceled solve (%v)", n, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d solves, want 1", n)
	}
}
