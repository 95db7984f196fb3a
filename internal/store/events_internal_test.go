package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestScriptsPublishWhatSubscribersRead runs every script that publishes
// on a real redis-server (finishManyScript, finishSolveScript,
// cancelSolveScript, finishChunkScript, finishUnitScript,
// cancelItemsScript) and reads both channels raw: each message on the
// events channel is, up to its first space, the Hub key that the API
// waits on (TaskEventKey, ChunkEventKey, BatchEventKey), and the Hub
// that ListenEvents feeds wakes that waiter; each message on the cancels
// channel is the ID of the task or item to stop, as ListenCancels hands
// it on. Nothing else is published.
func TestScriptsPublishWhatSubscribersRead(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(rdb, Options{Prefix: "ev:", TaskTTL: time.Hour, ResultTTL: time.Hour})

	raw := rdb.Subscribe(ctx, s.k.events(), s.k.cancels())
	defer raw.Close()
	for range 2 {
		if _, err := raw.Receive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	hub := NewHub()
	go s.ListenEvents(ctx, hub)
	canceled := make(chan string, 16)
	go s.ListenCancels(ctx, func(id string) { canceled <- id })
	for deadline := time.Now().Add(5 * time.Second); ; {
		n, err := rdb.PubSubNumSub(ctx, s.k.events(), s.k.cancels()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n[s.k.events()] == 2 && n[s.k.cancels()] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the listeners did not subscribe: %v", n)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// step runs fn and returns what it published on each channel: a mark
	// published after it comes after them (pub/sub delivers in order).
	// ran then says whether fn ran a script.
	steps := 0
	step := func(fn func()) (events, cancels []string) {
		t.Helper()
		// No script is cached before fn, so that ran tells which fn ran.
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		fn()
		steps++
		mark := fmt.Sprintf("|mark %d", steps)
		if err := rdb.Publish(ctx, s.k.events(), mark).Err(); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := raw.ReceiveMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case m.Payload == mark:
				return events, cancels
			case m.Channel == s.k.events():
				events = append(events, m.Payload)
			default:
				cancels = append(cancels, m.Payload)
			}
		}
	}
	// expect checks that events are, by their keys, want, and that the
	// Hub woke each key's waiter (woken after step has returned).
	type waiter struct {
		key string
		w   *Wake
	}
	wait := func(keys ...string) []waiter {
		var ws []waiter
		for _, k := range keys {
			w, release := hub.Subscribe(k)
			t.Cleanup(release)
			ws = append(ws, waiter{k, w})
		}
		return ws
	}
	expect := func(what string, events []string, ws []waiter) {
		t.Helper()
		var got, want []string
		for _, e := range events {
			k, _, _ := strings.Cut(e, " ")
			got = append(got, k)
		}
		for _, w := range ws {
			want = append(want, w.key)
			select {
			case <-w.w.C:
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: the Hub did not wake %q; published %q", what, w.key, events)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: published %q, want %q", what, got, want)
		}
	}
	ran := func(what string, sc *redis.Script, want bool) {
		t.Helper()
		if ok, err := rdb.ScriptExists(ctx, sc.Hash()).Result(); err != nil || ok[0] != want {
			t.Fatalf("%s ran the script: %v, want %v (%v)", what, ok, want, err)
		}
	}

	// A single task ends (finishManyScript): its event carries its record.
	if _, _, err := s.SubmitTask(ctx, NewTask{ID: "t1", Kind: "sliding"}, 0); err != nil {
		t.Fatal(err)
	}
	ws := wait(TaskEventKey("t1"))
	events, cancels := step(func() {
		if _, err := s.Finish(ctx, []worker.Transition{{ID: "t1", State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":1}`)}}, nil); err != nil {
			t.Fatal(err)
		}
	})
	ran("Finish", finishManyScript, true)
	expect("Finish", events, ws)
	if rec := DecodeEventTask("t1", ws[0].w.Data()); rec == nil || rec.State != apitype.TaskStateCompleted {
		t.Fatalf("the task's event carried %+v", rec)
	}

	// A solve ends (finishSolveScript).
	if _, _, err := s.SubmitTask(ctx, NewTask{ID: "t2", Kind: "sliding"}, 0); err != nil {
		t.Fatal(err)
	}
	ws = wait(TaskEventKey("t2"))
	events, more := step(func() {
		if _, _, err := s.FinishSolve(ctx, worker.SolveRun{ID: "t2", Solve: "solve-2", CacheKey: "ck2"},
			worker.Transition{ID: "t2", State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":2}`)}); err != nil {
			t.Fatal(err)
		}
	})
	ran("FinishSolve", finishSolveScript, true)
	expect("FinishSolve", events, ws)
	cancels = append(cancels, more...)

	// A running single task is canceled (cancelSolveScript).
	events, more = step(func() {
		if err := s.announceCancel(ctx, "t3", apitype.TaskStateActive); err != nil {
			t.Fatal(err)
		}
	})
	ran("announceCancel", cancelSolveScript, true)
	expect("announceCancel", events, nil)
	cancels = append(cancels, more...)

	// A batch of stride 2: chunk 0 holds two cheap items, chunk 1 an own
	// item (2) and a cheap one (3).
	id := fmt.Sprintf("%032x", 29)
	w := s.NewBatchWriter(id, 2)
	for i, it := range []StagedItem{
		{Kind: "sliding", Request: []byte(`{"i":0}`), Timeout: time.Minute},
		{Kind: "sliding", Request: []byte(`{"i":1}`), Timeout: time.Minute},
		{Kind: "sweep", Request: []byte(`{"i":2}`), Own: true, Timeout: time.Minute},
		{Kind: "sliding", Request: []byte(`{"i":3}`), Timeout: time.Minute},
	} {
		if err := w.Add(ctx, it); err != nil {
			t.Fatalf("add %d: %v", i, err)
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitBatch(ctx, w, CommitBatch{ID: id, Owner: "alice"}); err != nil {
		t.Fatal(err)
	}
	start := func(unit string) (tasks.UnitRef, *worker.UnitWork) {
		t.Helper()
		ref := tasks.UnitRef{BatchID: id, Unit: unit}
		uw, err := s.StartUnit(ctx, ref)
		if err != nil || len(uw.Items) == 0 {
			t.Fatalf("start %s: %+v %v", unit, uw, err)
		}
		return ref, uw
	}

	// Chunk 0's first delivery ends in one call (finishChunkScript).
	c0, uw := start("c0")
	ws = wait(ChunkEventKey(id, 0))
	events, more = step(func() {
		outs := []worker.ItemOutcome{
			{Index: 0, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":0}`)},
			{Index: 1, State: apitype.TaskStateFailed, Code: apitype.CodeTimeout, Msg: "too slow"},
		}
		if n, err := s.FinishUnit(ctx, c0, uw.Mark, outs); err != nil || n != 2 {
			t.Fatalf("finish c0: %d %v", n, err)
		}
	})
	ran("FinishUnit of a chunk", finishChunkScript, true)
	ran("FinishUnit of a chunk", finishUnitScript, false)
	expect("FinishUnit of a chunk", events, ws)
	cancels = append(cancels, more...)

	// The own item ends (finishUnitScript).
	x2, uw := start("x2")
	ws = wait(ChunkEventKey(id, 1))
	events, more = step(func() {
		outs := []worker.ItemOutcome{{Index: 2, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":2}`)}}
		if n, err := s.FinishUnit(ctx, x2, uw.Mark, outs); err != nil || n != 1 {
			t.Fatalf("finish x2: %d %v", n, err)
		}
	})
	ran("FinishUnit of an own item", finishUnitScript, true)
	expect("FinishUnit of an own item", events, ws)
	cancels = append(cancels, more...)

	// The last item, running, is canceled (cancelItemsScript): its chunk's
	// event, the batch's, and the item's ID on the cancels channel.
	start("c1")
	b, err := s.GetBatch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ws = wait(ChunkEventKey(id, 1), BatchEventKey(id))
	events, more = step(func() {
		if prev, err := s.CancelItem(ctx, b, 3); err != nil || prev != apitype.TaskStateActive {
			t.Fatalf("cancel item 3: %q %v", prev, err)
		}
	})
	ran("CancelItem", cancelItemsScript, true)
	expect("CancelItem", events, ws)
	cancels = append(cancels, more...)

	if want := []string{"t3", apitype.ItemID(id, 3)}; !slices.Equal(cancels, want) {
		t.Fatalf("the cancels channel carried %q, want %q", cancels, want)
	}
	for _, want := range []string{"t3", apitype.ItemID(id, 3)} {
		select {
		case got := <-canceled:
			if got != want {
				t.Fatalf("ListenCancels handed on %q, want %q", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("ListenCancels did not hand on %q", want)
		}
	}
}
