package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// lineFixture is one key's line of parked runs on a store whose key
// prefix the test knows, with each parked run's asynq task written as
// asynq leaves a task it retried for a WaitError, in a queue of the
// test's own (the package's tests share one redis-server, and asynq's
// keys have no prefix).
type lineFixture struct {
	t      *testing.T
	s      *store.Store
	rdb    *redis.Client
	ctx    context.Context
	prefix string
	queue  string
}

func newLine(t *testing.T) *lineFixture {
	t.Helper()
	rdb := sharedServer(t).Client(t)
	tag := fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()), time.Now().UnixNano())
	prefix := "t:" + tag + ":"
	return &lineFixture{t: t, s: store.New(rdb, store.Options{Prefix: prefix, TaskTTL: time.Hour, ResultTTL: time.Hour}),
		rdb: rdb, ctx: context.Background(), prefix: prefix, queue: "q-" + tag}
}

// asynqKey is asynq's key of the fixture's queue with suffix (base.QueueKeyPrefix).
func (f *lineFixture) asynqKey(suffix string) string { return "asynq:{" + f.queue + "}:" + suffix }

// item is a batch item's run of owner "k1" under the fixture's queue.
func (f *lineFixture) item(id string) worker.SlotRun {
	return worker.SlotRun{Slot: "item-" + id, Owner: "k1", Solve: "s-" + id, CacheKey: "c-" + id, Queue: f.queue, AsynqID: id}
}

// single is a pending single task's run of owner "k1" under the
// fixture's queue (its record submitted).
func (f *lineFixture) single(id string) worker.SolveRun {
	f.t.Helper()
	if _, _, err := f.s.SubmitTask(f.ctx, store.NewTask{ID: id, Kind: "sweep", Owner: "k1", CacheKey: "c-" + id}, 0); err != nil {
		f.t.Fatal(err)
	}
	return worker.SolveRun{ID: id, Owner: "k1", Solve: "s-" + id, CacheKey: "c-" + id, Queue: f.queue, AsynqID: id}
}

// retried writes asynq task id as asynq's processor leaves one whose
// handler returned err: in the retry set (due in an hour) with state
// retry, and err's text as the message's error_msg (TaskMessage field 7,
// as protobuf writes a string under 128 bytes).
func (f *lineFixture) retried(id string, err error) {
	f.t.Helper()
	e := err.Error()
	if len(e) >= 128 {
		f.t.Fatalf("error message of %d bytes", len(e))
	}
	msg := "\x3a" + string(rune(len(e))) + e
	if err := f.rdb.HSet(f.ctx, f.asynqKey("t:"+id), "state", "retry", "msg", msg).Err(); err != nil {
		f.t.Fatal(err)
	}
	f.rdb.ZAdd(f.ctx, f.asynqKey("retry"), redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: id})
}

// park admits item id over the cap of 1 (it waits) and writes its
// asynq task as asynq's retry of its WaitError leaves it.
func (f *lineFixture) park(id string, cap int) {
	f.t.Helper()
	if a, err := f.s.AdmitSlot(f.ctx, f.item(id), cap); err != nil || a.Verdict != worker.VerdictWait {
		f.t.Fatalf("park %s: %+v, %v", id, a, err)
	}
	f.retried(id, &worker.WaitError{In: time.Hour})
}

func (f *lineFixture) state(id string) string {
	return f.rdb.HGet(f.ctx, f.asynqKey("t:"+id), "state").Val()
}

// hold takes one of k1's slots for a run without an asynq task.
func (f *lineFixture) hold(slot string, cap int) worker.SlotRun {
	f.t.Helper()
	r := worker.SlotRun{Slot: slot, Owner: "k1"}
	if a, err := f.s.AdmitSlot(f.ctx, r, cap); err != nil || a.Verdict != worker.VerdictRun {
		f.t.Fatalf("take k1's slot %s: %+v, %v", slot, a, err)
	}
	return r
}

