package store_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// The keys with expensive work share the cluster's solver slots by
// weighted max-min fairness (store's fairLua). These tests drive the
// gate's scripts directly on a real redis-server, with the parked runs'
// asynq tasks written as asynq leaves a task it retried for a WaitError.

// fairItem is a batch item's run of owner on a cluster of slots solver
// slots, parked under the fixture's queue.
func (f *lineFixture) fairItem(owner, id string, slots int) worker.SlotRun {
	return worker.SlotRun{Slot: "item-" + id, Owner: owner, Solve: "s-" + id, CacheKey: "c-" + id, Queue: f.queue, AsynqID: id, Slots: slots}
}

// admitFair admits owner's item id on slots solver slots and checks the
// verdict; a run told to wait is written as asynq's retry leaves it.
func (f *lineFixture) admitFair(owner, id string, slots int, want worker.Verdict) {
	f.t.Helper()
	a, err := f.s.AdmitSlot(f.ctx, f.fairItem(owner, id, slots), 0)
	if err != nil || a.Verdict != want {
		f.t.Fatalf("admit %s's %s on %d slots: %+v, %v; want %s", owner, id, slots, a, err, want)
	}
	if want == worker.VerdictWait {
		f.retried(id, &worker.WaitError{In: time.Hour})
	}
}

