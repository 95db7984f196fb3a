package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
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
	prev, _, err := s.Start(ctx, []worker.Transition{{ID: "a"}}, nil)
	if err != nil || prev[0] != apitype.TaskStatePending {
		t.Fatalf("start: %v %v", prev, err)
	}
	// A redelivery starts again: still runnable, attempts counted.
	prev, _, _ = s.Start(ctx, []worker.Transition{{ID: "a"}}, nil)
	if prev[0] != apitype.TaskStateActive {
		t.Fatalf("second start: %v", prev)
	}
	res := json.RawMessage(`{"moves":3}`)
	prev, err = s.Finish(ctx, []worker.Transition{{ID: "a", State: apitype.TaskStateCompleted, Result: res}}, []string{"k1"})
	if err != nil || prev[0] != apitype.TaskStateActive {
		t.Fatalf("finish: %v %v", prev, err)
	}
	// Finishing twice changes nothing and reports the terminal state.
	prev, _ = s.Finish(ctx, []worker.Transition{{ID: "a", State: apitype.TaskStateFailed, Code: "internal"}}, nil)
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
	prev, _, _ = s.Start(ctx, []worker.Transition{{ID: "a"}, {ID: "nope"}}, nil)
	if prev[0] != apitype.TaskStateCompleted || prev[1] != "" {
		t.Fatalf("start after end: %v", prev)
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
	s.Start(ctx, []worker.Transition{{ID: "running"}}, nil)
	fired, release := hub.Wait(store.TaskEventKey("running"))
	defer release()

	if prev, err := s.Cancel(ctx, "pending", ""); err != nil || prev != apitype.TaskStatePending {
		t.Fatalf("cancel pending: %v %v", prev, err)
	}
	if prev, err := s.Cancel(ctx, "running", ""); err != nil || prev != apitype.TaskStateActive {
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
	if prev, _ := s.Cancel(ctx, "running", ""); prev != apitype.TaskStateCanceled {
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
	if _, _, err := s.Start(ctx, []worker.Transition{{ID: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	// SCRIPT FLUSH is what a restarted Redis looks like to EVALSHA.
	if err := r.Client(t).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	prev, err := s.Finish(ctx, []worker.Transition{{ID: "x", State: apitype.TaskStateCompleted, Result: json.RawMessage(`{}`)}}, nil)
	if err != nil || prev[0] != apitype.TaskStateActive {
		t.Fatalf("finish after script flush: %v %v", prev, err)
	}
	// Tasks of two owners end in a pipeline of two script calls, the
	// other way Finish reaches Redis; it reloads the scripts too.
	for _, id := range []string{"y", "z"} {
		if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: id, Kind: "fill", Owner: "owner-" + id}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Client(t).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	prev, err = s.Finish(ctx, []worker.Transition{
		{ID: "y", Owner: "owner-y", State: apitype.TaskStateCompleted, Result: json.RawMessage(`{}`), Unstarted: true},
		{ID: "z", Owner: "owner-z", State: apitype.TaskStateFailed, Code: apitype.CodeInternal, Msg: "m", Unstarted: true},
	}, nil)
	if err != nil || len(prev) != 2 || prev[0] != apitype.TaskStatePending || prev[1] != apitype.TaskStatePending {
		t.Fatalf("two owners' finish after script flush: %v %v", prev, err)
	}
	for id, want := range map[string]apitype.TaskState{"y": apitype.TaskStateCompleted, "z": apitype.TaskStateFailed} {
		if got, err := r.Client(t).HGet(ctx, "pq:task:"+id, "state").Result(); err != nil || got != string(want) {
			t.Errorf("task %s: state %q (%v), want %s", id, got, err, want)
		}
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
	states, hits, err := s.Start(ctx, []worker.Transition{{ID: "s1", Owner: "alice"}}, []string{"ck"})
	if err != nil || states[0] != apitype.TaskStatePending || hits[0] != nil {
		t.Fatalf("start: %v %s %v", states, hits, err)
	}
	s.Finish(ctx, []worker.Transition{{ID: "s1", Owner: "alice", State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":1}`)}}, []string{"ck"})
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
	_, hits, _ = s.Start(ctx, []worker.Transition{{ID: "s5"}}, []string{"ck"})
	if string(hits[0]) != `{"moves":1}` {
		t.Fatalf("start did not return the cached result: %s", hits[0])
	}
}

// TestFinishEventCarriesRecord holds the event of an ended single task to
// the record a read returns, so a long poll may answer from it; a result
// too large for every API replica to receive travels as the ID alone.
func TestFinishEventCarriesRecord(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	hub := store.NewHub()
	go s.ListenEvents(lctx, hub)
	time.Sleep(100 * time.Millisecond) // let the subscription register

	big := json.RawMessage(`"` + strings.Repeat("x", 20<<10) + `"`)
	cases := []struct {
		name string
		tr   worker.Transition
		// carried says whether the event holds the record.
		carried bool
	}{
		{"completed", worker.Transition{ID: "ok", Owner: "alice", State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":2,"path":"a\/b"}`)}, true},
		{"failed", worker.Transition{ID: "bad", State: apitype.TaskStateFailed, Code: apitype.CodeTimeout, Msg: "took \"too\" long"}, true},
		{"awkward bytes", worker.Transition{ID: "odd", State: apitype.TaskStateFailed, Code: apitype.CodeTimeout, Msg: "12:ab 3:x\\\"é\u2028\x00\n:"}, true},
		{"large result", worker.Transition{ID: "big", State: apitype.TaskStateCompleted, Result: big}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: tc.tr.ID, Kind: "sliding", Owner: tc.tr.Owner, CacheKey: "k" + tc.tr.ID}, 0); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.Start(ctx, []worker.Transition{{ID: tc.tr.ID}}, nil); err != nil {
				t.Fatal(err)
			}
			w, release := hub.Subscribe(store.TaskEventKey(tc.tr.ID))
			defer release()
			if _, err := s.Finish(ctx, []worker.Transition{tc.tr}, nil); err != nil {
				t.Fatal(err)
			}
			select {
			case <-w.C:
			case <-time.After(2 * time.Second):
				t.Fatal("no event")
			}
			got := store.DecodeEventTask(tc.tr.ID, w.Data())
			if !tc.carried {
				if got != nil {
					t.Fatalf("the event carried a %d-byte result", len(w.Data()))
				}
				return
			}
			want, err := s.Get(ctx, tc.tr.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got == nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("event record\n%+v\nread\n%+v", got, want)
			}
		})
	}
}

// SubmitTask queues a new pending task on asynq's queue in the script that
// records it, and nothing for a cache hit or an ID asynq holds already.
func TestSubmitTaskEnqueues(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	rdb := sharedServer(t).Client(t)
	queue := fmt.Sprintf("q%d", time.Now().UnixNano()) // asynq's keys take no prefix
	enq := func(id string) asynqdata.Enqueued {
		return asynqdata.Enqueued{ID: id, Queue: queue, Msg: []byte("msg-" + id)}
	}
	pending := "asynq:{" + queue + "}:pending"

	// A hit queues nothing, and the queue is not yet asynq's.
	if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: "seed", Kind: "sliding", CacheKey: "ck"}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Finish(ctx, []worker.Transition{{ID: "seed", State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":1}`)}}, []string{"ck"}); err != nil {
		t.Fatal(err)
	}
	if hit, _, err := s.SubmitTask(ctx, store.NewTask{ID: "hit", Kind: "sliding", CacheKey: "ck", Enqueue: enq("hit")}, 0); err != nil || hit == nil {
		t.Fatalf("hit: %s %v", hit, err)
	}
	if n, _ := rdb.LLen(ctx, pending).Result(); n != 0 {
		t.Fatalf("a cache hit queued %d tasks", n)
	}
	if ok, _ := rdb.SIsMember(ctx, "asynq:queues", queue).Result(); ok {
		t.Fatal("a cache hit added the queue")
	}
	// A miss records and queues, as asynq's enqueue does.
	if hit, _, err := s.SubmitTask(ctx, store.NewTask{ID: "miss", Kind: "sliding", CacheKey: "other", Enqueue: enq("miss")}, 0); err != nil || hit != nil {
		t.Fatalf("miss: %s %v", hit, err)
	}
	h, err := rdb.HGetAll(ctx, "asynq:{"+queue+"}:t:miss").Result()
	if err != nil || h["msg"] != "msg-miss" || h["state"] != "pending" || h["pending_since"] == "" {
		t.Fatalf("asynq's task hash %v %v", h, err)
	}
	if ids, _ := rdb.LRange(ctx, pending, 0, -1).Result(); fmt.Sprint(ids) != "[miss]" {
		t.Fatalf("pending list %v", ids)
	}
	if ok, _ := rdb.SIsMember(ctx, "asynq:queues", queue).Result(); !ok {
		t.Fatal("the queue was not added to asynq's queues")
	}
	// An ID asynq holds already writes nothing.
	if err := rdb.HSet(ctx, "asynq:{"+queue+"}:t:taken", "msg", "x").Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: "taken", Kind: "sliding", CacheKey: "third", Enqueue: enq("taken")}, 0); err != store.ErrTaskIDConflict {
		t.Fatalf("taken ID: %v, want ErrTaskIDConflict", err)
	}
	if _, err := s.Get(ctx, "taken"); err != store.ErrNotFound {
		t.Fatalf("a refused submission left a record: %v", err)
	}
}

// TestFinishCachesWithoutShortening holds Finish's result cache to SET NX
// with the result TTL and a TTL that only grows: a new entry lives the
// result TTL, a shorter-lived one is raised to it, and a longer-lived one
// (a batch item's, raised to its batch's) keeps its TTL and its value.
func TestFinishCachesWithoutShortening(t *testing.T) {
	t.Parallel()
	rdb := sharedServer(t).Client(t)
	prefix := fmt.Sprintf("t:%s:%d:", t.Name(), time.Now().UnixNano())
	s := store.New(rdb, store.Options{Prefix: prefix, TaskTTL: time.Hour, ResultTTL: time.Hour})
	ctx := context.Background()
	cases := []struct {
		name     string
		existing time.Duration // 0: no entry before
		minTTL   time.Duration
		maxTTL   time.Duration
		value    string
	}{
		{"new entry", 0, 59 * time.Minute, time.Hour, `{"moves":3}`},
		{"shorter entry", time.Minute, 59 * time.Minute, time.Hour, `{"moves":1}`},
		{"longer entry", 10 * time.Hour, 9 * time.Hour, 10 * time.Hour, `{"moves":1}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Helper()
			id, ck := "c"+strings.ReplaceAll(tc.name, " ", ""), "ck-"+tc.name
			if tc.existing > 0 {
				rdb.Set(ctx, prefix+"cache:"+ck, `{"moves":1}`, tc.existing)
			}
			if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: id, Kind: "sliding", CacheKey: ck}, 0); err != nil {
				t.Fatal(err)
			}
			tr := worker.Transition{ID: id, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":3}`), Unstarted: true}
			if _, err := s.Finish(ctx, []worker.Transition{tr}, []string{ck}); err != nil {
				t.Fatal(err)
			}
			v, err := rdb.Get(ctx, prefix+"cache:"+ck).Result()
			ttl := rdb.PTTL(ctx, prefix+"cache:"+ck).Val()
			if err != nil || v != tc.value || ttl < tc.minTTL || ttl > tc.maxTTL {
				t.Fatalf("cache entry %q (%v), TTL %s; want %s with TTL in [%s, %s]", v, err, ttl, tc.value, tc.minTTL, tc.maxTTL)
			}
		})
	}
}
