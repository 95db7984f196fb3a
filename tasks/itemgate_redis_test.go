package tasks_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// Expensive batch items through the gate, on the real store and a real
// asynq server configured as the worker binary configures it (a wait
// counts as neither a retry nor a failure): a key's batch of searches
// holds at most its cap of slots while another key's cheap work
// completes, and identical items solve once.

// stageOwned stages and commits batch id of owner as the API does.
func (f *unitFixture) stageOwned(t *testing.T, id, owner string, stride int, reqs []string) {
	t.Helper()
	w := f.store.NewBatchWriter(id, stride)
	for _, r := range reqs {
		p := mustParse(t, r)
		if err := w.Add(f.ctx, store.StagedItem{Kind: p.Kind(), Request: p.Payload(), Own: !p.Cheap(), Timeout: time.Minute}); err != nil {
			t.Fatalf("stage %s: %v", id, err)
		}
	}
	if err := f.store.CommitBatch(f.ctx, w, store.CommitBatch{ID: id, Owner: owner}); err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
}

// serveGated runs h on a real asynq server of concurrency slots on both
// queues, with the worker binary's treatment of waits.
func (f *unitFixture) serveGated(t *testing.T, h *tasks.Handler, slots int) {
	t.Helper()
	srv := asynq.NewServerFromRedisClient(f.rdb, asynq.Config{
		Concurrency: slots, Queues: map[string]int{tasks.QueueBulk: 1, tasks.QueueInteractive: 1},
		TaskCheckInterval: 5 * time.Millisecond, DelayedTaskCheckInterval: 100 * time.Millisecond,
		ErrorHandler: h.ErrorHandler(), LogLevel: asynq.ErrorLevel,
		IsFailure: func(err error) bool { _, wait := tasks.IsWait(err); return !wait },
		RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration {
			if d, ok := tasks.IsWait(err); ok {
				return d
			}
			return asynq.DefaultRetryDelayFunc(n, err, t)
		},
	})
	mux := asynq.NewServeMux()
	h.Register(mux)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
}

// board15Near returns a 15-puzzle whose blank was moved from the goal
// along path ("L" left, "U" up): distinct paths give distinct boards a
// few moves from the goal.
func board15Near(path string) string {
	b := [4][4]int{}
	for i := range 16 {
		b[i/4][i%4] = (i + 1) % 16
	}
	r, c := 3, 3
	for _, m := range path {
		nr, nc := r, c
		switch m {
		case 'L':
			nc--
		case 'U':
			nr--
		}
		b[r][c], b[nr][nc] = b[nr][nc], 0
		r, c = nr, nc
	}
	j, _ := json.Marshal(b)
	return `{"kind":"sliding","puzzle":{"board":` + string(j) + `}}`
}

// gatedSolve replaces h's solver: searches (boards over 9 cells) block
// until release is closed and count how many run at once; everything
// else solves at once.
type gatedSolve struct {
	release chan struct{}
	calls   atomic.Int32
	mu      sync.Mutex
	now     int
	most    int
}

func newGatedSolve(h *tasks.Handler) *gatedSolve {
	g := &gatedSolve{release: make(chan struct{})}
	*tasks.SolveFnOf(h) = func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		if p.Cheap() {
			return p.Solve(ctx)
		}
		g.calls.Add(1)
		g.mu.Lock()
		g.now++
		g.most = max(g.most, g.now)
		g.mu.Unlock()
		defer func() { g.mu.Lock(); g.now--; g.mu.Unlock() }()
		select {
		case <-g.release:
			return p.Solve(ctx)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g
}

func (g *gatedSolve) running() (now, most int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.now, g.most
}

// until polls cond every 5 ms for up to 30 s.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not after 30 s: %s", what)
		}
	}
}

