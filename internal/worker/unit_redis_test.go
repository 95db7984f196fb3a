package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// The unit handler on the real store and a real asynq server: batches
// staged and committed as the API does, fed, run and read back item by
// item.

// unitFixture is a real store on its own redis-server.
type unitFixture struct {
	rdb   *redis.Client
	store *store.Store
	ctx   context.Context
}

func newUnitFixture(t testing.TB) *unitFixture {
	t.Helper()
	r := redistest.Start(t)
	rdb := r.Client(t)
	st := store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	return &unitFixture{rdb: rdb, store: st, ctx: context.Background()}
}

// stage stages and commits batch id of reqs, stride items to a chunk, as
// the API does: searches run in their own units.
func (f *unitFixture) stage(t *testing.T, id string, stride int, reqs []string) {
	t.Helper()
	w := f.store.NewBatchWriter(id, stride)
	for _, r := range reqs {
		p := mustParse(t, r)
		if err := w.Add(f.ctx, store.StagedItem{Kind: p.Kind(), Request: p.Payload(), Own: !p.Cheap(), Timeout: time.Minute}); err != nil {
			t.Fatalf("stage %s: %v", id, err)
		}
	}
	if err := w.Close(f.ctx); err != nil {
		t.Fatalf("stage %s: %v", id, err)
	}
	if err := f.store.CommitBatch(f.ctx, w, store.CommitBatch{ID: id}); err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
}

// waitDone waits until batch id has ended, and returns it.
func (f *unitFixture) waitDone(t *testing.T, id string) *store.Batch {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, err := f.store.GetBatch(f.ctx, id)
		if err != nil {
			t.Fatalf("batch %s: %v", id, err)
		}
		if b.Done() {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s not done after 30 s: %v", id, b.Counts)
		}
	}
}

// item reads item index of batch id.
func (f *unitFixture) item(t *testing.T, id string, index int) *store.Task {
	t.Helper()
	tk, err := f.store.GetItem(f.ctx, id, index)
	if err != nil {
		t.Fatalf("item %d of %s: %v", index, id, err)
	}
	return tk
}

// serve runs h on a real asynq server on f's Redis until the test ends.
func (f *unitFixture) serve(t *testing.T, h *worker.Handler) {
	t.Helper()
	srv := asynq.NewServerFromRedisClient(f.rdb, asynq.Config{
		Concurrency: 2, Queues: map[string]int{tasks.QueueBulk: 1, tasks.QueueCheapBulk: 1}, TaskCheckInterval: 5 * time.Millisecond,
		ErrorHandler: h.ErrorHandler(), LogLevel: asynq.ErrorLevel,
	})
	mux := asynq.NewServeMux()
	h.Register(mux)
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	// Registered after the client's Close, so it runs before it: asynq's
	// subscriber panics on a client closed under it.
	t.Cleanup(srv.Shutdown)
}

