package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/tasks"
)

// One redis-server serves the package; every test gets its own prefix.
var (
	srvOnce sync.Once
	srv     *redistest.Server
	srvErr  error
)

// sharedServer starts the package's redis-server on first use; it lives
// for the whole run, and TestMain stops it.
func sharedServer(t *testing.T) *redistest.Server {
	t.Helper()
	srvOnce.Do(func() { srv, srvErr = redistest.Launch() })
	if srvErr != nil {
		t.Fatal(srvErr)
	}
	return srv
}

func newStore(t *testing.T) (*store.Store, context.Context) {
	t.Helper()
	rdb := sharedServer(t).Client(t)
	// A fresh prefix per run, so -count=N does not see an earlier run's keys.
	prefix := fmt.Sprintf("t:%s:%d:", t.Name(), time.Now().UnixNano())
	return store.New(rdb, store.Options{Prefix: prefix, TaskTTL: time.Hour, ResultTTL: time.Hour}), context.Background()
}

func TestMain(m *testing.M) {
	code := m.Run()
	if srv != nil {
		srv.Stop()
	}
	if code != 0 {
		panic(fmt.Sprintf("exit %d", code))
	}
}

func TestTaskLifecycle(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: "a", Kind: "sliding", CacheKey: "k1"}, 0); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "a")
	if err != nil || got.State != apitype.TaskStatePending || got.Kind != "sliding" || got.CreatedAt.IsZero() {
		t.Fatalf("after create: %+v, %v", got, err)
	}
	prev, _, err := s.Start(ctx, []tasks.Transition{{ID: "a"}}, nil)
	if err != nil || prev[0] != apitype.TaskStatePending {
		t.Fatalf("start: %v %v", prev, err)
	}
	// A redelivery starts again: still runnable, attempts counted.
	prev, _, _ = s.Start(ctx, []tasks.Transition{{ID: "a"}}, nil)
	if prev[0] != apitype.TaskStateActive {
		t.Fatalf("second start: %v", prev)
	}
	res := json.RawMessage(`{"moves":3}`)
	prev, err = s.Finish(ctx, []tasks.Transition{{ID: "a", State: apitype.TaskStateCompleted, Result: res}}, []string{"k1"})
	if err != nil || prev[0] != apitype.TaskStateActive {
		t.Fatalf("finish: %v %v", prev, err)
	}
	// Finishing twice changes nothing and reports the terminal state.
	prev, _ = s.Finish(ctx, []tasks.Transition{{ID: "a", State: apitype.TaskStateFailed, Code: "internal"}}, nil)
	if prev[0] != apitype.TaskStateCompleted {
		t.Fatalf("second finish: %v", prev)
	}
	got, _ = s.Get(ctx, "a")
	if got.State != apitype.TaskStateCompleted || string(got.Result) != `{"moves":3}` || got.Attempts != 2 || got.ErrCode != "" {
		t.Fatalf("final: %+v", got)
	}
	hits, err := s.CachedResults(ctx, []string{"k1", "missing"})
	if err != nil || string(hits[0]) != `{"moves":3}` || hits[1] != nil {
		t.Fatalf("cache: %q %v", hits, err)
	}
	if _, err := s.Get(ctx, "nope"); err != store.ErrNotFound {
		t.Fatalf("missing task: %v", err)
	}
	// Starting a task that has ended must not make it runnable again.
	prev, _, _ = s.Start(ctx, []tasks.Transition{{ID: "a"}, {ID: "nope"}}, nil)
	if prev[0] != apitype.TaskStateCompleted || prev[1] != "" {
		t.Fatalf("start after end: %v", prev)
	}
}

