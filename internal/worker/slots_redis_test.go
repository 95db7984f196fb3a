package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// The per-key cap on expensive work covers batch items, and it is work
// conserving: a run that frees a slot hands it to its key's next parked
// run at once. These tests run a real asynq server whose retry delay for
// a parked run is an hour, so work that ends at all ended by promotion.

// sweeps returns n distinct small sweep boards (n <= 15): searches that
// count as expensive, as every sweep does, but end in microseconds and
// need no pattern database, so a loaded machine runs them quickly.
func sweeps(t *testing.T, n int) []string {
	t.Helper()
	if n > 15 {
		t.Fatalf("sweeps: at most 15 boards, asked for %d", n)
	}
	out := make([]string, n)
	for i := range n {
		rows := []string{".....", ".....", "....."}
		r := []byte(rows[i/5])
		r[i%5] = '*'
		rows[i/5] = string(r)
		out[i] = `{"kind":"sweep","puzzle":{"board":["` + strings.Join(rows, `","`) + `"]}}`
	}
	return out
}

// slotServer runs h on a real asynq server of concurrency n on f's Redis,
// configured as the worker binary is except that a WaitError waits an
// hour: only a promotion brings a parked run back within a test.
// enqueueSingle records single task id of owner as the API does and
// enqueues its asynq task (ID id) on the interactive queue with opts; it
// returns the parsed puzzle, for the run's solve and cache keys.
func (f *unitFixture) enqueueSingle(t *testing.T, client *asynq.Client, id, owner, req string, opts ...asynq.Option) *puzzle.Parsed {
	t.Helper()
	p := mustParse(t, req)
	if _, _, err := f.store.SubmitTask(f.ctx, store.NewTask{ID: id, Kind: string(p.Kind()), Owner: owner, CacheKey: p.Key()}, 0); err != nil {
		t.Fatal(err)
	}
	task, err := tasks.NewSolveTask(id, owner, p, tasks.QueueInteractive, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(task, append([]asynq.Option{asynq.TaskID(id)}, opts...)...); err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *unitFixture) slotServer(t *testing.T, h *worker.Handler, n int) {
	t.Helper()
	f.slotServerWith(t, h, n)
}

// slotServerWith is slotServer with mws around h, as the worker binary
// puts its heartbeat's middleware.
func (f *unitFixture) slotServerWith(t *testing.T, h *worker.Handler, n int, mws ...asynq.MiddlewareFunc) {
	t.Helper()
	srv := asynq.NewServerFromRedisClient(f.rdb, asynq.Config{
		Concurrency: n, Queues: map[string]int{tasks.QueueBulk: 1, tasks.QueueInteractive: 1},
		TaskCheckInterval: 5 * time.Millisecond, ErrorHandler: h.ErrorHandler(), LogLevel: asynq.ErrorLevel,
		IsFailure:      func(err error) bool { _, wait := worker.IsWait(err); return !wait },
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour },
	})
	mux := asynq.NewServeMux()
	mux.Use(mws...)
	h.Register(mux)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
}

// stageOwned stages and commits batch id of reqs for owner, one chunk of
// stride items, expensive items in their own units, as the API does.
func (f *unitFixture) stageOwned(t *testing.T, id, owner string, reqs []string) {
	t.Helper()
	w := f.store.NewBatchWriter(id, len(reqs))
	for _, r := range reqs {
		p := mustParse(t, r)
		if err := w.Add(f.ctx, store.StagedItem{Kind: p.Kind(), Request: p.Payload(), Own: !p.Cheap(), Timeout: time.Minute}); err != nil {
			t.Fatalf("stage %s: %v", id, err)
		}
	}
	if err := w.Close(f.ctx); err != nil {
		t.Fatalf("stage %s: %v", id, err)
	}
	if err := f.store.CommitBatch(f.ctx, w, store.CommitBatch{ID: id, Owner: owner}); err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
}

