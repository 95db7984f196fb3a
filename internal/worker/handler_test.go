package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

type fixture struct {
	store   *store.Store
	handler *worker.Handler
	metrics *worker.Metrics
	cancels *worker.Cancels
	limits  tasks.Limits // the handler's: changing a map entry changes its limits
	// solve is the handler's solve function; tests replace it to provoke
	// failures.
	solve *func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error)
	ctx   context.Context
}

func newFixture(t *testing.T, l tasks.Limits) *fixture {
	t.Helper()
	r := redistest.Start(t)
	st := store.New(r.Client(t), store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	m := worker.NewMetrics(prometheus.NewRegistry())
	c := worker.NewCancels()
	h := worker.NewHandler(st, c, l, m, nil)
	return &fixture{store: st, handler: h, metrics: m, cancels: c, limits: l, solve: worker.SolveFnOf(h), ctx: context.Background()}
}

// testLimits gives every kind a minute, as the binaries' configuration
// gives every kind a deadline; tests about a limit lower one of them.
func testLimits() tasks.Limits {
	l := tasks.Limits{Deadline: map[puzzle.Kind]time.Duration{}, MaxNodes: map[puzzle.Kind]int64{}}
	for _, k := range puzzle.Kinds {
		l.Deadline[k] = time.Minute
	}
	return l
}

func mustParse(t *testing.T, req string) *puzzle.Parsed {
	t.Helper()
	p, err := puzzle.Decode([]byte(req))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// single records and builds a single task, as the API does.
func (f *fixture) single(t *testing.T, id, req string) *asynq.Task {
	t.Helper()
	p := mustParse(t, req)
	// No cache key: the record must reach the worker, whose own cache
	// check some tests exercise.
	if _, _, err := f.store.SubmitTask(f.ctx, store.NewTask{ID: id, Kind: string(p.Kind())}, 0); err != nil {
		t.Fatal(err)
	}
	task, err := tasks.NewSolveTask(id, "", p, tasks.QueueInteractive, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	return task
}

const sample8 = `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`

func TestWorkerUsesCacheBeforeSolving(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testLimits())
	first := f.single(t, "c1", sample8)
	if err := f.handler.ProcessTask(f.ctx, first); err != nil {
		t.Fatal(err)
	}
	calls := 0
	*f.solve = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		calls++
		return p.Solve(ctx)
	}
	if err := f.handler.ProcessTask(f.ctx, f.single(t, "c2", sample8)); err != nil {
		t.Fatal(err)
	}
	tk, _ := f.store.Get(f.ctx, "c2")
	if calls != 0 || !tk.Cached || tk.State != apitype.TaskStateCompleted {
		t.Fatalf("second identical task: solver calls %d, record %+v", calls, tk)
	}
	if n := testutil.ToFloat64(f.metrics.CacheHits); n != 1 {
		t.Fatalf("cache hit metric %v", n)
	}
}

func TestFailuresAreFinalWithCodes(t *testing.T) {
	t.Parallel()
	l := testLimits()
	l.MaxNodes[puzzle.KindSweep] = 5
	f := newFixture(t, l)
	*f.solve = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		switch p.Kind() {
		case puzzle.KindFill:
			panic("boom")
		case puzzle.KindSliding:
			<-ctx.Done() // a solve that outlives its deadline
			return nil, ctx.Err()
		}
		return p.Solve(ctx)
	}
	f.limits.Deadline[puzzle.KindSliding] = 20 * time.Millisecond
	for _, tc := range []struct{ id, req, code string }{
		{"budget", `{"kind":"sweep","puzzle":{"board":["........","........","........"]}}`, apitype.CodeBudgetExceeded},
		{"panic", `{"kind":"fill","puzzle":{"game_board":[[0]],"table":[[1]]}}`, apitype.CodeInternal},
		{"slow", sample8, apitype.CodeTimeout},
	} {
		if err := f.handler.ProcessTask(f.ctx, f.single(t, tc.id, tc.req)); err != nil {
			t.Fatalf("%s: a final failure must not ask asynq to retry: %v", tc.id, err)
		}
		tk, _ := f.store.Get(f.ctx, tc.id)
		if tk.State != apitype.TaskStateFailed || tk.ErrCode != tc.code || tk.ErrMsg == "" {
			t.Errorf("%s: %+v", tc.id, tk)
		}
	}
	// An undecodable request in a payload is invalid_puzzle.
	if _, _, err := f.store.SubmitTask(f.ctx, store.NewTask{ID: "bad", Kind: "sliding"}, 0); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(tasks.SolvePayload{Item: tasks.Item{ID: "bad", Request: json.RawMessage(`{"kind":"sliding","puzzle":{"board":[[9]]}}`)}})
	if err := f.handler.ProcessTask(f.ctx, asynq.NewTask(tasks.TypeSliding, raw)); err != nil {
		t.Fatal(err)
	}
	if tk, _ := f.store.Get(f.ctx, "bad"); tk.ErrCode != apitype.CodeInvalidPuzzle {
		t.Errorf("bad payload: %+v", tk)
	}
	// A payload with no record ID can only be dropped.
	err := f.handler.ProcessTask(f.ctx, asynq.NewTask(tasks.TypeSweep, []byte(`{`)))
	if !errors.Is(err, asynq.SkipRetry) {
		t.Errorf("garbage payload: %v", err)
	}
}

