package api

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/tasks"
)

// fakeBeats is a WatchdogStore whose heartbeats the test sets, for the
// watchdog's judgement alone; re-driving runs on the real store below.
type fakeBeats struct {
	mu     sync.Mutex
	beats  []tasks.WorkerBeat
	err    error
	reaped []string
}

func (f *fakeBeats) AcquireLease(context.Context, string, string, time.Duration) (bool, error) {
	return true, nil
}

func (f *fakeBeats) Workers(context.Context) ([]tasks.WorkerBeat, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]tasks.WorkerBeat(nil), f.beats...), f.err
}

func (f *fakeBeats) Held(context.Context, string) ([]tasks.HeldTask, error) { return nil, nil }

func (f *fakeBeats) Reap(_ context.Context, w string, _ int64) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reaped = append(f.reaped, w)
	return true, nil
}

// TestWatchdogJudgesByWhatItSaw: a worker is dead once its beat stayed
// unchanged for DeadAfter of the watchdog's own uninterrupted view. A
// worker that beats is never dead; a failed read, or a gap between passes
// longer than DeadAfter, starts every count again.
func TestWatchdogJudgesByWhatItSaw(t *testing.T) {
	t.Parallel()
	fs := &fakeBeats{}
	w := NewWatchdog(fs, nil, nil, nil, WatchdogOptions{DeadAfter: 3 * time.Second, Interval: time.Second})
	clock := time.Unix(1000, 0)
	w.now = func() time.Time { return clock }
	pass := func(step time.Duration, wantReaped ...string) {
		t.Helper()
		clock = clock.Add(step)
		fs.mu.Lock()
		fs.reaped = nil
		fs.mu.Unlock()
		_, err := w.RunOnce(context.Background())
		fs.mu.Lock()
		defer fs.mu.Unlock()
		if fs.err == nil && err != nil {
			t.Fatalf("pass at %v: %v", clock.Unix()-1000, err)
		}
		if len(fs.reaped) != len(wantReaped) || (len(wantReaped) == 1 && fs.reaped[0] != wantReaped[0]) {
			t.Fatalf("pass at %ds: reaped %v, want %v", clock.Unix()-1000, fs.reaped, wantReaped)
		}
	}
	// "live" beats every second, "dead" stops at once. The beat times
	// are far from the watchdog's clock: only their changes count.
	dead := true
	set := func(live int64) {
		fs.mu.Lock()
		fs.beats = []tasks.WorkerBeat{{Worker: "live", At: live}}
		if dead {
			fs.beats = append(fs.beats, tasks.WorkerBeat{Worker: "dead", At: 5})
		}
		fs.mu.Unlock()
	}
	set(1)
	pass(0)
	for i := int64(2); i <= 3; i++ {
		set(i)
		pass(time.Second)
	}
	set(4)
	pass(time.Second, "dead") // unchanged for 3 s
	dead = false              // reaped
	set(4)

	// Redis answers nobody for a while: the beats stop changing, but so
	// does the watchdog's view. After it, the count starts again.
	fs.mu.Lock()
	fs.err = errors.New("redis: connection refused")
	fs.mu.Unlock()
	pass(time.Second)
	pass(time.Second)
	fs.mu.Lock()
	fs.err = nil
	fs.mu.Unlock()
	pass(time.Second) // the first view after the outage
	pass(time.Second)
	pass(time.Second) // 2 s unchanged since the view came back
	set(10)
	pass(time.Second) // and then it beats

	// A gap longer than DeadAfter between two passes (this process
	// frozen) is no evidence either.
	pass(10 * time.Second)
	pass(time.Second)
	pass(time.Second)
	pass(time.Second, "live") // now silent for 3 s of continuous view
}

