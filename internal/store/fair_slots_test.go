package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/worker"
)

// The cluster's solver slots S come from the workers' entries in Redis
// (Store.RegisterSlots), read by the script that decides, not from what
// the asking worker last saw: workers that start together each count at
// once.

func (f *lineFixture) register(workerID string, slots int, ttl time.Duration) int {
	f.t.Helper()
	n, err := f.s.RegisterSlots(f.ctx, workerID, slots, ttl)
	if err != nil {
		f.t.Fatalf("register %d slots of %s: %v", slots, workerID, err)
	}
	return n
}

func (f *lineFixture) clusterSlots() int {
	f.t.Helper()
	n, err := f.s.ClusterSlots(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// S is the sum of the live entries: it grows as workers register,
// shrinks when one leaves, is reaped, or lets its entry expire, and a
// run's own Slots counts only while no entry is live.
func TestFairSlotsFollowRegistration(t *testing.T) {
	t.Parallel()
	f := newLine(t)
	// No worker registered: the run's Slots (1) is S.
	f.admitFair("a", "a0", 1, worker.VerdictRun)
	f.admitFair("a", "a1", 1, worker.VerdictWait)

	if n := f.register("w1", 2, time.Hour); n != 2 {
		t.Fatalf("first worker of 2 slots: S %d, want 2", n)
	}
	if n := f.register("w2", 3, time.Hour); n != 5 {
		t.Fatalf("second worker of 3 slots: S %d, want 5", n)
	}
	if n := f.register("w2", 3, time.Hour); n != 5 {
		t.Fatalf("second worker's beat: S %d, want 5 (counted once)", n)
	}
	// Runs that still ask with Slots 1 take the 5: S is Redis's. (The
	// registrations promoted a1, which takes its slot now.)
	f.admitFair("a", "a1", 1, worker.VerdictRun)
	for i := 2; i < 5; i++ {
		f.admitFair("a", fmt.Sprint("a", i), 1, worker.VerdictRun)
	}
	f.admitFair("a", "a5", 1, worker.VerdictWait)
	if h := f.held("a"); h != 5 {
		t.Fatalf("a alone on 5 registered slots holds %d", h)
	}

	// A worker whose entry expires leaves S, and its entry leaves the hash.
	if n := f.register("w3", 4, 150*time.Millisecond); n != 9 {
		t.Fatalf("third worker of 4 slots: S %d, want 9", n)
	}
	time.Sleep(300 * time.Millisecond)
	if n := f.clusterSlots(); n != 5 {
		t.Fatalf("after w3's entry expired: S %d, want 5", n)
	}
	f.admitFair("a", "a6", 1, worker.VerdictWait) // the script's read drops it
	if ok, err := f.rdb.HExists(f.ctx, f.prefix+"gate:slots", "w3").Result(); err != nil || ok {
		t.Fatalf("w3's expired entry still in the hash: %v, %v", ok, err)
	}

	// Leave and Reap take a worker out at once.
	if err := f.s.Leave(f.ctx, "w2"); err != nil {
		t.Fatal(err)
	}
	if n := f.clusterSlots(); n != 2 {
		t.Fatalf("after w2 left: S %d, want 2", n)
	}
	if err := f.s.Beat(f.ctx, "w1", 1000, nil, nil, time.Minute, worker.Presence{}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.s.Reap(f.ctx, "w1", 1000); err != nil || !ok {
		t.Fatalf("reap w1: %v, %v", ok, err)
	}
	if n := f.clusterSlots(); n != 0 {
		t.Fatalf("after w1 was reaped: S %d, want 0", n)
	}
	// With no entry live, the run's own Slots is S again: a holds 5 and
	// a5's promotion reserves a sixth, so a run asking with 7 takes the
	// seventh, and the next waits.
	f.admitFair("a", "a7", 7, worker.VerdictRun)
	f.admitFair("a", "a8", 7, worker.VerdictWait)
}

// A worker that registers promotes parked runs at once, one per slot it
// adds, to the most under-served keys; a beat that adds nothing promotes
// nothing.
func TestFairRegisteringWorkerPromotesParked(t *testing.T) {
	t.Parallel()
	f := newLine(t)
	f.register("w1", 2, time.Hour)
	f.admitFair("a", "a0", 2, worker.VerdictRun)
	f.admitFair("a", "a1", 2, worker.VerdictRun)
	for _, id := range []string{"a2", "a3", "a4"} {
		f.admitFair("a", id, 2, worker.VerdictWait)
	}
	f.admitFair("b", "b0", 2, worker.VerdictWait)
	for _, id := range []string{"a2", "a3", "a4", "b0"} {
		if st := f.state(id); st != "retry" {
			t.Fatalf("before the second worker: %s is %s, want retry (parked)", id, st)
		}
	}
	// w1's beat adds nothing.
	if n := f.register("w1", 2, time.Hour); n != 2 {
		t.Fatalf("w1's beat: S %d, want 2", n)
	}
	if st := f.state("b0"); st != "retry" {
		t.Fatalf("a beat that adds no slot promoted b0: %s", st)
	}
	// w2 adds 2 slots: b (holding none) and then a's longest-parked run
	// are promoted, nothing more.
	if n := f.register("w2", 2, time.Hour); n != 4 {
		t.Fatalf("w2 registered: S %d, want 4", n)
	}
	want := map[string]string{"b0": "pending", "a2": "pending", "a3": "retry", "a4": "retry"}
	for id, st := range want {
		if got := f.state(id); got != st {
			t.Errorf("after w2 registered: %s is %s, want %s", id, got, st)
		}
	}
	// The promoted runs take the new slots (their reservations are theirs).
	f.admitFair("b", "b0", 2, worker.VerdictRun)
	f.admitFair("a", "a2", 2, worker.VerdictRun)
	if a, b := f.held("a"), f.held("b"); a != 3 || b != 1 {
		t.Fatalf("on 4 slots: a holds %d, b %d; want 3 and 1", a, b)
	}
}
