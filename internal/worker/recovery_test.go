package worker_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
	"github.com/puzzleq/puzzleq/tasks"
)

// serveWith runs h on a real asynq server on f's Redis until the test
// ends, serving the solvers' queues and the cheap lane's bulk queue, with
// mws around the handler and overruns
// retried after 10 ms.
func (f *unitFixture) serveWith(t *testing.T, h *worker.Handler, mws ...asynq.MiddlewareFunc) {
	t.Helper()
	srv := asynq.NewServerFromRedisClient(f.rdb, asynq.Config{
		Concurrency: 2, Queues: map[string]int{tasks.QueueBulk: 1, tasks.QueueInteractive: 1, tasks.QueueCheapBulk: 1}, TaskCheckInterval: 5 * time.Millisecond,
		DelayedTaskCheckInterval: 50 * time.Millisecond,
		ErrorHandler:             h.ErrorHandler(), LogLevel: asynq.ErrorLevel,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 10 * time.Millisecond },
	})
	mux := asynq.NewServeMux()
	mux.Use(mws...)
	h.Register(mux)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
}

// waitEnded waits until single task id has ended, and returns it.
func (f *unitFixture) waitEnded(t *testing.T, id string) *store.Task {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		tk, err := f.store.Get(f.ctx, id)
		if err == nil && tk.State.Terminal() {
			return tk
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not ended after 30 s: %+v %v", id, tk, err)
		}
	}
}

// submitSingle records a single task as the API does and enqueues it.
func (f *unitFixture) submitSingle(t *testing.T, id, req string, l tasks.Limits) {
	t.Helper()
	p := mustParse(t, req)
	if _, _, err := f.store.SubmitTask(f.ctx, store.NewTask{ID: id, Kind: string(p.Kind())}, 0); err != nil {
		t.Fatal(err)
	}
	task, err := tasks.NewSolveTask(id, "", p, tasks.QueueInteractive, l)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := asynq.NewClientFromRedisClient(f.rdb).EnqueueContext(f.ctx, task); err != nil {
		t.Fatal(err)
	}
}

// solveFn is the handler's solve function, as worker.SolveFnOf sets it.
type solveFn = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error)

// servedHandler is what the tests of this file run on: a handler with
// limits l on a Redis of its own, its solves done by solve, served by a
// real asynq server (serveWith) until the test ends. prep, if not nil,
// runs on the fixture and the handler before the server starts, and
// returns the middlewares to serve the handler with.
func servedHandler(t *testing.T, l tasks.Limits, solve solveFn, prep func(*unitFixture, *worker.Handler) []asynq.MiddlewareFunc) (*unitFixture, *worker.Handler) {
	t.Helper()
	f := newUnitFixture(t)
	h := worker.NewHandler(f.store, nil, l, nil, nil)
	*worker.SolveFnOf(h) = solve
	var mws []asynq.MiddlewareFunc
	if prep != nil {
		mws = prep(f, h)
	}
	f.serveWith(t, h, mws...)
	return f, h
}

// overrunLimits are testLimits with a 50 ms deadline for sliding
// puzzles, which a stalled solve overruns, and DeadlineAttempts 3.
func overrunLimits() tasks.Limits {
	l := testLimits()
	l.DeadlineAttempts = 3
	l.Deadline[puzzle.KindSliding] = 50 * time.Millisecond
	return l
}

// stall waits out the solve's deadline, as a worker frozen mid solve.
func stall(ctx context.Context) (json.RawMessage, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// solveCounts counts the solves of each request.
type solveCounts struct {
	mu sync.Mutex
	n  map[string]int // request -> solves
}

// add counts one more solve of p and returns how many there were.
func (c *solveCounts) add(p *puzzle.Parsed) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[string(p.Payload())]++
	return c.n[string(p.Payload())]
}

// of returns how many solves of request req there were.
func (c *solveCounts) of(t *testing.T, req string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[string(mustParse(t, req).Payload())]
}

func (c *solveCounts) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.n)
}