// A run that a freed slot promotes gets that slot, even when a run of
// the same key that never waited asks first. Promotion used to push the
// task onto the tail of its queue's pending list (asynq takes from the
// head), so every task of the key already queued was taken before it,
// and the first of them took the slot while the promoted run, coming
// last, parked again: under a steady stream of the key's work, at each
// release, without bound. Now the freed slot is reserved for the promoted
// run (its member in the ":promoted" set counts against the cap of every
// other run, for one SolveLease), and the promoted task goes to the head
// of its queue, as asynq's own requeue puts an interrupted task back.
// Five rounds of a stream: each round's release promotes the run that
// waited longest, a fresh run asks first and waits, and the promoted run
// takes the slot.
func TestPromotedRunKeepsItsSlot(t *testing.T) {
	t.Parallel()
	for _, fresh := range []string{"batch item", "single task"} {
		t.Run(fresh, func(t *testing.T) {
			t.Parallel()
			f := newLine(t)
			holder := f.hold("other", 1)
			ids := []string{"p0", "p1", "p2", "p3", "p4"}
			for _, id := range ids {
				f.park(id, 1)
			}
			release := func() {
				t.Helper()
				if err := f.s.ReleaseSlot(f.ctx, holder); err != nil {
					t.Fatal(err)
				}
			}
			for i, id := range ids {
				// A run of k1 queued before this release, ahead of the
				// promoted one by arrival at the queue.
				f.rdb.LPush(f.ctx, f.asynqKey("pending"), fmt.Sprint("fresh", i))
				release()
				if st := f.state(id); st != "pending" {
					t.Fatalf("round %d: the release did not promote %s: %s", i, id, st)
				}
				if next := f.rdb.LIndex(f.ctx, f.asynqKey("pending"), -1).Val(); next != id {
					t.Fatalf("round %d: asynq takes %s next, not the promoted %s", i, next, id)
				}
				f.rdb.RPop(f.ctx, f.asynqKey("pending"))
				var v worker.Verdict
				if fresh == "single task" {
					a, err := f.s.Admit(f.ctx, f.single(fmt.Sprint("fresh", i)), 1)
					if err != nil {
						t.Fatal(err)
					}
					v = a.Verdict
				} else {
					a, err := f.s.AdmitSlot(f.ctx, worker.SlotRun{Slot: fmt.Sprint("fresh", i), Owner: "k1", Solve: "f", CacheKey: "f"}, 1)
					if err != nil {
						t.Fatal(err)
					}
					v = a.Verdict
				}
				if v != worker.VerdictWait {
					t.Fatalf("round %d: a fresh run took the slot freed for %s: %s", i, id, v)
				}
				if a, err := f.s.AdmitSlot(f.ctx, f.item(id), 1); err != nil || a.Verdict != worker.VerdictRun {
					t.Fatalf("round %d: the promoted %s: %+v, %v", i, id, a, err)
				}
				holder = f.item(id)
			}
			if n, err := f.s.Running(f.ctx, "k1"); err != nil || n != 1 {
				t.Fatalf("k1 holds %d slots (%v), want 1", n, err)
			}
		})
	}
}