func TestCancelStopsARunningSolve(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testLimits())
	started := make(chan struct{})
	*f.solve = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	task := f.single(t, "run", sample8)
	errc := make(chan error, 1)
	go func() { errc <- f.handler.ProcessTask(f.ctx, task) }()
	<-started
	if prev, err := f.store.Cancel(f.ctx, "run", ""); err != nil || prev != apitype.TaskStateActive {
		t.Fatalf("cancel: %v %v", prev, err)
	}
	at := time.Now()
	f.cancels.Cancel("run") // what the pub/sub listener does
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("a canceled task must end without a retry: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("handler did not stop")
	}
	t.Logf("handler returned %v after the cancel", time.Since(at))
	if tk, _ := f.store.Get(f.ctx, "run"); tk.State != apitype.TaskStateCanceled {
		t.Fatalf("record: %+v", tk)
	}
	if f.cancels.Running() != 0 {
		t.Fatal("cancel registration leaked")
	}
}

// When asynq gives up on a task (retries exhausted; a plain context
// reports 0 of 0 retries), the record must not stay active forever.
func TestErrorHandlerFailsRecordAfterLastRetry(t *testing.T) {
	t.Parallel()
	f := newFixture(t, testLimits())
	task := f.single(t, "gave-up", sample8)
	if _, _, err := f.store.Start(f.ctx, []worker.Transition{{ID: "gave-up"}}, nil); err != nil {
		t.Fatal(err)
	}
	f.handler.ErrorHandler()(f.ctx, task, errors.New("redis: connection refused"))
	tk, _ := f.store.Get(f.ctx, "gave-up")
	if tk.State != apitype.TaskStateFailed || tk.ErrCode != apitype.CodeInternal {
		t.Fatalf("after the last retry: %+v", tk)
	}
}

// An instant single task (a table lookup) runs without Start: its record
// still ends with one attempt and a start time, and one canceled while
// pending stays canceled and is not solved.
func TestInstantSingleSkipsStart(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	st := store.New(r.Client(t), store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	h := worker.NewHandler(st, nil, testLimits(), nil, nil) // the real solver: 8-puzzles are instant
	f := &fixture{store: st, handler: h, ctx: context.Background()}
	for _, tc := range []struct {
		id     string
		cancel bool
		want   apitype.TaskState
	}{
		{"solved", false, apitype.TaskStateCompleted},
		{"canceled", true, apitype.TaskStateCanceled},
	} {
		task := f.single(t, tc.id, sample8)
		if tc.cancel {
			if _, err := st.Cancel(f.ctx, tc.id, ""); err != nil {
				t.Fatal(err)
			}
		}
		if err := h.ProcessTask(f.ctx, task); err != nil {
			t.Fatal(err)
		}
		tk, err := st.Get(f.ctx, tc.id)
		if err != nil || tk.State != tc.want {
			t.Fatalf("%s: %+v %v", tc.id, tk, err)
		}
		if !tc.cancel && (tk.Attempts != 1 || tk.StartedAt.IsZero() || tk.StartedAt.After(tk.CompletedAt) || len(tk.Result) == 0) {
			t.Fatalf("%s: %+v, want one attempt, a start time and the result", tc.id, tk)
		}
		if tc.cancel && (tk.Attempts != 0 || tk.Result != nil) {
			t.Fatalf("%s: a task canceled while pending ran: %+v", tc.id, tk)
		}
	}
}
