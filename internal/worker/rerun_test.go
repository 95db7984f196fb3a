package worker_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestRerunRepairsARolledBackFinish reproduces, on a real redis-server,
// what a failover to a lagging replica does to a task that finished just
// before it: the worker's results are on the old master only, and asynq's
// acknowledgement, made after them, lands on the new one. Here the Redis
// is snapshotted (SAVE) as the victim's run starts, and killed and
// restarted from the snapshot as its handler returns: the acknowledgement
// lands on a Redis where the task is running and its results never
// happened. asynq then holds no task, the record has not ended, and
// nothing would ever run it again; the test checks that state first.
// Changed, which the connection hook calls when it meets the restarted
// server's new run ID, queues a copy that ends it with the right answer.
//
// Straddled is the other side: the change is reported while the victim
// runs, so its delivery returns ErrRedisChanged and asynq runs it again.
func TestRerunRepairsARolledBackFinish(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		unit      bool // the victim is a batch's unit, not a single task
		straddled bool // the change is reported while it runs
	}{
		{name: "Single"},
		{name: "Unit", unit: true},
		{name: "Straddled", straddled: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := redistest.Start(t)
			rdb := r.Client(t)
			f := &unitFixture{rdb: rdb, store: store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour}), ctx: context.Background()}
			h := worker.NewHandler(f.store, nil, testLimits(), nil, nil)
			rr := worker.NewRerun(asynq.NewClientFromRedisClient(rdb), nil, worker.RerunOptions{})
			oldID := runID(t, f)
			var (
				rolled atomic.Bool
				runs   sync.Map // task ID -> *atomic.Int32
			)
			victim := "v1"
			if tc.unit {
				victim = tasks.UnitRef{BatchID: "b1", Unit: "c0"}.TaskID()
			}
			rollback := func(next asynq.Handler) asynq.Handler {
				return asynq.HandlerFunc(func(ctx context.Context, tk *asynq.Task) error {
					id, _ := asynq.GetTaskID(ctx)
					n, _ := runs.LoadOrStore(id, new(atomic.Int32))
					n.(*atomic.Int32).Add(1)
					if id != victim || rolled.Load() {
						return next.ProcessTask(ctx, tk)
					}
					if err := rdb.Save(f.ctx).Err(); err != nil {
						t.Errorf("SAVE: %v", err)
					}
					err := next.ProcessTask(ctx, tk)
					r.Kill()
					if rerr := r.Restart(); rerr != nil {
						t.Errorf("restart: %v", rerr)
					}
					rolled.Store(true)
					if tc.straddled {
						rr.Changed(oldID, runID(t, f))
					}
					return err
				})
			}
			srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
				Concurrency: 2, TaskCheckInterval: 5 * time.Millisecond, DelayedTaskCheckInterval: 50 * time.Millisecond,
				Queues:       map[string]int{tasks.QueueInteractive: 1, tasks.QueueBulk: 1, tasks.QueueCheap: 1, tasks.QueueCheapBulk: 1},
				ErrorHandler: h.ErrorHandler(), LogLevel: asynq.FatalLevel,
				IsFailure:      func(err error) bool { return !errors.Is(err, worker.ErrRedisChanged) },
				RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 10 * time.Millisecond },
			})
			mux := asynq.NewServeMux()
			mux.Use(rr.Middleware(), rollback)
			h.Register(mux)
			if err := srv.Start(mux); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Shutdown)

			if tc.unit {
				f.stage(t, "b1", 4, []string{sample8, sample8})
				if n := f.feedLanes(t, 4, 4); n != 1 {
					t.Fatalf("fed %d units, want 1", n)
				}
			} else {
				f.submitSingle(t, victim, sample8, testLimits())
			}
			ended := func() bool {
				if tc.unit {
					b, err := f.store.GetBatch(f.ctx, "b1")
					return err == nil && b.Done()
				}
				tk, err := f.store.Get(f.ctx, victim)
				return err == nil && tk.State.Terminal()
			}
			waitFor(t, 20*time.Second, "the victim's run and the restart", rolled.Load)
			if !tc.straddled {
				// The rolled-back state: asynq took the acknowledgement,
				// the results are gone.
				insp := asynq.NewInspectorFromRedisClient(rdb)
				queue := tasks.QueueInteractive
				if tc.unit {
					queue = tasks.QueueCheapBulk
				}
				waitFor(t, 20*time.Second, "asynq to let go of the victim after the restart", func() bool {
					_, err := insp.GetTaskInfo(queue, victim)
					return errors.Is(err, asynq.ErrTaskNotFound)
				})
				time.Sleep(300 * time.Millisecond) // anything that would end it on its own has had its chance
				if ended() {
					t.Fatal("the victim ended with no rerun: the snapshot did not take its results back, so this test shows nothing")
				}
				rr.Changed(oldID, runID(t, f))
			}
			waitFor(t, 20*time.Second, "the victim to end", ended)
			rr.Wait()
			want, _ := mustParse(t, sample8).Solve(f.ctx)
			if tc.unit {
				for i := range 2 {
					if it := f.item(t, "b1", i); it.State != apitype.TaskStateCompleted || string(it.Result) != string(want) {
						t.Errorf("item %d: %s %s, want completed %s", i, it.State, it.Result, want)
					}
				}
			} else if tk, _ := f.store.Get(f.ctx, victim); tk.State != apitype.TaskStateCompleted || string(tk.Result) != string(want) {
				t.Errorf("task: %s %s, want completed %s", tk.State, tk.Result, want)
			}
			// It ran twice: first on the Redis that lost it, then as the
			// copy (under its own ID) or, straddled, as asynq's retry.
			again := tasks.RedriveID(victim, "")
			n := 0
			runs.Range(func(k, v any) bool {
				if id := k.(string); id == victim || strings.HasPrefix(id, again) {
					n += int(v.(*atomic.Int32).Load())
				}
				return true
			})
			if n != 2 {
				t.Errorf("the victim ran %d times, want 2", n)
			}
		})
	}
}