// TestWatchdogRedrivesADeadWorkersTasks, on a real Redis with real asynq
// servers: a "victim" server runs a single task and a batch unit and
// stops beating (as a killed worker would); its tasks stay active in
// asynq, as they would for 60-130 s. The watchdog enqueues a copy of
// each under RedriveID on the interactive queue, with the same payload, retries
// and timeout, reaps the victim, and leaves a beating worker alone. A
// second pass changes nothing.
func TestWatchdogRedrivesADeadWorkersTasks(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	st := store.New(rdb, store.Options{Prefix: "wd:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	ctx := context.Background()
	enq := asynq.NewClientFromRedisClient(rdb)
	insp := asynq.NewInspectorFromRedisClient(rdb)

	// The victim's handler holds every task until the test ends.
	hold := make(chan struct{})
	var started sync.WaitGroup
	started.Add(2)
	victim := tasks.NewHeartbeat(st, "victim", time.Hour, nil) // beats only when told
	if err := victim.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 2,
		Queues: map[string]int{tasks.QueueInteractive: 1, tasks.QueueBulk: 1}, TaskCheckInterval: 5 * time.Millisecond,
		LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.Use(victim.Middleware())
	mux.HandleFunc("solve:", func(ctx context.Context, _ *asynq.Task) error {
		started.Done()
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return errors.New("stopped")
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(hold); srv.Shutdown() })

	single, err := json.Marshal(tasks.SolvePayload{Item: tasks.Item{ID: "s1", Request: json.RawMessage(`{}`)}})
	if err != nil {
		t.Fatal(err)
	}
	unit, err := tasks.NewUnitTask(tasks.UnitRef{BatchID: "b1", Unit: "x3", Timeout: 90 * time.Second}, tasks.QueueBulk)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range []*asynq.Task{
		asynq.NewTask(tasks.TypeSliding, single, asynq.TaskID("s1"), asynq.Queue(tasks.QueueInteractive), asynq.MaxRetry(10), asynq.Timeout(time.Minute)),
		unit,
	} {
		if _, err := enq.EnqueueContext(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	started.Wait()

	// A live worker beats throughout.
	live := tasks.NewHeartbeat(st, "live", 50*time.Millisecond, nil)
	lctx, stopLive := context.WithCancel(ctx)
	defer stopLive()
	go live.Run(lctx)

	w := NewWatchdog(st, insp, enq, nil, WatchdogOptions{DeadAfter: 300 * time.Millisecond, Interval: 50 * time.Millisecond})
	redriven := 0
	deadline := time.Now().Add(10 * time.Second)
	for redriven == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the watchdog re-drove nothing within 10 s")
		}
		time.Sleep(50 * time.Millisecond)
		n, err := w.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		redriven += n
	}
	if redriven != 2 || testutil.ToFloat64(w.redriven) != 2 || testutil.ToFloat64(w.deadWorkers) != 1 {
		t.Fatalf("re-drove %d tasks (counted %v, dead workers %v), want the victim's 2 of 1 dead worker",
			redriven, testutil.ToFloat64(w.redriven), testutil.ToFloat64(w.deadWorkers))
	}
	for _, orig := range []struct{ queue, id string }{{tasks.QueueInteractive, "s1"}, {tasks.QueueBulk, "b1:x3"}} {
		o, err := insp.GetTaskInfo(orig.queue, orig.id)
		if err != nil || o.State != asynq.TaskStateActive {
			t.Fatalf("original %s: %+v %v, want still active", orig.id, o, err)
		}
		c, err := insp.GetTaskInfo(tasks.QueueInteractive, tasks.RedriveID(orig.id, "victim"))
		if err != nil {
			t.Fatalf("copy of %s: %v", orig.id, err)
		}
		if c.State != asynq.TaskStatePending || c.Type != o.Type || string(c.Payload) != string(o.Payload) ||
			c.MaxRetry != o.MaxRetry || c.Timeout != o.Timeout {
			t.Errorf("copy of %s: %+v, want pending with the original's type, payload, retries, timeout (%+v)", orig.id, c, o)
		}
	}
	ws, err := st.Workers(ctx)
	if err != nil || len(ws) != 1 || ws[0].Worker != "live" {
		t.Fatalf("workers after the re-drive: %v %v, want only the live one", ws, err)
	}
	for range 10 {
		time.Sleep(50 * time.Millisecond)
		if n, err := w.RunOnce(ctx); n != 0 || err != nil {
			t.Fatalf("a later pass re-drove %d (%v)", n, err)
		}
	}
	if qi, err := insp.GetQueueInfo(tasks.QueueInteractive); err != nil || qi.Pending != 2 {
		t.Fatalf("%s queue: %+v %v, want the 2 copies pending", tasks.QueueInteractive, qi, err)
	}
}
