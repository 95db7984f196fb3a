package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestWorkerHeartbeats: a worker's beats and held tasks as the watchdog
// reads them; a reap removes a silent worker, but not one that beat
// since the watchdog looked, and a beat after a reap makes the worker
// whole again.
func TestWorkerHeartbeats(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	a := worker.HeldTask{Queue: tasks.QueueInteractive, ID: "t1"}
	b := worker.HeldTask{Queue: tasks.QueueBulk, ID: "b1:c0"}
	if err := s.Beat(ctx, "w1", 1000, nil, nil, time.Minute, worker.Presence{Slots: 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Hold(ctx, "w1", map[string]worker.HeldTask{"1": a}, time.Minute); err != nil {
		t.Fatal(err)
	}
	// The same task under a second run token (a redelivery to the same
	// worker) is listed once.
	if err := s.Beat(ctx, "w1", 2000, map[string]worker.HeldTask{"1": a, "2": b, "3": a}, nil, time.Minute, worker.Presence{Slots: 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	held := func(w string) []worker.HeldTask {
		t.Helper()
		h, err := s.Held(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(h, func(x, y worker.HeldTask) int {
			if x.ID < y.ID {
				return -1
			}
			return 1
		})
		return h
	}
	if got := held("w1"); !slices.Equal(got, []worker.HeldTask{b, a}) {
		t.Fatalf("held %v, want %v and %v", got, b, a)
	}
	// Ended run tokens go with the next beat.
	if err := s.Beat(ctx, "w1", 3000, map[string]worker.HeldTask{"2": b}, []string{"1", "3"}, time.Minute, worker.Presence{Slots: 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := held("w1"); !slices.Equal(got, []worker.HeldTask{b}) {
		t.Fatalf("held after the ended tokens went %v, want %v", got, b)
	}
	p2 := worker.Presence{Slots: 3, Started: 4000, Running: map[string]int{tasks.TypeUnit: 2}}
	if err := s.Beat(ctx, "w2", 5000, nil, nil, time.Minute, p2, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Each worker's presence is its last beat's.
	presences := func() []worker.Presence {
		t.Helper()
		ps, err := s.Presences(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	p2.ID = "w2"
	if got := presences(); len(got) != 2 || got[0].ID != "w1" || got[0].Slots != 1 || got[0].Busy() != 0 ||
		got[1].ID != "w2" || got[1].Slots != 3 || got[1].Started != 4000 || got[1].Busy() != 2 || got[1].Running[tasks.TypeUnit] != 2 {
		t.Fatalf("presences %+v, want w1 idle with 1 slot and w2 running 2 units on 3", got)
	}
	ws, err := s.Workers(ctx)
	if err != nil || !slices.Equal(ws, []worker.WorkerBeat{{Worker: "w1", At: 3000}, {Worker: "w2", At: 5000}}) {
		t.Fatalf("workers %v %v", ws, err)
	}

	// A reap with an old beat time finds the worker alive.
	if ok, err := s.Reap(ctx, "w1", 2000); ok || err != nil {
		t.Fatalf("reap with a stale beat: %v %v, want refused", ok, err)
	}
	if ok, err := s.Reap(ctx, "w1", 3000); !ok || err != nil {
		t.Fatalf("reap: %v %v", ok, err)
	}
	if got := held("w1"); len(got) != 0 {
		t.Fatalf("held after the reap: %v", got)
	}
	if got := presences(); len(got) != 1 || got[0].ID != "w2" {
		t.Fatalf("presences after the reap: %+v, want w2's alone", got)
	}
	if ok, _ := s.Reap(ctx, "w1", 3000); ok {
		t.Fatal("reaped twice")
	}
	// It was only frozen: its next beat lists it and its tasks again.
	if err := s.Beat(ctx, "w1", 9000, map[string]worker.HeldTask{"2": b}, nil, time.Minute, worker.Presence{Slots: 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := held("w1"); !slices.Equal(got, []worker.HeldTask{b}) {
		t.Fatalf("held after coming back %v, want %v", got, b)
	}
	if err := s.Leave(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if ws, _ := s.Workers(ctx); !slices.Equal(ws, []worker.WorkerBeat{{Worker: "w2", At: 5000}}) {
		t.Fatalf("workers after w1 left: %v", ws)
	}
	if got := held("w1"); len(got) != 0 {
		t.Fatalf("held after leaving: %v", got)
	}
	if got := presences(); len(got) != 1 || got[0].ID != "w2" {
		t.Fatalf("presences after w1 left: %+v, want w2's alone", got)
	}
	// A worker that stops beating drops out when its presence expires,
	// before any watchdog reaps it.
	if err := s.Beat(ctx, "w2", 6000, nil, nil, time.Minute, p2, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(presences()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("w2's presence outlived its TTL: %+v", presences())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ws, _ := s.Workers(ctx); len(ws) != 1 {
		t.Fatalf("workers %v: the heartbeat itself stays for the watchdog", ws)
	}
}