func (f *lineFixture) held(owner string) int {
	f.t.Helper()
	n, err := f.s.Running(f.ctx, owner)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// A key alone takes every slot of the cluster, not half of them, and the
// run beyond them waits.
func TestFairLoneKeyTakesEverySlot(t *testing.T) {
	t.Parallel()
	f := newLine(t)
	const slots = 6
	for i := range slots {
		f.admitFair("a", fmt.Sprint("a", i), slots, worker.VerdictRun)
	}
	f.admitFair("a", "a-over", slots, worker.VerdictWait)
	if n := f.held("a"); n != slots {
		t.Fatalf("a alone holds %d of %d slots", n, slots)
	}
}

// Under competition each freed slot goes to the waiting key that holds
// the fewest slots per unit of weight, even when another key's run has
// waited longer; a key of weight 3 ends up with three times the slots of
// a key of weight 1; a fresh run of a key at its share waits beside a
// free slot reserved for the other key.
func TestFairFreedSlotGoesToTheMostUnderServedKey(t *testing.T) {
	t.Parallel()
	f := newLine(t)
	const slots = 4
	if err := f.s.SetWeights(f.ctx, map[string]int{"a": 1, "b": 3}); err != nil {
		t.Fatal(err)
	}
	// a, alone, takes every slot; its fifth run waits first of all.
	for i := range slots {
		f.admitFair("a", fmt.Sprint("a", i), slots, worker.VerdictRun)
	}
	f.admitFair("a", "a-early", slots, worker.VerdictWait)
	for i := range 3 {
		f.admitFair("b", fmt.Sprint("b", i), slots, worker.VerdictWait)
	}
	// Each of a's first three slots that frees goes to b (shares: a 1,
	// b 3), though a-early has waited longest.
	for i := range 3 {
		if err := f.s.ReleaseSlot(f.ctx, f.fairItem("a", fmt.Sprint("a", i), slots)); err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprint("b", i)
		if st := f.state(id); st != "pending" {
			t.Fatalf("release %d: b's %s not promoted: %s (a-early: %s)", i, id, st, f.state("a-early"))
		}
		if st := f.state("a-early"); st != "retry" {
			t.Fatalf("release %d: a-early promoted over b: %s", i, st)
		}
		// A fresh run of a asks before the promoted one comes: the slot is
		// b's.
		f.admitFair("a", fmt.Sprint("a-fresh", i), slots, worker.VerdictWait)
		f.admitFair("b", id, slots, worker.VerdictRun)
	}
	if a, b := f.held("a"), f.held("b"); a != 1 || b != 3 {
		t.Fatalf("weights 1 and 3 on %d slots: a holds %d, b %d; want 1 and 3", slots, a, b)
	}
	// b's next run waits at its share; a slot b frees goes back to a's
	// longest-waiting run only when a is the one under its share.
	f.admitFair("b", "b3", slots, worker.VerdictWait)
	if err := f.s.ReleaseSlot(f.ctx, f.fairItem("a", "a3", slots)); err != nil {
		t.Fatal(err)
	}
	if st, st3 := f.state("a-early"), f.state("b3"); st != "pending" || st3 != "retry" {
		t.Fatalf("a's slot freed with a at 0 of 1: a-early %s, b3 %s; want a-early promoted", st, st3)
	}
	f.admitFair("a", "a-early", slots, worker.VerdictRun)
	// Everything ends; every count returns to 0.
	for _, r := range []worker.SlotRun{f.fairItem("a", "a-early", slots), f.fairItem("b", "b0", slots), f.fairItem("b", "b1", slots), f.fairItem("b", "b2", slots)} {
		if err := f.s.ReleaseSlot(f.ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"b3", "a-fresh0", "a-fresh1", "a-fresh2"} {
		if st := f.state(id); st != "pending" {
			t.Fatalf("after every release: %s %s, want promoted", id, st)
		}
		owner := id[:1]
		f.admitFair(owner, id, slots, worker.VerdictRun)
		if err := f.s.ReleaseSlot(f.ctx, f.fairItem(owner, id, slots)); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range []string{"a", "b"} {
		if h, err := f.s.Running(f.ctx, o); err != nil || h != 0 {
			t.Errorf("%s holds %d slots at the end (%v)", o, h, err)
		}
		if p, err := f.s.Parked(f.ctx, o); err != nil || p != 0 {
			t.Errorf("%s has %d parked runs at the end (%v)", o, p, err)
		}
	}
	if uses, err := f.s.SlotUses(f.ctx); err != nil || len(uses) != 0 {
		t.Errorf("keys still registered with expensive work: %+v (%v)", uses, err)
	}
}

// A key that wants less than its share leaves the rest to the others
// (water-filling on demand): with a holding one slot and nothing more to
// run, b takes all the others.
func TestFairSmallDemandLeavesTheRest(t *testing.T) {
	t.Parallel()
	f := newLine(t)
	const slots = 6
	f.admitFair("a", "a0", slots, worker.VerdictRun)
	for i := range slots - 1 {
		f.admitFair("b", fmt.Sprint("b", i), slots, worker.VerdictRun)
	}
	f.admitFair("b", "b-over", slots, worker.VerdictWait)
	if a, b := f.held("a"), f.held("b"); a != 1 || b != slots-1 {
		t.Fatalf("a holds %d, b %d; want 1 and %d", a, b, slots-1)
	}
	// a asks for more: the cluster is full, so it waits, and the next
	// slot b frees goes to a (b holds more than its share of 3).
	f.admitFair("a", "a1", slots, worker.VerdictWait)
	if err := f.s.ReleaseSlot(f.ctx, f.fairItem("b", "b0", slots)); err != nil {
		t.Fatal(err)
	}
	if st, sb := f.state("a1"), f.state("b-over"); st != "pending" || sb != "retry" {
		t.Fatalf("b freed a slot: a1 %s, b-over %s; want a1 promoted", st, sb)
	}
}

// Two workers racing for the last free slot never both take it: of two
// runs of different keys admitted at the same moment, one runs and one
// waits, round after round, and the slots held never exceed the cluster's.
func TestFairLastSlotIsTakenOnce(t *testing.T) {
	t.Parallel()
	f := newLine(t)
	const slots = 3
	f.admitFair("c", "c0", slots, worker.VerdictRun)
	f.admitFair("c", "c1", slots, worker.VerdictRun)
	for round := range 40 {
		var wg sync.WaitGroup
		verdicts := make([]worker.Verdict, 2)
		for i, owner := range []string{"a", "b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a, err := f.s.AdmitSlot(f.ctx, f.fairItem(owner, fmt.Sprint(owner, round), slots), 0)
				if err != nil {
					t.Error(err)
				}
				verdicts[i] = a.Verdict
			}()
		}
		wg.Wait()
		runs := 0
		var winner string
		for i, v := range verdicts {
			if v == worker.VerdictRun {
				runs++
				winner = []string{"a", "b"}[i]
			}
		}
		if runs != 1 {
			t.Fatalf("round %d: %v for the last slot, want one run", round, verdicts)
		}
		if h := f.held("a") + f.held("b") + f.held("c"); h != slots {
			t.Fatalf("round %d: %d slots held of %d", round, h, slots)
		}
		if err := f.s.ReleaseSlot(f.ctx, f.fairItem(winner, fmt.Sprint(winner, round), slots)); err != nil {
			t.Fatal(err)
		}
	}
}

// Parking counts the parked runs whose asynq task sits in its queue's
// retry set, per queue and per key: not one that asynq has not moved
// there yet (its run was just told to wait), nor one a freed slot
// promoted onto its pending list.
func TestParkingCountsRunsWaitingInTheRetrySet(t *testing.T) {
	t.Parallel()
	f := newLine(t)
	const slots = 2
	f.admitFair("a", "a0", slots, worker.VerdictRun)
	f.admitFair("a", "a1", slots, worker.VerdictRun)
	f.admitFair("a", "a-wait1", slots, worker.VerdictWait)
	time.Sleep(30 * time.Millisecond)
	f.admitFair("a", "a-wait2", slots, worker.VerdictWait)
	f.admitFair("b", "b-wait1", slots, worker.VerdictWait)
	// Told to wait, not yet in the retry set: asynq still has it active.
	if a, err := f.s.AdmitSlot(f.ctx, f.fairItem("b", "b-active", slots), 0); err != nil || a.Verdict != worker.VerdictWait {
		t.Fatalf("admit b's b-active: %+v, %v", a, err)
	}
	// A task retried after an error sits in the same retry set.
	f.retried("failed", errors.New("tasks: a handler error"))
	p, err := f.s.Parking(f.ctx, f.queue, "no-such-queue")
	if err != nil {
		t.Fatal(err)
	}
	if p.ByQueue[f.queue] != 3 || p.ByOwner["a"] != 2 || p.ByOwner["b"] != 1 || len(p.ByQueue) != 1 {
		t.Fatalf("parking %+v, want 3 on the queue: a 2, b 1", p)
	}
	if n, ok := p.Retry[f.queue]; !ok || n != 4 || len(p.Retry) != 1 {
		t.Fatalf("retry sets %v, want the queue's 4: 3 waiting and the failed task", p.Retry)
	}
	if o := p.Oldest[f.queue]; o < 30*time.Millisecond || o > time.Minute {
		t.Fatalf("the oldest waited %s, want at least 30ms", o)
	}
	// a frees a slot: b, under its share, gets it, and its run leaves
	// the retry set for the pending list.
	if err := f.s.ReleaseSlot(f.ctx, f.fairItem("a", "a0", slots)); err != nil {
		t.Fatal(err)
	}
	if st := f.state("b-wait1"); st != "pending" {
		t.Fatalf("b's parked run is %q after a freed a slot, want pending", st)
	}
	if p, err = f.s.Parking(f.ctx); err != nil {
		t.Fatal(err)
	}
	if p.ByQueue[f.queue] != 2 || p.ByOwner["a"] != 2 || p.ByOwner["b"] != 0 {
		t.Fatalf("parking after the promotion %+v, want a's 2", p)
	}
	uses, err := f.s.SlotUses(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]store.SlotUse{}
	for _, u := range uses {
		got[u.Owner] = u
	}
	if got["a"].Held != 1 || got["a"].Waiting != 2 || got["b"].Waiting != 0 || len(got) != 2 {
		t.Fatalf("slot uses %+v, want a holding 1 with 2 waiting, b none waiting", uses)
	}
}
