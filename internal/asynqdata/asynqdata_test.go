package asynqdata_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

const sample8 = `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`

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

// TestKeys pins asynq v0.26's key names, which the store's scripts and
// KEDA's trigger use without asynq.
func TestKeys(t *testing.T) {
	for got, want := range map[string]string{
		asynqdata.TaskKey("bulk", "b1:c0"): "asynq:{bulk}:t:b1:c0",
		asynqdata.PendingKey("bulk"):       "asynq:{bulk}:pending",
		asynqdata.ActiveKey("bulk"):        "asynq:{bulk}:active",
		asynqdata.LeaseKey("bulk"):         "asynq:{bulk}:lease",
		asynqdata.RetryKey("bulk"):         "asynq:{bulk}:retry",
		asynqdata.ArchivedKey("bulk"):      "asynq:{bulk}:archived",
		asynqdata.CompletedKey("bulk"):     "asynq:{bulk}:completed",
		asynqdata.QueuesKey:                "asynq:queues",
	} {
		if got != want {
			t.Errorf("key %q, want %q", got, want)
		}
	}
}

// TestUnitMatchesAsynq: a unit's task as the store's bulk
// enqueue writes it is byte for byte what asynq.Client writes for
// NewUnitTask, timeouts in and out of whole seconds and none at all
// (asynq's default) included.
func TestUnitMatchesAsynq(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	c := asynq.NewClientFromRedisClient(rdb)
	for i, timeout := range []time.Duration{0, 1500 * time.Millisecond, time.Minute, 30*time.Minute + 2*time.Second} {
		for _, unit := range []string{"c0", "x12345"} {
			r := tasks.UnitRef{BatchID: fmt.Sprintf("%032x", i+1), Unit: unit, Timeout: timeout}
			task, err := tasks.NewUnitTask(r, tasks.QueueBulk)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.EnqueueContext(context.Background(), task); err != nil {
				t.Fatal(err)
			}
			want, err := rdb.HGet(context.Background(), asynqdata.TaskKey(tasks.QueueBulk, r.TaskID()), "msg").Bytes()
			if err != nil {
				t.Fatal(err)
			}
			got, err := asynqdata.Unit(r, tasks.QueueBulk)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Msg, want) || got.ID != r.TaskID() || got.Queue != tasks.QueueBulk {
				t.Fatalf("%+v: message\n%x\nasynq.Client wrote\n%x", r, got.Msg, want)
			}
		}
	}
}

// The message the submit script enqueues is, byte for byte, the one
// asynq.Client writes for NewSolveTask's task, so the workers' asynq reads
// it as its own; checked for every kind.
func TestSolveMatchesAsynq(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	c := asynq.NewClientFromRedisClient(rdb)
	l := testLimits()
	l.Deadline[puzzle.KindFill] = 1500 * time.Millisecond // not whole seconds
	for i, req := range []string{
		sample8,
		`{"kind":"sweep","puzzle":{"board":["..","*.","*."]},"options":{"max_nodes":1000}}`,
		`{"kind":"fill","puzzle":{"game_board":[[1,1,0],[1,1,0],[0,0,0]],"table":[[1,1,1],[0,0,1],[0,0,1]]}}`,
	} {
		p := mustParse(t, req)
		id := fmt.Sprintf("%032x", i+1)
		for _, owner := range []string{"", "alice", `a "quoted" <key> é`, `back\\slash`, "ctl\x01", "line\u2028sep", "a&b", "del\x7f"} {
			at := time.UnixMilli(1_700_000_000_000 + int64(i))
			task, err := tasks.NewSolveTaskAt(id+owner, owner, p, tasks.QueueInteractive, l, at)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.EnqueueContext(context.Background(), task); err != nil {
				t.Fatal(err)
			}
			want, err := rdb.HGet(context.Background(), asynqdata.TaskKey(tasks.QueueInteractive, id+owner), "msg").Bytes()
			if err != nil {
				t.Fatal(err)
			}
			got, err := asynqdata.Solve(id+owner, owner, p, tasks.QueueInteractive, l, at)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Msg, want) || got.ID != id+owner || got.Queue != tasks.QueueInteractive {
				t.Fatalf("%s, owner %q: message\n%x\nasynq.Client wrote\n%x", p.Kind(), owner, got.Msg, want)
			}
		}
	}
}