// concurrency wraps h's solve so that it records the most solves running
// at once and takes at least d each, so that runs overlap.
func concurrency(h *worker.Handler, d time.Duration) (most *atomic.Int32) {
	solve := worker.SolveFnOf(h)
	orig := *solve
	var (
		mu        sync.Mutex
		cur, peak int32
	)
	most = &atomic.Int32{}
	*solve = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		mu.Lock()
		cur++
		peak = max(peak, cur)
		most.Store(peak)
		mu.Unlock()
		defer func() { mu.Lock(); cur--; mu.Unlock() }()
		time.Sleep(d)
		return orig(ctx, p)
	}
	return most
}

// One key's batch of searches runs one at a time under a cap of 1 on a
// worker of four slots, every item ends (each parked one by promotion,
// since the retry delay is an hour), and nothing is left parked or
// holding a slot.
func TestBatchSearchesShareTheKeysSlots(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	const n = 12
	m := worker.NewMetrics(prometheus.NewRegistry())
	h := worker.NewHandler(f.store, nil, testLimits(), m, nil)
	h.SetGate(f.store, func() int { return 1 })
	h.SetFeed(f.store, n)
	most := concurrency(h, 50*time.Millisecond)

	reqs := sweeps(t, n)
	f.stageOwned(t, "b1", "k1", reqs)
	if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, n, n); err != nil {
		t.Fatal(err)
	}
	f.slotServer(t, h, 4)
	b := f.waitDone(t, "b1")

	if got := b.Counts[apitype.TaskStateCompleted]; got != n {
		t.Fatalf("completed %d of %d: %v", got, n, b.Counts)
	}
	for i := range n {
		if it := f.item(t, "b1", i); it.State != apitype.TaskStateCompleted || len(it.Result) == 0 {
			t.Fatalf("item %d: %s %s", i, it.State, it.Result)
		}
	}
	if got := most.Load(); got != 1 {
		t.Errorf("%d searches of one key ran at once under a cap of 1", got)
	}
	if w := testutil.ToFloat64(m.Waits); w == 0 {
		t.Error("no item waited: the test did not exercise the cap")
	}
	for name, count := range map[string]func(context.Context, string) (int, error){"running": f.store.Running, "parked": f.store.Parked} {
		if c, err := count(f.ctx, "k1"); err != nil || c != 0 {
			t.Errorf("%s slots of k1 after the batch: %d, %v", name, c, err)
		}
	}
}

// Expensive single tasks of one key over its cap are promoted too: with a
// cap of 1 and an hour's retry delay, three distinct searches all end.
func TestSingleSearchesArePromoted(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	m := worker.NewMetrics(prometheus.NewRegistry())
	h := worker.NewHandler(f.store, nil, testLimits(), m, nil)
	h.SetGate(f.store, func() int { return 1 })
	most := concurrency(h, 100*time.Millisecond)
	client := asynq.NewClientFromRedisClient(f.rdb)

	reqs := sweeps(t, 3)
	for i, req := range reqs {
		f.enqueueSingle(t, client, fmt.Sprint("s", i), "k1", req)
	}
	f.slotServer(t, h, 3)
	for i := range reqs {
		id := fmt.Sprint("s", i)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			tk, err := f.store.Get(f.ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if tk.State == apitype.TaskStateCompleted {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is %s after 30 s (waits %v)", id, tk.State, testutil.ToFloat64(m.Waits))
			}
		}
	}
	if got := most.Load(); got != 1 {
		t.Errorf("%d searches of one key ran at once under a cap of 1", got)
	}
	if w := testutil.ToFloat64(m.Waits); w == 0 {
		t.Error("no task waited: the test did not exercise the cap")
	}
}