// A solve that overruns its wall-clock deadline is retried, and final
// (timeout) only on the last of DeadlineAttempts deliveries; the node
// budget fails at once. A unit writes what it finished before the
// overrun and runs the rest again.
func TestDeadlineOverrunIsRetried(t *testing.T) {
	t.Parallel()
	l := overrunLimits()
	var calls solveCounts
	is := func(p *puzzle.Parsed, req string) bool {
		return string(p.Payload()) == string(mustParse(t, req).Payload())
	}
	// "frozen" overruns once (a worker stopped mid solve), "slow" every
	// time, "huge" hits its node budget; the rest solve.
	f, h := servedHandler(t, l, func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		n := calls.add(p)
		switch {
		case is(p, sample8) && n == 1, is(p, sample8b):
			return stall(ctx)
		case p.Kind() == puzzle.KindSweep:
			return nil, solvers.ErrBudgetExceeded
		}
		return p.Solve(context.WithoutCancel(ctx))
	}, nil)

	f.submitSingle(t, "frozen", sample8, l)
	f.submitSingle(t, "slow", sample8b, l)
	f.submitSingle(t, "huge", sampleSweep, l)
	want, _ := mustParse(t, sample8).Solve(f.ctx)
	if tk := f.waitEnded(t, "frozen"); tk.State != apitype.TaskStateCompleted || string(tk.Result) != string(want) || tk.Attempts != 2 {
		t.Errorf("overran once: %+v %s, want completed on the 2nd attempt with %s", tk, tk.Result, want)
	}
	if tk := f.waitEnded(t, "slow"); tk.State != apitype.TaskStateFailed || tk.ErrCode != apitype.CodeTimeout || tk.Attempts != 3 {
		t.Errorf("overran every time: %+v, want failed timeout after 3 attempts", tk)
	}
	if tk := f.waitEnded(t, "huge"); tk.State != apitype.TaskStateFailed || tk.ErrCode != apitype.CodeBudgetExceeded || tk.Attempts != 1 {
		t.Errorf("over budget: %+v, want failed budget_exceeded at once", tk)
	}

	// A unit of three cheap items whose second overruns once: the first is
	// written by the first delivery and not solved again.
	calls.reset()
	reqs := []string{sample8b, sample8, sampleFill}
	// Here sample8b solves; sample8 (item 1) overruns on its first solve.
	*worker.SolveFnOf(h) = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		if n := calls.add(p); is(p, sample8) && n == 1 {
			return stall(ctx)
		}
		return p.Solve(context.WithoutCancel(ctx))
	}
	f.stage(t, "u1", 4, reqs)
	if n, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueCheapBulk, 4, 4); err != nil || n != 1 {
		t.Fatalf("feed: %d %v", n, err)
	}
	b := f.waitDone(t, "u1")
	if b.Counts[apitype.TaskStateCompleted] != 3 {
		t.Fatalf("unit counts %v, want 3 completed", b.Counts)
	}
	if first := calls.of(t, sample8b); first != 1 {
		t.Errorf("the item finished before the overrun was solved %d times, want 1", first)
	}
	for i, r := range reqs {
		want, _ := mustParse(t, r).Solve(f.ctx)
		if tk := f.item(t, "u1", i); tk.State != apitype.TaskStateCompleted || string(tk.Result) != string(want) {
			t.Errorf("item %d: %+v %s, want %s", i, tk, tk.Result, want)
		}
	}
}

// An expensive single task runs through the gate (one solve per puzzle,
// a cap per key); an overrun there is retried the same way, and the
// retry takes the solve over.
func TestDeadlineOverrunIsRetriedThroughTheGate(t *testing.T) {
	t.Parallel()
	l := overrunLimits()
	var calls atomic.Int32
	f, _ := servedHandler(t, l, func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		if calls.Add(1) == 1 {
			return stall(ctx) // the worker froze mid solve
		}
		return json.RawMessage(`{"solvable":true,"moves":1}`), nil
	}, func(f *unitFixture, h *worker.Handler) []asynq.MiddlewareFunc {
		h.SetGate(f.store, func() int { return 1 })
		return nil
	})
	f.submitSingle(t, "big", board15b, l)
	if tk := f.waitEnded(t, "big"); tk.State != apitype.TaskStateCompleted || string(tk.Result) != `{"solvable":true,"moves":1}` || calls.Load() != 2 {
		t.Errorf("expensive task that overran once: %+v %s after %d solves, want completed on the second", tk, tk.Result, calls.Load())
	}
}

// The heartbeat middleware records each task while it runs, by queue and
// asynq task ID (written behind the task, within a bound), and the next
// beat forgets it once it ended.
func TestHeartbeatRecordsRunningTasks(t *testing.T) {
	t.Parallel()
	l := testLimits()
	release := make(chan struct{})
	var started atomic.Int32
	var hb *worker.Heartbeat
	f, _ := servedHandler(t, l, func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		started.Add(1)
		<-release
		return p.Solve(ctx)
	}, func(f *unitFixture, _ *worker.Handler) []asynq.MiddlewareFunc {
		hb = worker.NewHeartbeat(f.store, "w-test", time.Hour, nil) // beats only when told
		if err := hb.Beat(f.ctx); err != nil {
			t.Fatal(err)
		}
		return []asynq.MiddlewareFunc{hb.Middleware()}
	})
	f.submitSingle(t, "run1", sample8, l)
	for deadline := time.Now().Add(10 * time.Second); started.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the task never started")
		}
	}
	// The record is written behind the task, holdDelay (5 ms) after it
	// started; the bound is the default HEARTBEAT_INTERVAL, by which the
	// beat would have written it.
	var held []worker.HeldTask
	var err error
	for deadline := time.Now().Add(500 * time.Millisecond); ; time.Sleep(time.Millisecond) {
		held, err = f.store.Held(f.ctx, "w-test")
		if err != nil || len(held) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || len(held) != 1 || held[0] != (worker.HeldTask{Queue: tasks.QueueInteractive, ID: "run1"}) || hb.Running() != 1 {
		t.Fatalf("held while running: %v %v (running %d), want it within 500 ms of the start", held, err, hb.Running())
	}
	close(release)
	if tk := f.waitEnded(t, "run1"); tk.State != apitype.TaskStateCompleted {
		t.Fatalf("record %+v", tk)
	}
	for deadline := time.Now().Add(10 * time.Second); hb.Running() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the middleware still counts the task")
		}
	}
	if held, _ := f.store.Held(f.ctx, "w-test"); len(held) != 1 {
		t.Fatalf("held before the next beat: %v, want the ended task until then", held)
	}
	if err := hb.Beat(f.ctx); err != nil {
		t.Fatal(err)
	}
	if held, _ := f.store.Held(f.ctx, "w-test"); len(held) != 0 {
		t.Fatalf("held after a beat: %v", held)
	}
	if err := hb.Leave(f.ctx); err != nil {
		t.Fatal(err)
	}
	if ws, err := f.store.Workers(f.ctx); err != nil || len(ws) != 0 {
		t.Fatalf("workers after leaving: %v %v", ws, err)
	}
}