// feedLanes feeds both lanes' bulk queues, the cheap lane's and the
// solvers', up to depth, at most max units each, as the API does after a
// commit, and returns how many units landed.
func (f *unitFixture) feedLanes(t *testing.T, depth, max int) int {
	t.Helper()
	total := 0
	for _, q := range []string{tasks.QueueCheapBulk, tasks.QueueBulk} {
		n, err := worker.FeedQueue(f.ctx, f.store, q, depth, max)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
}

// A worker runs a batch's units and feeds the queues as it goes: seeded
// with FEED_DEPTH (2) units of each lane, 4 of the 5, as the API's feed
// after a commit would, the batch ends only if workers feed the rest. A second batch
// finds the first one's search in the cache, and keeps a canceled item.
func TestUnitsRunOnTheRealStore(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	const depth = 2
	h := worker.NewHandler(f.store, nil, testLimits(), worker.NewMetrics(prometheus.NewRegistry()), nil)
	h.SetFeed(f.store, depth)

	// Chunks of 4: c0 = {0,1,3}, x2, c1 = {4,5,6,7}, c2 = {8,9}, x10.
	reqs := []string{sample8, sampleFill, sampleSweep, sample8b, sample8, sample8b, sampleFill, sample8,
		sampleFill, sample8, `{"kind":"sweep","puzzle":{"board":["....","..*.","...."]}}`}
	f.stage(t, "b1", 4, reqs)
	if n := f.feedLanes(t, depth, 8); n != 2*depth {
		t.Fatalf("seeding feed: %d units landed; want %d", n, 2*depth)
	}
	f.serve(t, h)

	b := f.waitDone(t, "b1")
	if b.Total != len(reqs) || b.Counts[apitype.TaskStateCompleted] != len(reqs) {
		t.Fatalf("batch counts %v of %d items, want all completed", b.Counts, b.Total)
	}
	for i, r := range reqs {
		want, err := mustParse(t, r).Solve(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		tk := f.item(t, "b1", i)
		if tk.State != apitype.TaskStateCompleted || string(tk.Result) != string(want) || tk.Cached ||
			tk.BatchID != "b1" || tk.ID != apitype.ItemID("b1", i) {
			t.Errorf("item %d: %+v %s, want completed with %s", i, tk, tk.Result, want)
		}
	}

	// Batch b2 repeats b1's first search, which the worker finds cached.
	f.stage(t, "b2", 4, []string{sampleSweep, sample8, sample8b})
	b2, err := f.store.GetBatch(f.ctx, "b2")
	if err != nil {
		t.Fatal(err)
	}
	if prev, err := f.store.CancelItem(f.ctx, b2, 2); err != nil || prev != apitype.TaskStatePending {
		t.Fatalf("cancel item 2 of b2: %v %v", prev, err)
	}
	f.feedLanes(t, depth, 8)
	b2 = f.waitDone(t, "b2")
	if b2.Counts[apitype.TaskStateCompleted] != 2 || b2.Counts[apitype.TaskStateCanceled] != 1 {
		t.Fatalf("b2 counts %v, want 2 completed and 1 canceled", b2.Counts)
	}
	if tk := f.item(t, "b2", 0); tk.State != apitype.TaskStateCompleted || !tk.Cached ||
		string(tk.Result) != string(f.item(t, "b1", 2).Result) {
		t.Errorf("b2's repeated search: %+v %s, want b1's result from the cache", tk, tk.Result)
	}
	if tk := f.item(t, "b2", 2); tk.State != apitype.TaskStateCanceled {
		t.Errorf("b2's canceled item: %+v", tk)
	}

	// Every fed unit was acknowledged, and nothing is left to feed.
	if stale, err := f.store.StaleFed(f.ctx, time.Now().Add(time.Hour), 100); err != nil || len(stale) != 0 {
		t.Errorf("units left in the feeding set: %v %v", stale, err)
	}
	for _, q := range []string{tasks.QueueCheapBulk, tasks.QueueBulk} {
		if refs, err := f.store.Feed(f.ctx, q, 100, 100); err != nil || len(refs) != 0 {
			t.Errorf("units left in the feed of %s: %v %v", q, refs, err)
		}
	}

	// A redelivery of a unit that ran changes nothing.
	task, err := tasks.NewUnitTask(tasks.UnitRef{BatchID: "b1", Unit: "c1", Timeout: time.Minute}, tasks.QueueBulk)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.ProcessTask(f.ctx, task); err != nil {
		t.Fatal(err)
	}
	if b, _ := f.store.GetBatch(f.ctx, "b1"); b.Counts[apitype.TaskStateCompleted] != len(reqs) || b.Counts[apitype.TaskStateActive] != 0 {
		t.Errorf("counts after a redelivery: %v", b.Counts)
	}
}

// A unit interrupted by shutdown keeps the item it finished; when asynq
// then gives up on it, the rest fail as internal and the batch ends.
func TestUnitGiveUpOnTheRealStore(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	h := worker.NewHandler(f.store, nil, testLimits(), nil, nil)
	f.stage(t, "b3", 4, []string{sample8, sample8b, sampleFill})
	refs, err := f.store.Feed(f.ctx, tasks.QueueCheapBulk, 100, 100)
	if err != nil || len(refs) != 1 || refs[0].Unit != "c0" {
		t.Fatalf("fed %v, %v; want b3's one chunk", refs, err)
	}
	task, err := tasks.NewUnitTask(refs[0], tasks.QueueBulk)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	n := 0
	*worker.SolveFnOf(h) = func(sctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
		if n++; n == 2 {
			cancel() // the worker shuts down during the second item
			return nil, sctx.Err()
		}
		return p.Solve(sctx)
	}
	if err := h.ProcessTask(ctx, task); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted unit returned %v", err)
	}
	if tk := f.item(t, "b3", 0); tk.State != apitype.TaskStateCompleted {
		t.Fatalf("the item done before the shutdown: %+v", tk)
	}
	if tk := f.item(t, "b3", 1); tk.State != apitype.TaskStateActive {
		t.Fatalf("the interrupted item: %+v", tk)
	}
	h.ErrorHandler()(f.ctx, task, errors.New("redis: connection refused"))
	b, err := f.store.GetBatch(f.ctx, "b3")
	if err != nil {
		t.Fatal(err)
	}
	if !b.Done() || b.Counts[apitype.TaskStateCompleted] != 1 || b.Counts[apitype.TaskStateFailed] != 2 {
		t.Fatalf("after the last retry: %v", b.Counts)
	}
	for _, i := range []int{1, 2} {
		if tk := f.item(t, "b3", i); tk.State != apitype.TaskStateFailed || tk.ErrCode != apitype.CodeInternal {
			t.Errorf("item %d after the last retry: %+v", i, tk)
		}
	}
}

// A result over 64 KiB (a large fill's) is kept once, in the result
// cache under its puzzle's key, and its item's entry refers to it, so
// that readers size it and read it with plain commands; a small one stays
// inline in its entry. Both read back whole as items.
func TestLargeResultIsKeptInTheCache(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	h := worker.NewHandler(f.store, nil, testLimits(), nil, nil)
	reqs := []string{testgen.Fill(rand.New(rand.NewSource(1)), 160), sample8}
	f.stage(t, "big", 4, reqs)
	f.feedLanes(t, 8, 8)
	f.serve(t, h)
	f.waitDone(t, "big")
	for i, r := range reqs {
		p := mustParse(t, r)
		want, err := p.Solve(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if tk := f.item(t, "big", i); tk.State != apitype.TaskStateCompleted || string(tk.Result) != string(want) {
			t.Fatalf("item %d: %s, %d result bytes; want completed with the %d of the local solve", i, tk.State, len(tk.Result), len(want))
		}
		entry := f.rdb.HStrLen(f.ctx, "pq:batch:big:res:0", strconv.Itoa(i)).Val()
		cached := f.rdb.Get(f.ctx, "pq:cache:"+p.Key()).Val()
		switch {
		case i == 0 && len(want) <= 64<<10:
			t.Fatalf("the large fill's result is %d bytes: not large enough to test", len(want))
		case i == 0 && (entry > 2<<10 || cached != string(want)):
			t.Errorf("the large result: an entry of %d bytes, %d bytes cached; want a head referring to the cached result", entry, len(cached))
		case i == 1 && (entry < int64(len(want)) || cached != ""):
			t.Errorf("the small result: an entry of %d bytes, %d bytes cached; want it inline, not cached", entry, len(cached))
		}
	}
}