func TestBatchCountsExactUnderDuplicates(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	items := []store.NewTask{{ID: "i1", Kind: "sliding"}, {ID: "i2", Kind: "sliding"},
		{ID: "i3", Kind: "fill", Result: json.RawMessage(`{"filled":0}`)}}
	if err := s.CreateBatch(ctx, store.NewBatch{ID: "b", Format: "boj9944"}, items); err != nil {
		t.Fatal(err)
	}
	b, err := s.GetBatch(ctx, "b")
	if err != nil || b.Total != 3 || b.Counts[apitype.TaskStatePending] != 2 || b.Counts[apitype.TaskStateCompleted] != 1 || b.Done() || b.Format != "boj9944" {
		t.Fatalf("new batch: %+v %v", b, err)
	}
	ts := []tasks.Transition{{ID: "i1", BatchID: "b"}, {ID: "i2", BatchID: "b"}}
	// Deliver the whole chunk three times, concurrently.
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := s.Start(ctx, ts, nil); err != nil {
				t.Error(err)
			}
			done := []tasks.Transition{
				{ID: "i1", BatchID: "b", State: apitype.TaskStateCompleted, Result: json.RawMessage(`1`)},
				{ID: "i2", BatchID: "b", State: apitype.TaskStateFailed, Code: "timeout", Msg: "slow"},
			}
			if _, err := s.Finish(ctx, done, nil); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	b, _ = s.GetBatch(ctx, "b")
	want := map[apitype.TaskState]int{apitype.TaskStatePending: 0, apitype.TaskStateActive: 0, apitype.TaskStateCompleted: 2, apitype.TaskStateFailed: 1, apitype.TaskStateCanceled: 0}
	for st, n := range want {
		if b.Counts[st] != n {
			t.Errorf("count %s = %d, want %d (all: %v)", st, b.Counts[st], n, b.Counts)
		}
	}
	if !b.Done() || b.DoneAt.IsZero() {
		t.Errorf("batch not done: %+v", b)
	}
	ids, _ := s.BatchItems(ctx, "b", 1, 10)
	if len(ids) != 2 || ids[0] != "i2" || ids[1] != "i3" {
		t.Errorf("items from 1: %v", ids)
	}
	if n, _ := s.CancelBatch(ctx, "b", ""); n != 0 {
		t.Errorf("cancel of a finished batch canceled %d", n)
	}
}