// A batch item told to wait is pending again, not active, and its
// attempt is taken back, so that the batch's counts say what waits.
func TestWaitingItemIsPending(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	h := worker.NewHandler(f.store, nil, testLimits(), worker.NewMetrics(prometheus.NewRegistry()), nil)
	h.SetGate(f.store, func() int { return 1 })
	reqs := sweeps(t, 1)
	f.stageOwned(t, "b1", "k1", reqs)
	// Another run of k1 holds its one slot.
	if a, err := f.store.AdmitSlot(f.ctx, worker.SlotRun{Slot: "other", Owner: "k1"}, 1); err != nil || a.Verdict != worker.VerdictRun {
		t.Fatalf("take k1's slot: %+v, %v", a, err)
	}
	task, err := tasks.NewUnitTask(tasks.UnitRef{BatchID: "b1", Unit: tasks.OwnUnit(0)}, tasks.QueueBulk)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		err := h.ProcessTask(f.ctx, task)
		var we *worker.WaitError
		if !errors.As(err, &we) {
			t.Fatalf("run over the cap: %v, want a WaitError", err)
		}
		b, err := f.store.GetBatch(f.ctx, "b1")
		if err != nil {
			t.Fatal(err)
		}
		if b.Counts[apitype.TaskStatePending] != 1 || b.Counts[apitype.TaskStateActive] != 0 {
			t.Fatalf("counts of a waiting item: %v", b.Counts)
		}
		if it := f.item(t, "b1", 0); it.State != apitype.TaskStatePending || it.Attempts != 0 {
			t.Fatalf("waiting item: %s after %d attempts", it.State, it.Attempts)
		}
	}
	if err := f.store.ReleaseSlot(f.ctx, worker.SlotRun{Slot: "other", Owner: "k1"}); err != nil {
		t.Fatal(err)
	}
	if err := h.ProcessTask(f.ctx, task); err != nil {
		t.Fatalf("run after the slot freed: %v", err)
	}
	if it := f.item(t, "b1", 0); it.State != apitype.TaskStateCompleted || it.Attempts != 1 {
		t.Fatalf("item after its run: %s after %d attempts", it.State, it.Attempts)
	}
}

// counted wraps h's solve so that it counts its calls and takes at least
// d each, so that identical runs overlap.
func counted(h *worker.Handler, d time.Duration) (calls *atomic.Int32) {
	solve := worker.SolveFnOf(h)
	orig := *solve
	calls = &atomic.Int32{}
	*solve = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		calls.Add(1)
		time.Sleep(d)
		return orig(ctx, p)
	}
	return calls
}

// Identical searches in one batch are solved once: the first to run leads,
// the others wait for it and read its answer from the cache, even with no
// cap holding them back (and with an hour's retry delay, so they end only
// by the lead's end moving them back).
func TestIdenticalBatchSearchesSolveOnce(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	const n = 4
	m := worker.NewMetrics(prometheus.NewRegistry())
	h := worker.NewHandler(f.store, nil, testLimits(), m, nil)
	h.SetGate(f.store, func() int { return 0 })
	h.SetFeed(f.store, n)
	// 300 ms: every copy is parked, and in asynq's retry set, well before
	// the lead ends (a copy told to wait just as it ends asks again by
	// itself after a second or two, which the hour's delay here forbids).
	calls := counted(h, 300*time.Millisecond)

	same := sweeps(t, 1)[0]
	f.stageOwned(t, "b1", "k1", []string{same, same, same, same})
	if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, n, n); err != nil {
		t.Fatal(err)
	}
	f.slotServer(t, h, n)
	b := f.waitDone(t, "b1")
	if got := b.Counts[apitype.TaskStateCompleted]; got != n {
		t.Fatalf("completed %d of %d: %v", got, n, b.Counts)
	}
	first := f.item(t, "b1", 0)
	for i := range n {
		if it := f.item(t, "b1", i); it.State != apitype.TaskStateCompleted || string(it.Result) != string(first.Result) {
			t.Fatalf("item %d: %s %s, want the answer of item 0 (%s)", i, it.State, it.Result, first.Result)
		}
	}
	if c := calls.Load(); c != 1 {
		t.Errorf("%d solves of one puzzle, want 1", c)
	}
	if j := testutil.ToFloat64(m.Joins); j == 0 {
		t.Error("no item waited for the identical solve: the test did not exercise the join")
	}
}