// A key's batch of 6 distinct searches, on a worker of 4 slots with a
// cap of 2: 2 run, the others wait pending (no retry counted), and
// another key's batch of 8-puzzles completes while all of the first
// key's solves are still blocked. Then every item completes with its own
// answer, and the key never held more than 2 slots.
func TestGateBatchItemsCapped(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	const slots, limit = 4, 2
	client := asynq.NewClientFromRedisClient(f.rdb)
	m := tasks.NewMetrics(prometheus.NewRegistry())
	h := tasks.NewHandler(f.store, nil, testLimits(), m, nil)
	h.SetFeed(f.store, client, 16)
	h.SetGate(f.store, func() int { return limit })
	g := newGatedSolve(h)

	paths := []string{"L", "LL", "LLL", "U", "UU", "UUU"}
	flood := make([]string, len(paths))
	for i, p := range paths {
		flood[i] = board15Near(p)
	}
	f.stageOwned(t, "flood", "k1", 4, flood)
	if n, err := tasks.FeedQueue(f.ctx, f.store, client, tasks.QueueBulk, 16, 16); err != nil || n != len(flood) {
		t.Fatalf("fed %d of the flood's units: %v", n, err)
	}
	f.serveGated(t, h, slots)

	// Sample the key's slots while the test runs.
	var (
		most    atomic.Int64
		stopped = make(chan struct{})
		sampled = make(chan struct{})
	)
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stopped:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if n, err := f.store.Running(f.ctx, "k1"); err == nil && int64(n) > most.Load() {
				most.Store(int64(n))
			}
		}
	}()
	until(t, "k1 holds its 2 slots", func() bool { now, _ := g.running(); return now == limit })

	f.stageOwned(t, "cheap", "k2", 4, []string{sample8, sample8b, sample8, sample8b, sample8, sample8b, sample8, sample8b})
	if _, err := tasks.FeedQueue(f.ctx, f.store, client, tasks.QueueBulk, 16, 16); err != nil {
		t.Fatal(err)
	}
	cheap := f.waitDone(t, "cheap")
	if cheap.Counts[apitype.TaskStateCompleted] != 8 {
		t.Fatalf("k2's batch: %v", cheap.Counts)
	}
	fb, err := f.store.GetBatch(f.ctx, "flood")
	if err != nil {
		t.Fatal(err)
	}
	if fb.Counts[apitype.TaskStateActive] != limit || fb.Counts[apitype.TaskStatePending] != len(flood)-limit {
		t.Errorf("flood while k2's batch ended: %v, want %d active and the rest pending", fb.Counts, limit)
	}

	close(g.release)
	fb = f.waitDone(t, "flood")
	close(stopped)
	<-sampled
	if fb.Counts[apitype.TaskStateCompleted] != len(flood) {
		t.Fatalf("flood: %v", fb.Counts)
	}
	for i, r := range flood {
		want, err := mustParse(t, r).Solve(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if tk := f.item(t, "flood", i); tk.State != apitype.TaskStateCompleted || string(tk.Result) != string(want) || tk.Attempts != 1 {
			t.Errorf("flood item %d: %+v %s, want completed on its first attempt with %s", i, tk, tk.Result, want)
		}
	}
	if _, most := g.running(); most > limit {
		t.Errorf("%d of k1's searches ran at once, cap %d", most, limit)
	}
	if n := most.Load(); n > limit || n == 0 {
		t.Errorf("k1 held up to %d slots, cap %d", n, limit)
	}
	if n := g.calls.Load(); n != int32(len(flood)) {
		t.Errorf("%d solves of %d distinct boards", n, len(flood))
	}
	if n := testutil.ToFloat64(m.Waits); n < float64(len(flood)-limit) {
		t.Errorf("puzzleq_expensive_waits_total %v, want at least %d", n, len(flood)-limit)
	}
	if n, _ := f.store.Running(f.ctx, "k1"); n != 0 {
		t.Errorf("k1 holds %d slots after its batch", n)
	}
	if n, _ := f.store.Pending(f.ctx, "k1"); n != 0 {
		t.Errorf("k1's quota counts %d after its batch", n)
	}
}