func TestCancelAnnouncesRunningTasks(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	got := make(chan string, 4)
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	go s.ListenCancels(lctx, func(id string) { got <- id })
	hub := store.NewHub()
	go s.ListenEvents(lctx, hub)
	time.Sleep(100 * time.Millisecond) // let both subscriptions register

	for _, id := range []string{"pending", "running"} {
		if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: id, Kind: "sweep"}, 0); err != nil {
			t.Fatal(err)
		}
	}
	s.Start(ctx, []tasks.Transition{{ID: "running"}}, nil)
	fired, release := hub.Wait(store.TaskEventKey("running"))
	defer release()

	if prev, err := s.Cancel(ctx, "pending", "", ""); err != nil || prev != apitype.TaskStatePending {
		t.Fatalf("cancel pending: %v %v", prev, err)
	}
	if prev, err := s.Cancel(ctx, "running", "", ""); err != nil || prev != apitype.TaskStateActive {
		t.Fatalf("cancel running: %v %v", prev, err)
	}
	select {
	case id := <-got:
		if id != "running" {
			t.Fatalf("workers were told to cancel %q, want only the running task", id)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no cancel announcement")
	}
	select {
	case <-fired:
	case <-time.After(2 * time.Second):
		t.Fatal("long poll was not woken by the cancel")
	}
	if prev, _ := s.Cancel(ctx, "running", "", ""); prev != apitype.TaskStateCanceled {
		t.Fatalf("second cancel: %v", prev)
	}
	// A pending task's cancel must not be announced to workers.
	select {
	case id := <-got:
		t.Fatalf("unexpected announcement %q", id)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestScriptsSurviveRedisRestart(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := store.New(r.Client(t), store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	ctx := context.Background()
	if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: "x", Kind: "fill"}, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Start(ctx, []tasks.Transition{{ID: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	// SCRIPT FLUSH is what a restarted Redis looks like to EVALSHA.
	if err := r.Client(t).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	prev, err := s.Finish(ctx, []tasks.Transition{{ID: "x", State: apitype.TaskStateCompleted, Result: json.RawMessage(`{}`)}}, nil)
	if err != nil || prev[0] != apitype.TaskStateActive {
		t.Fatalf("finish after script flush: %v %v", prev, err)
	}
}

func TestHubWakesOnlyItsKey(t *testing.T) {
	t.Parallel()
	h := store.NewHub()
	a, relA := h.Wait("a")
	b, relB := h.Wait("b")
	defer relA()
	defer relB()
	h.Notify("a")
	select {
	case <-a:
	default:
		t.Fatal("a not woken")
	}
	select {
	case <-b:
		t.Fatal("b woken by a's event")
	default:
	}
	relB()
	if h.Waiting() != 0 {
		t.Fatalf("waiters left: %d", h.Waiting())
	}
}

func TestSubmitTaskOneRoundTrip(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	res, created, err := s.SubmitTask(ctx, store.NewTask{ID: "s1", Kind: "sliding", CacheKey: "ck", Owner: "alice"}, 2)
	if err != nil || res != nil || created.IsZero() {
		t.Fatalf("miss: %s %v %v", res, created, err)
	}
	got, _ := s.Get(ctx, "s1")
	if got.State != apitype.TaskStatePending || got.Owner != "alice" || !got.CreatedAt.Equal(created) {
		t.Fatalf("record: %+v (created %v)", got, created)
	}
	if n, _ := s.Pending(ctx, "alice"); n != 1 {
		t.Fatalf("pending count %d", n)
	}
	if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: "s2", Kind: "sliding", CacheKey: "ck2", Owner: "alice"}, 2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: "s3", Kind: "sliding", CacheKey: "ck3", Owner: "alice"}, 2); err != store.ErrQuota {
		t.Fatalf("third task over a quota of 2: %v", err)
	}
	if _, err := s.Get(ctx, "s3"); err != store.ErrNotFound {
		t.Fatalf("a refused task was recorded: %v", err)
	}
	// Finish s1: its result is cached and alice's slot comes back.
	states, hits, err := s.Start(ctx, []tasks.Transition{{ID: "s1", Owner: "alice"}}, []string{"ck"})
	if err != nil || states[0] != apitype.TaskStatePending || hits[0] != nil {
		t.Fatalf("start: %v %s %v", states, hits, err)
	}
	s.Finish(ctx, []tasks.Transition{{ID: "s1", Owner: "alice", State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":1}`)}}, []string{"ck"})
	if n, _ := s.Pending(ctx, "alice"); n != 1 {
		t.Fatalf("pending after a completion: %d", n)
	}
	// The same puzzle again: a hit, completed at once, not counted.
	res, _, err = s.SubmitTask(ctx, store.NewTask{ID: "s4", Kind: "sliding", CacheKey: "ck", Owner: "alice"}, 1)
	if err != nil || string(res) != `{"moves":1}` {
		t.Fatalf("hit: %s %v", res, err)
	}
	got, _ = s.Get(ctx, "s4")
	if got.State != apitype.TaskStateCompleted || !got.Cached || string(got.Result) != `{"moves":1}` {
		t.Fatalf("cached record: %+v", got)
	}
	// A worker starting a task whose answer is cached learns it at once.
	s.SubmitTask(ctx, store.NewTask{ID: "s5", Kind: "sliding", CacheKey: "other"}, 0)
	_, hits, _ = s.Start(ctx, []tasks.Transition{{ID: "s5"}}, []string{"ck"})
	if string(hits[0]) != `{"moves":1}` {
		t.Fatalf("start did not return the cached result: %s", hits[0])
	}
}

// TestChunkDeliveredTwice delivers one chunk of 300 items of a batch twice,
// concurrently, as a redelivered chunk task would be: some items were
// answered from the cache when the batch was created, some were canceled
// before any worker started them, and the rest are completed or failed.
// Every item must end and be counted, announced and given back to its
// owner's quota exactly once.
func TestChunkDeliveredTwice(t *testing.T) {
	t.Parallel()
	rdb := sharedServer(t).Client(t)
	prefix := fmt.Sprintf("t:%s:%d:", t.Name(), time.Now().UnixNano())
	s, ctx := store.New(rdb, store.Options{Prefix: prefix, TaskTTL: time.Hour, ResultTTL: time.Hour}), context.Background()

	const (
		n        = 300
		cachedN  = 20 // items 0..19: completed from the cache at creation
		canceled = 30 // items 20..49: canceled before start
		extra    = 5  // alice's other pending tasks, which must stay counted
	)
	// Seed the cache with one answer that item 62 will find at start.
	s.SubmitTask(ctx, store.NewTask{ID: "seed", Kind: "sliding"}, 0)
	s.Start(ctx, []tasks.Transition{{ID: "seed"}}, nil)
	s.Finish(ctx, []tasks.Transition{{ID: "seed", State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":7}`)}}, []string{"ck-hit"})

	items := make([]store.NewTask, n)
	for i := range items {
		items[i] = store.NewTask{ID: fmt.Sprintf("i%03d", i), Kind: "sliding", Owner: "alice"}
		if i < cachedN {
			items[i].Result = json.RawMessage(`{"moves":0}`)
		}
	}
	for i := range extra {
		if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: fmt.Sprintf("x%d", i), Kind: "sliding", Owner: "alice"}, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateBatch(ctx, store.NewBatch{ID: "b", Owner: "alice", Quota: 1000}, items); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Pending(ctx, "alice"); p != n-cachedN+extra {
		t.Fatalf("alice's pending count = %d after the batch, want %d", p, n-cachedN+extra)
	}

	// Count every event on the channel, from a subscription confirmed
	// before anything ends, and wake long-poll waiters through a Hub.
	ps := rdb.Subscribe(ctx, prefix+"events")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	events := map[string]int{}
	var evMu sync.Mutex
	evCh := ps.Channel()
	go func() {
		for m := range evCh {
			evMu.Lock()
			events[m.Payload]++
			evMu.Unlock()
		}
	}()
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	hub := store.NewHub()
	go s.ListenEvents(lctx, hub)
	time.Sleep(100 * time.Millisecond) // let the Hub's subscription register
	fired := make([]<-chan struct{}, n)
	for i := cachedN; i < n; i++ {
		ch, release := hub.Wait(store.TaskEventKey(items[i].ID))
		defer release()
		fired[i] = ch
	}
	batchDone, releaseB := hub.Wait(store.BatchEventKey("b"))
	defer releaseB()

	for i := cachedN; i < cachedN+canceled; i++ {
		if prev, err := s.Cancel(ctx, items[i].ID, "b", "alice"); err != nil || prev != apitype.TaskStatePending {
			t.Fatalf("cancel %s: %v %v", items[i].ID, prev, err)
		}
	}

	ts := make([]tasks.Transition, n)
	keys := make([]string, n)
	for i := range ts {
		ts[i] = tasks.Transition{ID: items[i].ID, BatchID: "b", Owner: "alice"}
		keys[i] = fmt.Sprintf("ck%03d", i)
	}
	keys[62] = "ck-hit"
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ended = map[string]int{}
	)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prev, hits, err := s.Start(ctx, ts, keys)
			if err != nil {
				t.Error(err)
				return
			}
			var done []tasks.Transition
			var dkeys []string
			for i, p := range prev {
				switch {
				case i < cachedN && p != apitype.TaskStateCompleted, i >= cachedN && i < cachedN+canceled && p != apitype.TaskStateCanceled:
					t.Errorf("start of %s: previous state %q", items[i].ID, p)
				}
				if p != apitype.TaskStatePending && p != apitype.TaskStateActive {
					continue
				}
				if i == 62 && string(hits[i]) != `{"moves":7}` {
					t.Errorf("item 62: no cache hit: %q", hits[i])
				}
				tr := ts[i]
				if hits[i] != nil { // answered from the cache, as the handler does
					tr.State, tr.Result, tr.Cached = apitype.TaskStateCompleted, hits[i], true
				} else if i%3 == 0 {
					tr.State, tr.Code, tr.Msg = apitype.TaskStateFailed, "timeout", "slow"
				} else {
					tr.State, tr.Result = apitype.TaskStateCompleted, json.RawMessage(fmt.Sprintf(`{"moves":%d}`, i))
				}
				done = append(done, tr)
				dkeys = append(dkeys, keys[i])
			}
			fprev, err := s.Finish(ctx, done, dkeys)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for j, p := range fprev {
				if p == apitype.TaskStatePending || p == apitype.TaskStateActive {
					ended[done[j].ID]++
				}
			}
			mu.Unlock()
		}()
	}
	wg.Wait()

	wantCompleted, wantFailed := cachedN, 0
	for i := cachedN + canceled; i < n; i++ {
		if ended[items[i].ID] != 1 {
			t.Errorf("%s ended by %d deliveries, want 1", items[i].ID, ended[items[i].ID])
		}
		if i%3 == 0 {
			wantFailed++
		} else {
			wantCompleted++
		}
	}
	b, err := s.GetBatch(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	want := map[apitype.TaskState]int{apitype.TaskStatePending: 0, apitype.TaskStateActive: 0, apitype.TaskStateCompleted: wantCompleted,
		apitype.TaskStateFailed: wantFailed, apitype.TaskStateCanceled: canceled}
	for st, c := range want {
		if b.Counts[st] != c {
			t.Errorf("count %s = %d, want %d (all: %v)", st, b.Counts[st], c, b.Counts)
		}
	}
	if !b.Done() || b.DoneAt.IsZero() {
		t.Errorf("batch not done: %+v", b)
	}
	if e, _ := rdb.HGet(ctx, prefix+"batch:b", "ended").Int(); e != n {
		t.Errorf("ended = %d, want %d", e, n)
	}
	if p, _ := s.Pending(ctx, "alice"); p != extra {
		t.Errorf("alice's pending count = %d, want %d", p, extra)
	}
	recs, _ := s.GetMany(ctx, []string{items[25].ID, items[62].ID, items[61].ID, items[63].ID})
	if r := recs[0]; r.State != apitype.TaskStateCanceled || r.Attempts != 0 || !r.StartedAt.IsZero() {
		t.Errorf("canceled item was started: %+v", r)
	}
	if r := recs[1]; r.State != apitype.TaskStateCompleted || string(r.Result) != `{"moves":7}` || !r.Cached {
		t.Errorf("item 62: %+v", r)
	}
	if r := recs[2]; r.State != apitype.TaskStateCompleted || string(r.Result) != `{"moves":61}` || r.CompletedAt.IsZero() || r.Attempts < 1 {
		t.Errorf("item 61: %+v", r)
	}
	if r := recs[3]; r.State != apitype.TaskStateFailed || r.ErrCode != "timeout" || r.ErrMsg != "slow" || r.Result != nil {
		t.Errorf("item 63: %+v", r)
	}
	if hit, _ := s.CachedResults(ctx, []string{keys[61]}); string(hit[0]) != `{"moves":61}` {
		t.Errorf("result of item 61 not cached: %s", hit[0])
	}

	for i := cachedN; i < n; i++ {
		select {
		case <-fired[i]:
		case <-time.After(2 * time.Second):
			t.Fatalf("no event woke the waiter of %s", items[i].ID)
		}
	}
	select {
	case <-batchDone:
	case <-time.After(2 * time.Second):
		t.Fatal("no batch event")
	}
	time.Sleep(100 * time.Millisecond) // let stray duplicates arrive
	evMu.Lock()
	defer evMu.Unlock()
	for i := range items {
		want := 1
		if i < cachedN {
			want = 0 // ended at creation: never announced
		}
		if got := events["t:"+items[i].ID]; got != want {
			t.Errorf("%d events for %s, want %d", got, items[i].ID, want)
		}
	}
	if events["b:b"] != 1 {
		t.Errorf("%d batch events, want 1", events["b:b"])
	}
}