// TestInspectorReadsWhatTheStoreWrites writes a single task with the
// store's submit script and batch units with its bulk enqueue, each in
// the form this package encodes, and reads them back through
// asynq.Inspector: asynq sees each as a pending task of its own, with the
// type, payload, queue, retries and timeout that tasks' constructors give
// it, and lists its queue.
func TestInspectorReadsWhatTheStoreWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	st := store.New(rdb, store.Options{Prefix: "ad:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	insp := asynq.NewInspectorFromRedisClient(rdb)
	l := testLimits()

	// A single task, recorded and enqueued by submitScript.
	p := mustParse(t, sample8)
	const id = "0123456789abcdef0123456789abcdef"
	at := time.Now()
	q, err := asynqdata.Solve(id, "alice", p, tasks.QueueInteractive, l, at)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.SubmitTask(ctx, store.NewTask{ID: id, Kind: string(p.Kind()), Owner: "alice", Enqueue: q}, 0); err != nil {
		t.Fatal(err)
	}
	want, err := tasks.NewSolveTaskAt(id, "alice", p, tasks.QueueInteractive, l, at)
	if err != nil {
		t.Fatal(err)
	}
	ti, err := insp.GetTaskInfo(tasks.QueueInteractive, id)
	if err != nil {
		t.Fatalf("asynq does not find the submitted task: %v", err)
	}
	check(t, ti, want.Type(), want.Payload(), tasks.QueueInteractive, l.TaskTimeout(p.Kind()))

	// Batch units, enqueued by enqueueFedScript: a chunk of 8-puzzles is
	// cheap, so its unit goes to the cheap lane's bulk queue.
	lane := tasks.QueueCheapBulk
	w := st.NewBatchWriter("fedbatch", 1)
	for i := range 2 {
		if err := w.Add(ctx, store.StagedItem{Kind: puzzle.KindSliding, Request: p.Payload(), CustomID: fmt.Sprint(i), Timeout: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.CommitBatch(ctx, w, store.CommitBatch{ID: "fedbatch", Owner: "alice"}); err != nil {
		t.Fatal(err)
	}
	refs, err := st.Feed(ctx, lane, 64, 64)
	if err != nil || len(refs) == 0 {
		t.Fatalf("feed: %v %v", refs, err)
	}
	if n, err := st.EnqueueFed(ctx, lane, refs); err != nil || n != len(refs) {
		t.Fatalf("EnqueueFed: %d of %d, %v", n, len(refs), err)
	}
	for _, r := range refs {
		want, err := tasks.NewUnitTask(r, lane)
		if err != nil {
			t.Fatal(err)
		}
		ti, err := insp.GetTaskInfo(lane, r.TaskID())
		if err != nil {
			t.Fatalf("asynq does not find unit %s: %v", r.TaskID(), err)
		}
		check(t, ti, tasks.TypeUnit, want.Payload(), lane, r.Timeout)
	}
	pending, err := insp.ListPendingTasks(lane)
	if err != nil || len(pending) != len(refs) {
		t.Fatalf("asynq lists %d pending units (%v), want %d", len(pending), err, len(refs))
	}
	queues, err := insp.Queues()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, q := range queues {
		seen[q] = true
	}
	if !seen[tasks.QueueInteractive] || !seen[lane] {
		t.Errorf("asynq lists queues %v, want %s and %s", queues, tasks.QueueInteractive, lane)
	}
}

func check(t *testing.T, ti *asynq.TaskInfo, typ string, payload []byte, queue string, timeout time.Duration) {
	t.Helper()
	if ti.Type != typ || !bytes.Equal(ti.Payload, payload) || ti.Queue != queue || ti.State != asynq.TaskStatePending {
		t.Errorf("task %s: type %s, queue %s, state %s, payload %s; want %s on %s, pending, %s", ti.ID, ti.Type, ti.Queue, ti.State, ti.Payload, typ, queue, payload)
	}
	if ti.MaxRetry != tasks.MaxRetry || ti.Timeout != timeout.Truncate(time.Second) {
		t.Errorf("task %s: max retry %d, timeout %s; want %d, %s", ti.ID, ti.MaxRetry, ti.Timeout, tasks.MaxRetry, timeout.Truncate(time.Second))
	}
}

// TestActiveReadsAsynq: Active lists what a real asynq server runs, as
// asynq.Inspector does, with the lease asynq's dequeue gave it (30 s from
// the dequeue, in whole seconds), and nothing once the task has ended.
func TestActiveReadsAsynq(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	enq := asynq.NewClientFromRedisClient(rdb)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	hold, started := make(chan struct{}), make(chan struct{}, 2)
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 2,
		Queues: map[string]int{tasks.QueueInteractive: 1, tasks.QueueBulk: 1}, TaskCheckInterval: 5 * time.Millisecond, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc("t", func(context.Context, *asynq.Task) error { started <- struct{}{}; <-hold; return nil })
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	before := time.Now()
	for _, q := range []string{tasks.QueueInteractive, tasks.QueueBulk} {
		if _, err := enq.EnqueueContext(ctx, asynq.NewTask("t", nil, asynq.TaskID("a-"+q), asynq.Queue(q))); err != nil {
			t.Fatal(err)
		}
	}
	<-started
	<-started
	after := time.Now()
	got, err := asynqdata.Active(ctx, rdb, tasks.QueueInteractive, tasks.QueueBulk, "idle")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("Active: %+v, want the 2 running tasks", got)
	}
	for _, a := range got {
		ts, err := insp.ListActiveTasks(a.Queue)
		if err != nil || len(ts) != 1 || ts[0].ID != a.ID || a.ID != "a-"+a.Queue {
			t.Errorf("Active listed %+v; asynq's inspector lists %v (%v)", a, ts, err)
		}
		lo, hi := before.Add(30*time.Second).Truncate(time.Second), after.Add(30*time.Second)
		if a.Lease.Before(lo) || a.Lease.After(hi) {
			t.Errorf("%s: lease %v, want 30 s after its dequeue (%v to %v)", a.ID, a.Lease, lo, hi)
		}
	}
	close(hold)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := asynqdata.Active(ctx, rdb, tasks.QueueInteractive, tasks.QueueBulk)
		if err == nil && len(got) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Active after the tasks ended: %+v %v, want none", got, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSolveTracedPayload holds the trace context's members to what
// json.Marshal writes of tasks.SolvePayload, by the fast path and by the
// escaping one, checks that they decode back, and that without a trace
// context the message is Solve's, byte for byte.
func TestSolveTracedPayload(t *testing.T) {
	t.Parallel()
	p := mustParse(t, sample8)
	l := testLimits()
	at := time.UnixMilli(1_700_000_000_000)
	const id = "0123456789abcdef0123456789abcdef"
	plain, err := asynqdata.Solve(id, "alice", p, tasks.QueueCheap, l, at)
	if err != nil {
		t.Fatal(err)
	}
	untraced, err := asynqdata.SolveTraced(id, "alice", p, tasks.QueueCheap, l, at, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(plain.Msg, untraced.Msg) {
		t.Fatalf("SolveTraced without a trace context wrote\n%q\nSolve wrote\n%q", untraced.Msg, plain.Msg)
	}
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, ts := range []string{"", "congo=t61rcWkgMzE", `odd="q\uote"`} {
		q, err := asynqdata.SolveTraced(id, "alice", p, tasks.QueueCheap, l, at, tp, ts)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(tasks.SolvePayload{Owner: "alice", Item: tasks.Item{ID: id, Request: p.Payload()}, At: at.UnixMilli(),
			TraceParent: tp, TraceState: ts})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(q.Msg, want) {
			t.Fatalf("tracestate %q: message\n%q\nlacks json.Marshal's payload\n%s", ts, q.Msg, want)
		}
		var got tasks.SolvePayload
		if err := tasks.DecodePayload(want, &got); err != nil || got.TraceParent != tp || got.TraceState != ts {
			t.Fatalf("tracestate %q: decoded %+v, %v", ts, got, err)
		}
	}
}