// A batch item identical to a single task being solved waits for that
// solve and takes its answer: one solve for both.
func TestBatchItemWaitsForASinglesSolve(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	m := worker.NewMetrics(prometheus.NewRegistry())
	h := worker.NewHandler(f.store, nil, testLimits(), m, nil)
	h.SetGate(f.store, func() int { return 0 })
	solve := worker.SolveFnOf(h)
	orig := *solve
	var calls atomic.Int32
	release := make(chan struct{})
	*solve = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		if calls.Add(1) == 1 {
			<-release
		}
		return orig(ctx, p)
	}
	client := asynq.NewClientFromRedisClient(f.rdb)
	h.SetFeed(f.store, 2)

	same := sweeps(t, 1)[0]
	p := mustParse(t, same)
	if _, _, err := f.store.SubmitTask(f.ctx, store.NewTask{ID: "s1", Kind: string(p.Kind()), Owner: "k2", CacheKey: p.Key()}, 0); err != nil {
		t.Fatal(err)
	}
	task, err := tasks.NewSolveTask("s1", "k2", p, tasks.QueueInteractive, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(task, asynq.TaskID("s1")); err != nil {
		t.Fatal(err)
	}
	f.slotServer(t, h, 2)
	for deadline := time.Now().Add(10 * time.Second); calls.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the single task's solve never started")
		}
	}
	f.stageOwned(t, "b1", "k1", []string{same})
	if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, 2, 2); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(m.Joins) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the batch item never waited for the single task's solve")
		}
	}
	// The solve ends only once the waiting item is in asynq's retry set:
	// one told to wait at the very moment the solve ends is not moved
	// back (it asks again after a second by itself, which the hour's
	// delay here forbids), and this test is about the move.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if n, err := f.rdb.ZCard(f.ctx, "asynq:{"+tasks.QueueBulk+"}:retry").Result(); err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiting batch item never reached asynq's retry set")
		}
	}
	close(release)
	f.waitDone(t, "b1")
	it := f.item(t, "b1", 0)
	single := waitEnded(t, f, "s1")
	if it.State != apitype.TaskStateCompleted || !it.Cached || string(it.Result) != string(single.Result) {
		t.Fatalf("batch item: %s cached %v %s; single %s %s", it.State, it.Cached, it.Result, single.State, single.Result)
	}
	if c := calls.Load(); c != 1 {
		t.Errorf("%d solves of one puzzle, want 1", c)
	}
}

// waitEnded waits for single task id to end and returns it.
func waitEnded(t *testing.T, f *unitFixture, id string) *store.Task {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		tk, err := f.store.Get(f.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if tk.State.Terminal() {
			return tk
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is %s after 10 s", id, tk.State)
		}
	}
}

// More copies than one solve's end moves back (64) all follow it: each
// copy that comes back and finds the answer brings more. The lead's solve
// takes 2 s, so every copy is parked in asynq's retry set before it ends,
// and the retry delay is an hour.
func TestManyCopiesFollowOneSolve(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	const n = 80
	m := worker.NewMetrics(prometheus.NewRegistry())
	h := worker.NewHandler(f.store, nil, testLimits(), m, nil)
	h.SetGate(f.store, func() int { return 0 })
	h.SetFeed(f.store, n)
	calls := counted(h, 2*time.Second)

	same := sweeps(t, 1)[0]
	reqs := make([]string, n)
	for i := range reqs {
		reqs[i] = same
	}
	f.stageOwned(t, "b1", "k1", reqs)
	if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, n, n); err != nil {
		t.Fatal(err)
	}
	f.slotServer(t, h, 4)
	b := f.waitDone(t, "b1")
	if got := b.Counts[apitype.TaskStateCompleted]; got != n {
		t.Fatalf("completed %d of %d: %v", got, n, b.Counts)
	}
	if c := calls.Load(); c != 1 {
		t.Errorf("%d solves of one puzzle, want 1", c)
	}
	if j := testutil.ToFloat64(m.Joins); j < n-1-64 {
		t.Errorf("%v copies waited for the solve: the test did not park more than one end moves back", j)
	}
}