// Eight identical searches in one batch and an identical single task of
// another key: one solve; the lead's delivery alone holds a slot, the
// others join; canceling one item leaves the rest their answer; every
// other item and the single end with the same result, and the batch's
// counts are exact.
func TestGateBatchItemsJoin(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	client := asynq.NewClientFromRedisClient(f.rdb)
	m := tasks.NewMetrics(prometheus.NewRegistry())
	cancels := tasks.NewCancels()
	h := tasks.NewHandler(f.store, cancels, testLimits(), m, nil)
	h.SetFeed(f.store, client, 16)
	h.SetGate(f.store, func() int { return 2 })
	lctx, stop := context.WithCancel(f.ctx)
	defer stop()
	go f.store.ListenCancels(lctx, cancels.Cancel)
	g := newGatedSolve(h)

	const copies = 8
	reqs := make([]string, copies)
	for i := range reqs {
		reqs[i] = board15b
	}
	f.stageOwned(t, "same", "k1", 4, reqs)
	if n, err := tasks.FeedQueue(f.ctx, f.store, client, tasks.QueueBulk, 16, 16); err != nil || n != copies {
		t.Fatalf("fed %d units: %v", n, err)
	}
	f.serveGated(t, h, 4)
	until(t, "all copies admitted", func() bool {
		b, err := f.store.GetBatch(f.ctx, "same")
		return err == nil && b.Counts[apitype.TaskStateActive] == copies
	})
	// A single task of another key joins the same solve.
	p := mustParse(t, board15b)
	if _, _, err := f.store.SubmitTask(f.ctx, store.NewTask{ID: "single", Kind: string(p.Kind()), Owner: "k2", CacheKey: p.Key()}, 0); err != nil {
		t.Fatal(err)
	}
	st, err := tasks.NewSolveTask("single", "k2", p, tasks.QueueInteractive, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(st); err != nil {
		t.Fatal(err)
	}
	until(t, "the single joined", func() bool {
		return testutil.ToFloat64(m.Joins) == copies
	})
	if now, _ := g.running(); now != 1 {
		t.Fatalf("%d solves running for identical puzzles, want 1", now)
	}
	if n, _ := f.store.Running(f.ctx, "k1"); n != 1 {
		t.Errorf("k1 holds %d slots for one solve", n)
	}
	b, err := f.store.GetBatch(f.ctx, "same")
	if err != nil {
		t.Fatal(err)
	}
	if prev, err := f.store.CancelItem(f.ctx, b, 5); err != nil || prev != apitype.TaskStateActive {
		t.Fatalf("cancel item 5: %s %v", prev, err)
	}
	close(g.release)
	b = f.waitDone(t, "same")
	want, err := p.Solve(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.Counts[apitype.TaskStateCompleted] != copies-1 || b.Counts[apitype.TaskStateCanceled] != 1 ||
		b.Counts[apitype.TaskStateActive] != 0 || b.Counts[apitype.TaskStatePending] != 0 {
		t.Fatalf("counts %v, want %d completed and 1 canceled", b.Counts, copies-1)
	}
	for i := range copies {
		tk := f.item(t, "same", i)
		if i == 5 {
			if tk.State != apitype.TaskStateCanceled {
				t.Errorf("item 5: %+v", tk)
			}
			continue
		}
		if tk.State != apitype.TaskStateCompleted || string(tk.Result) != string(want) {
			t.Errorf("item %d: %+v %s, want %s", i, tk, tk.Result, want)
		}
	}
	until(t, "the single completed", func() bool {
		tk, err := f.store.Get(f.ctx, "single")
		return err == nil && tk.State == apitype.TaskStateCompleted
	})
	if tk, _ := f.store.Get(f.ctx, "single"); string(tk.Result) != string(want) {
		t.Errorf("the single: %s, want %s", tk.Result, want)
	}
	if n := g.calls.Load(); n != 1 {
		t.Errorf("%d solves of one puzzle", n)
	}
	if n := testutil.ToFloat64(m.Tasks.WithLabelValues("sliding", "completed")); n != copies {
		t.Errorf("puzzleq_tasks_total %v, want %d (7 items and the single)", n, copies)
	}
	for _, k := range []string{"k1", "k2"} {
		if n, _ := f.store.Pending(f.ctx, k); n != 0 {
			t.Errorf("%s's quota counts %d at the end", k, n)
		}
		if n, _ := f.store.Running(f.ctx, k); n != 0 {
			t.Errorf("%s holds %d slots at the end", k, n)
		}
	}
}
