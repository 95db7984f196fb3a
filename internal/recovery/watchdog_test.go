package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// fakeBeats is a WatchdogStore whose heartbeats the test sets, for the
// watchdog's judgement alone; re-driving runs on the real store below.
type fakeBeats struct {
	mu     sync.Mutex
	beats  []worker.WorkerBeat
	err    error
	reaped []string
}

func (f *fakeBeats) AcquireLease(context.Context, string, string, time.Duration) (bool, error) {
	return true, nil
}

func (f *fakeBeats) Workers(context.Context) ([]worker.WorkerBeat, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]worker.WorkerBeat(nil), f.beats...), f.err
}

func (f *fakeBeats) Held(context.Context, string) ([]worker.HeldTask, error) { return nil, nil }

func (f *fakeBeats) HeldByAll(context.Context, []string) ([]worker.HeldTask, error) { return nil, nil }

func (f *fakeBeats) Active(context.Context, []string) ([]asynqdata.ActiveTask, error) {
	return nil, nil
}

func (f *fakeBeats) MarkRedriven(context.Context, []worker.HeldTask, time.Time, time.Duration) error {
	return nil
}

func (f *fakeBeats) Redriven(_ context.Context, ts []worker.HeldTask, _ time.Time) ([]bool, error) {
	return make([]bool, len(ts)), nil
}

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
		fs.beats = []worker.WorkerBeat{{Worker: "live", At: live}}
		if dead {
			fs.beats = append(fs.beats, worker.WorkerBeat{Worker: "dead", At: 5})
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
	victim := worker.NewHeartbeat(st, "victim", time.Hour, nil) // beats only when told
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
	live := worker.NewHeartbeat(st, "live", 50*time.Millisecond, nil)
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
	// The reaped worker's originals, still active and named by no one,
	// are marked copied: the orphan watch leaves them alone.
	if n := testutil.ToFloat64(w.orphaned); n != 0 {
		t.Fatalf("the watchdog took %v of the dead worker's copied originals for orphans", n)
	}
}