// The reservation of a promoted run is bounded: one whose task never
// comes to its admission (its worker died after taking it, or its
// delivery ended before the gate) holds the slot for at most a
// SolveLease, as a run whose worker died holds its own; then any run
// takes it. The promotion's time is written back a lease and a second.
func TestPromotionReservationLapses(t *testing.T) {
	t.Parallel()
	f := newLine(t)
	holder := f.hold("other", 1)
	f.park("p0", 1)
	if err := f.s.ReleaseSlot(f.ctx, holder); err != nil {
		t.Fatal(err)
	}
	if st := f.state("p0"); st != "pending" {
		t.Fatalf("p0 not promoted: %s", st)
	}
	fresh := worker.SlotRun{Slot: "fresh", Owner: "k1", Solve: "f", CacheKey: "f"}
	if a, err := f.s.AdmitSlot(f.ctx, fresh, 1); err != nil || a.Verdict != worker.VerdictWait {
		t.Fatalf("while p0's reservation lasts: %+v, %v", a, err)
	}
	mk := f.prefix + "owner:k1:parked:promoted"
	at := time.Now().Add(-worker.SolveLease - time.Second).UnixMilli()
	if err := f.rdb.ZScore(f.ctx, mk, f.queue+"\tp0").Err(); err != nil {
		t.Fatalf("p0's promotion is not recorded in %s: %v", mk, err)
	}
	f.rdb.ZAdd(f.ctx, mk, redis.Z{Score: float64(at), Member: f.queue + "\tp0"})
	if a, err := f.s.AdmitSlot(f.ctx, fresh, 1); err != nil || a.Verdict != worker.VerdictRun {
		t.Fatalf("after p0's reservation lapsed: %+v, %v", a, err)
	}
	// p0, late, parks again.
	if a, err := f.s.AdmitSlot(f.ctx, f.item("p0"), 1); err != nil || a.Verdict != worker.VerdictWait || a.Place != 1 {
		t.Fatalf("p0 after its reservation lapsed: %+v, %v", a, err)
	}
}

// A raised cap (MAX_EXPENSIVE_PER_KEY changed and the workers restarted,
// or the default cap following a cluster that grew) used to leave the
// new slots empty until each parked run came back by its own retry delay
// (1-11 s, 1-30 s for a batch item): a promotion came only from a freed
// slot. Now a run that takes a slot while its key's slots (and
// reservations) are still under the cap promotes the next parked run, so
// the first run of the key to be admitted after the raise fills the new
// slots, one promotion per admission, and never past the cap.
func TestRaisedCapFillsFromTheLine(t *testing.T) {
	t.Parallel()
	for _, first := range []string{"batch item", "single task"} {
		t.Run(first, func(t *testing.T) {
			t.Parallel()
			f := newLine(t)
			f.hold("other", 1)
			var r0 worker.SolveRun
			if first == "single task" {
				r0 = f.single("p0")
				if a, err := f.s.Admit(f.ctx, r0, 1); err != nil || a.Verdict != worker.VerdictWait {
					t.Fatalf("park p0: %+v, %v", a, err)
				}
				f.retried("p0", &worker.WaitError{In: time.Hour})
			} else {
				f.park("p0", 1)
			}
			for _, id := range []string{"p1", "p2", "p3"} {
				f.park(id, 1)
			}
			// The cap is 3 now. p0 comes back by its delay and runs.
			f.rdb.ZRem(f.ctx, f.asynqKey("retry"), "p0")
			f.rdb.HSet(f.ctx, f.asynqKey("t:p0"), "state", "active")
			if first == "single task" {
				if a, err := f.s.Admit(f.ctx, r0, 3); err != nil || a.Verdict != worker.VerdictRun {
					t.Fatalf("p0 under the raised cap: %+v, %v", a, err)
				}
			} else if a, err := f.s.AdmitSlot(f.ctx, f.item("p0"), 3); err != nil || a.Verdict != worker.VerdictRun {
				t.Fatalf("p0 under the raised cap: %+v, %v", a, err)
			}
			if got := []string{f.state("p1"), f.state("p2")}; got[0] != "pending" || got[1] != "retry" {
				t.Fatalf("after p0's admission p1, p2 are %v; want p1 promoted into the third slot, p2 not", got)
			}
			if a, err := f.s.AdmitSlot(f.ctx, f.item("p1"), 3); err != nil || a.Verdict != worker.VerdictRun {
				t.Fatalf("p1: %+v, %v", a, err)
			}
			if st := f.state("p2"); st != "retry" {
				t.Fatalf("a promotion past the cap: p2 %s with 3 slots held", st)
			}
			if n, err := f.s.Running(f.ctx, "k1"); err != nil || n != 3 {
				t.Fatalf("k1 holds %d slots (%v), want 3", n, err)
			}
		})
	}
}