// runID is the run ID of f's Redis (INFO server), what tells the
// connection hook that a Redis is another one.
func runID(t *testing.T, f *unitFixture) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := f.rdb.Info(f.ctx, "server").Result()
		if err == nil {
			for line := range strings.Lines(info) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
					return v
				}
			}
			t.Fatalf("no run_id in INFO server")
		}
		if time.Now().After(deadline) {
			t.Fatalf("INFO server: %v", err)
		}
	}
}

// TestRerunRemembersAWindow: Changed copies the solves finished within
// the window before the last one, each once, with its type and payload;
// what finished earlier, a delivery that failed, and what finishes after
// the change are not copied.
func TestRerunRemembersAWindow(t *testing.T) {
	t.Parallel()
	enq := &recordingEnqueuer{}
	rr := worker.NewRerun(enq, nil, worker.RerunOptions{Window: 5 * time.Second})
	clock := time.Unix(1_000_000, 0)
	worker.SetRerunClock(rr, func() time.Time { return clock })
	fail := errors.New("boom")
	h := rr.Middleware()(asynq.HandlerFunc(func(ctx context.Context, tk *asynq.Task) error {
		if string(tk.Payload()) == "failed" {
			return fail
		}
		return nil
	}))
	run := func(payload string, at time.Duration) {
		clock = time.Unix(1_000_000, 0).Add(at)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := h.ProcessTask(ctx, asynq.NewTask("solve:x", []byte(payload)))
		if payload == "failed" && !errors.Is(err, fail) || payload != "failed" && err != nil {
			t.Fatalf("%s: %v", payload, err)
		}
	}
	run("old", 0)
	run("failed", 9*time.Second)
	run("edge", 5*time.Second+500*time.Millisecond)
	run("late1", 9*time.Second)
	run("late2", 10*time.Second+500*time.Millisecond)
	rr.Changed("aaaa", "bbbb")
	run("after", 11*time.Second)
	rr.Wait()
	got := enq.payloads()
	if strings.Join(got, ",") != "edge,late1,late2" {
		t.Errorf("copied %v, want [edge late1 late2]", got)
	}
	for _, tk := range enq.all() {
		if tk.Type() != "solve:x" {
			t.Errorf("copy of type %q", tk.Type())
		}
	}

	// A change long after the last solve copies nothing: those were
	// replicated long before the master died.
	enq2 := &recordingEnqueuer{}
	rr2 := worker.NewRerun(enq2, nil, worker.RerunOptions{})
	worker.SetRerunClock(rr2, func() time.Time { return clock })
	h2 := rr2.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	if err := h2.ProcessTask(context.Background(), asynq.NewTask("solve:x", []byte("idle"))); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Hour)
	rr2.Changed("bbbb", "cccc")
	rr2.Wait()
	if got := enq2.payloads(); len(got) != 0 {
		t.Errorf("a change an hour after the last solve copied %v", got)
	}
}

// TestRerunBounds: past MaxTasks or MaxBytes the oldest solves are
// forgotten first.
func TestRerunBounds(t *testing.T) {
	t.Parallel()
	for _, o := range []worker.RerunOptions{{MaxTasks: 3}, {MaxBytes: 3 * len("task-0")}} {
		enq := &recordingEnqueuer{}
		rr := worker.NewRerun(enq, nil, o)
		h := rr.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
		for i := range 6 {
			if err := h.ProcessTask(context.Background(), asynq.NewTask("solve:x", []byte("task-"+string(rune('0'+i))))); err != nil {
				t.Fatal(err)
			}
		}
		rr.Changed("a", "b")
		rr.Wait()
		if got := strings.Join(enq.payloads(), ","); got != "task-3,task-4,task-5" {
			t.Errorf("%+v: copied %s, want the last three", o, got)
		}
	}
}

// recordingEnqueuer records what it is asked to queue.
type recordingEnqueuer struct {
	mu    sync.Mutex
	tasks []*asynq.Task
}

func (e *recordingEnqueuer) EnqueueContext(_ context.Context, tk *asynq.Task, _ ...asynq.Option) (*asynq.TaskInfo, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tasks = append(e.tasks, tk)
	return &asynq.TaskInfo{}, nil
}

func (e *recordingEnqueuer) all() []*asynq.Task {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*asynq.Task(nil), e.tasks...)
}

func (e *recordingEnqueuer) payloads() []string {
	var out []string
	for _, tk := range e.all() {
		out = append(out, string(tk.Payload()))
	}
	return out
}