// stalledDequeue does to queue's oldest pending task what asynq's dequeue
// script does (RPOPLPUSH pending active, state active, a lease), as Redis
// runs it after a stall when the worker that sent it has given up on it:
// the task is running in asynq's eyes and no worker runs it. It returns
// the task's ID.
func stalledDequeue(t *testing.T, rdb redis.Cmdable, queue string, lease time.Time) string {
	t.Helper()
	ctx := context.Background()
	id, err := rdb.RPopLPush(ctx, asynqdata.PendingKey(queue), asynqdata.ActiveKey(queue)).Result()
	if err != nil {
		t.Fatal(err)
	}
	rdb.HSet(ctx, asynqdata.TaskKey(queue, id), "state", "active")
	rdb.HDel(ctx, asynqdata.TaskKey(queue, id), "pending_since")
	if err := rdb.ZAdd(ctx, asynqdata.LeaseKey(queue), redis.Z{Score: float64(lease.Unix()), Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestWatchdogRedrivesOrphans, on a real Redis with a real asynq server:
// a single task and a batch unit that a stalled dequeue left running in
// asynq's eyes with no worker running them, and a task whose live worker
// still names it past its lease, are each re-driven once, as a dead
// worker's task is, after DeadAfter of the watchdog's view and not
// before; a long task that a live worker runs is never touched; a later
// pass, and a second watchdog (another API replica) on the same Redis,
// copy nothing again.
func TestWatchdogRedrivesOrphans(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	st := store.New(rdb, store.Options{Prefix: "wo:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	ctx := context.Background()
	enq := asynq.NewClientFromRedisClient(rdb)
	insp := asynq.NewInspectorFromRedisClient(rdb)

	// A live worker runs a long webhook delivery under its heartbeat.
	hold := make(chan struct{})
	started := make(chan struct{}, 1)
	live := worker.NewHeartbeat(st, "live", 50*time.Millisecond, nil)
	lctx, stopLive := context.WithCancel(ctx)
	defer stopLive()
	go live.Run(lctx)
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1,
		Queues: map[string]int{tasks.QueueWebhooks: 1}, TaskCheckInterval: 5 * time.Millisecond, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.Use(live.Middleware())
	mux.HandleFunc(tasks.TypeWebhook, func(ctx context.Context, _ *asynq.Task) error {
		started <- struct{}{}
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return nil
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(hold); srv.Shutdown() })
	if _, err := enq.EnqueueContext(ctx, asynq.NewTask(tasks.TypeWebhook, []byte(`{}`), asynq.TaskID("wh1"), asynq.Queue(tasks.QueueWebhooks))); err != nil {
		t.Fatal(err)
	}
	<-started

	// The orphans: nobody serves interactive or bulk here.
	single, err := json.Marshal(tasks.SolvePayload{Item: tasks.Item{ID: "s1", Request: json.RawMessage(`{}`)}})
	if err != nil {
		t.Fatal(err)
	}
	unit, err := tasks.NewUnitTask(tasks.UnitRef{BatchID: "b1", Unit: "x0", Timeout: 90 * time.Second}, tasks.QueueBulk)
	if err != nil {
		t.Fatal(err)
	}
	stuck := asynq.NewTask(tasks.TypeSliding, single, asynq.TaskID("s2"), asynq.Queue(tasks.QueueInteractive), asynq.MaxRetry(10), asynq.Timeout(time.Minute))
	for _, tk := range []*asynq.Task{
		asynq.NewTask(tasks.TypeSliding, single, asynq.TaskID("s1"), asynq.Queue(tasks.QueueInteractive), asynq.MaxRetry(10), asynq.Timeout(time.Minute)),
		unit,
	} {
		if _, err := enq.EnqueueContext(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	lease := time.Now().Add(30 * time.Second) // asynq's, from the dequeue
	s1 := stalledDequeue(t, rdb, tasks.QueueInteractive, lease)
	u1 := stalledDequeue(t, rdb, tasks.QueueBulk, lease)
	// A task a live worker's record names, past its lease: asynq's server
	// gave it up (a handler that outlived its lease).
	if _, err := enq.EnqueueContext(ctx, stuck); err != nil {
		t.Fatal(err)
	}
	s2 := stalledDequeue(t, rdb, tasks.QueueInteractive, time.Now().Add(-time.Second))
	if err := st.Hold(ctx, "live", map[string]worker.HeldTask{"zz": {Queue: tasks.QueueInteractive, ID: s2}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct{ q, id string }{{tasks.QueueInteractive, s1}, {tasks.QueueBulk, u1}, {tasks.QueueInteractive, s2}} {
		if ti, err := insp.GetTaskInfo(o.q, o.id); err != nil || ti.State != asynq.TaskStateActive {
			t.Fatalf("precondition: %s is %+v %v, want active in asynq's eyes", o.id, ti, err)
		}
	}

	const deadAfter = 300 * time.Millisecond
	w := NewWatchdog(st, insp, enq, nil, WatchdogOptions{DeadAfter: deadAfter, Interval: 50 * time.Millisecond})
	w2 := NewWatchdog(st, insp, enq, nil, WatchdogOptions{DeadAfter: deadAfter, Interval: 50 * time.Millisecond})
	first := time.Now()
	redriven := 0
	var at time.Duration
	for redriven == 0 {
		if time.Since(first) > 10*time.Second {
			t.Fatal("the watchdog re-drove no orphan within 10 s")
		}
		n, err := w.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		redriven, at = n, time.Since(first)
		time.Sleep(50 * time.Millisecond)
	}
	if at < deadAfter {
		t.Errorf("re-drove orphans %v after its first view, before DeadAfter %v", at, deadAfter)
	}
	if redriven != 3 || testutil.ToFloat64(w.orphaned) != 3 || testutil.ToFloat64(w.deadWorkers) != 0 {
		t.Fatalf("re-drove %d (orphans counted %v, dead workers %v), want the 3 orphans and no dead worker",
			redriven, testutil.ToFloat64(w.orphaned), testutil.ToFloat64(w.deadWorkers))
	}
	for _, o := range []struct{ q, id string }{{tasks.QueueInteractive, s1}, {tasks.QueueBulk, u1}, {tasks.QueueInteractive, s2}} {
		orig, err := insp.GetTaskInfo(o.q, o.id)
		if err != nil {
			t.Fatal(err)
		}
		c, err := insp.GetTaskInfo(tasks.QueueInteractive, tasks.RedriveID(o.id, orphanTag))
		if err != nil {
			t.Fatalf("copy of %s: %v", o.id, err)
		}
		if c.State != asynq.TaskStatePending || c.Type != orig.Type || string(c.Payload) != string(orig.Payload) ||
			c.MaxRetry != orig.MaxRetry || c.Timeout != orig.Timeout {
			t.Errorf("copy of %s: %+v, want pending with the original's type, payload, retries, timeout (%+v)", o.id, c, orig)
		}
	}
	// The live worker's delivery is untouched, and nothing is copied
	// twice, by this watchdog or another replica's, over 3 DeadAfters.
	for range 20 {
		time.Sleep(50 * time.Millisecond)
		for _, wd := range []*Watchdog{w, w2} {
			if n, err := wd.RunOnce(ctx); n != 0 || err != nil {
				t.Fatalf("a later pass re-drove %d (%v)", n, err)
			}
		}
	}
	if ti, err := insp.GetTaskInfo(tasks.QueueWebhooks, "wh1"); err != nil || ti.State != asynq.TaskStateActive {
		t.Fatalf("the live worker's delivery: %+v %v, want still active", ti, err)
	}
	if qi, err := insp.GetQueueInfo(tasks.QueueInteractive); err != nil || qi.Pending != 3 {
		t.Fatalf("%s queue: %+v %v, want the 3 copies pending", tasks.QueueInteractive, qi, err)
	}
	if qi, err := insp.GetQueueInfo(tasks.QueueWebhooks); err != nil || qi.Pending != 0 {
		t.Fatalf("%s queue: %+v %v, want no copy of the live delivery", tasks.QueueWebhooks, qi, err)
	}
}

// TestWatchdogOrphanWaitsOutAGap: a task listed as running and named by
// no worker is not re-driven on the strength of a view with a gap (a
// failed read, or passes further apart than DeadAfter/2, as when Redis
// or this process stalled): its count starts again after it.
func TestWatchdogOrphanWaitsOutAGap(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	st := store.New(rdb, store.Options{Prefix: "wg:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	ctx := context.Background()
	enq := asynq.NewClientFromRedisClient(rdb)
	single, err := json.Marshal(tasks.SolvePayload{Item: tasks.Item{ID: "g1", Request: json.RawMessage(`{}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enq.EnqueueContext(ctx, asynq.NewTask(tasks.TypeSliding, single, asynq.TaskID("g1"), asynq.Queue(tasks.QueueInteractive))); err != nil {
		t.Fatal(err)
	}
	stalledDequeue(t, rdb, tasks.QueueInteractive, time.Now().Add(30*time.Second))
	w := NewWatchdog(st, asynq.NewInspectorFromRedisClient(rdb), enq, nil, WatchdogOptions{DeadAfter: 3 * time.Second, Interval: time.Second})
	clock := time.Now()
	w.now = func() time.Time { return clock }
	pass := func(step time.Duration, want int) {
		t.Helper()
		clock = clock.Add(step)
		if n, err := w.RunOnce(ctx); n != want || err != nil {
			t.Fatalf("pass at +%v: re-drove %d (%v), want %d", step, n, err, want)
		}
	}
	pass(0, 0)
	pass(time.Second, 0)
	pass(time.Second, 0)
	pass(5*time.Second, 0) // a gap: the view starts again here
	pass(time.Second, 0)
	pass(time.Second, 0)
	pass(time.Second, 1) // DeadAfter of uninterrupted view
}
