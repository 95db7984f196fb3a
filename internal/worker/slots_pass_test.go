package worker_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// waitParked waits until owner has n parked runs, each in asynq's retry
// set: a run told to wait a moment ago that asynq has not moved there yet
// is skipped by a promotion (it asks again after a second by itself,
// which the hour's delay of these tests forbids).
func (f *unitFixture) waitParked(t *testing.T, owner string, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		c, err := f.store.Parked(f.ctx, owner)
		if err != nil {
			t.Fatal(err)
		}
		if c == n && f.allRetrying(t, "pq:owner:"+owner+":parked") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d parked runs after 20 s, want %d", owner, c, n)
		}
	}
}

// allRetrying reports whether every member of the parked set pk names an
// asynq task in state retry.
func (f *unitFixture) allRetrying(t *testing.T, pk string) bool {
	t.Helper()
	ms, err := f.rdb.ZRange(f.ctx, pk, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		q, id, _ := strings.Cut(m, "\t")
		if st, _ := f.rdb.HGet(f.ctx, "asynq:{"+q+"}:t:"+id, "state").Result(); st != "retry" {
			return false
		}
	}
	return true
}

// A promoted run that finds it needs no slot after all (its item or task
// was canceled while it was parked) passes the slot on to the next
// parked run: otherwise the key's other parked work would wait out its
// retry delay (here an hour), as if no slot had been freed.
func TestPromotionSkipsRunsThatNeedNoSlot(t *testing.T) {
	t.Parallel()
	hold := worker.SlotRun{Slot: "other", Owner: "k1"}
	for _, tc := range []struct {
		name string
		// park parks three runs of k1 that then need no slot; it runs
		// with the server serving and k1's one slot held.
		park func(t *testing.T, f *unitFixture, client *asynq.Client, boards []string)
	}{
		{"batch canceled", func(t *testing.T, f *unitFixture, client *asynq.Client, boards []string) {
			f.stageOwned(t, "a", "k1", boards)
			if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, 10, 10); err != nil {
				t.Fatal(err)
			}
			f.waitParked(t, "k1", len(boards))
			if _, err := f.store.CancelBatch(f.ctx, "a", "k1"); err != nil {
				t.Fatal(err)
			}
		}},
		{"items canceled", func(t *testing.T, f *unitFixture, client *asynq.Client, boards []string) {
			f.stageOwned(t, "a", "k1", boards)
			if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, 10, 10); err != nil {
				t.Fatal(err)
			}
			f.waitParked(t, "k1", len(boards))
			b, err := f.store.GetBatch(f.ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			for i := range boards {
				if prev, err := f.store.CancelItem(f.ctx, b, i); err != nil || prev != apitype.TaskStatePending {
					t.Fatalf("cancel item %d: %s, %v", i, prev, err)
				}
			}
		}},
		{"items joined a solve in flight", func(t *testing.T, f *unitFixture, client *asynq.Client, boards []string) {
			// Another key's single task is solving each board; the
			// batch items park for k1's slot first, and on promotion
			// find the identical solve and wait for it, taking no slot.
			f.stageOwned(t, "a", "k1", boards)
			if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, 10, 10); err != nil {
				t.Fatal(err)
			}
			f.waitParked(t, "k1", len(boards))
			for i, req := range boards {
				p := mustParse(t, req)
				id := fmt.Sprint("k2-", i)
				if _, _, err := f.store.SubmitTask(f.ctx, store.NewTask{ID: id, Kind: string(p.Kind()), Owner: "k2", CacheKey: p.Key()}, 0); err != nil {
					t.Fatal(err)
				}
				r := worker.SolveRun{ID: id, Owner: "k2", Solve: worker.SolveKey(p), CacheKey: p.Key()}
				if a, err := f.store.Admit(f.ctx, r, 0); err != nil || a.Verdict != worker.VerdictRun {
					t.Fatalf("k2's solve of board %d: %+v, %v", i, a, err)
				}
			}
		}},
		{"single tasks canceled", func(t *testing.T, f *unitFixture, client *asynq.Client, boards []string) {
			for i, req := range boards {
				f.enqueueSingle(t, client, fmt.Sprint("s", i), "k1", req)
			}
			f.waitParked(t, "k1", len(boards))
			for i := range boards {
				if prev, err := f.store.Cancel(f.ctx, fmt.Sprint("s", i), "k1"); err != nil || prev != apitype.TaskStatePending {
					t.Fatalf("cancel s%d: %s, %v", i, prev, err)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newUnitFixture(t)
			h := worker.NewHandler(f.store, nil, testLimits(), worker.NewMetrics(prometheus.NewRegistry()), nil)
			h.SetGate(f.store, func() int { return 1 })
			client := asynq.NewClientFromRedisClient(f.rdb)
			if a, err := f.store.AdmitSlot(f.ctx, hold, 1); err != nil || a.Verdict != worker.VerdictRun {
				t.Fatalf("take k1's slot: %+v, %v", a, err)
			}
			f.slotServer(t, h, 4)
			boards := sweeps(t, 5)

			// Three runs park first and then need no slot; batch b's
			// two searches park behind them.
			tc.park(t, f, client, boards[:3])
			f.stageOwned(t, "b", "k1", boards[3:])
			if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, 10, 10); err != nil {
				t.Fatal(err)
			}
			f.waitParked(t, "k1", 5)

			if err := f.store.ReleaseSlot(f.ctx, hold); err != nil {
				t.Fatal(err)
			}
			b := f.waitDone(t, "b")
			if got := b.Counts[apitype.TaskStateCompleted]; got != 2 {
				t.Fatalf("b: %v", b.Counts)
			}
			f.waitParked(t, "k1", 0)
		})
	}
}

// A run over its key's cap, or a batch item behind an identical solve in
// flight, on its last delivery (its retries spent on infrastructure
// errors, here none allowed) is not failed for waiting: asynq archives a
// task that errs on its last delivery whatever the error, so that
// delivery takes its slot over the cap, and solves alone, instead.
func TestLastDeliveryIsNotFailedForWaiting(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"item over the cap", "single over the cap", "item behind a solve"} {
		single := mode == "single over the cap"
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			f := newUnitFixture(t)
			h := worker.NewHandler(f.store, nil, testLimits(), worker.NewMetrics(prometheus.NewRegistry()), nil)
			h.SetGate(f.store, func() int { return 1 })
			client := asynq.NewClientFromRedisClient(f.rdb)
			board := sweeps(t, 1)[0]
			hold := worker.SlotRun{Slot: "other", Owner: "k1"}
			if mode == "item behind a solve" {
				// Another key's single task solves the same board (and
				// never ends here): the item would wait for it.
				p := mustParse(t, board)
				if _, _, err := f.store.SubmitTask(f.ctx, store.NewTask{ID: "k2-0", Kind: string(p.Kind()), Owner: "k2", CacheKey: p.Key()}, 0); err != nil {
					t.Fatal(err)
				}
				r := worker.SolveRun{ID: "k2-0", Owner: "k2", Solve: worker.SolveKey(p), CacheKey: p.Key()}
				if a, err := f.store.Admit(f.ctx, r, 0); err != nil || a.Verdict != worker.VerdictRun {
					t.Fatalf("k2's solve: %+v, %v", a, err)
				}
			}
			if a, err := f.store.AdmitSlot(f.ctx, hold, 1); err != nil || a.Verdict != worker.VerdictRun {
				t.Fatalf("take k1's slot: %+v, %v", a, err)
			}
			f.slotServer(t, h, 2)
			get := func() *store.Task {
				if single {
					tk, err := f.store.Get(f.ctx, "s0")
					if err != nil {
						t.Fatal(err)
					}
					return tk
				}
				return f.item(t, "b1", 0)
			}
			if single {
				f.enqueueSingle(t, client, "s0", "k1", board, asynq.MaxRetry(0))
			} else {
				f.stageOwned(t, "b1", "k1", []string{board})
				task, err := tasks.NewUnitTask(tasks.UnitRef{BatchID: "b1", Unit: tasks.OwnUnit(0), Timeout: time.Minute}, tasks.QueueBulk)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := client.Enqueue(task, asynq.MaxRetry(0)); err != nil {
					t.Fatal(err)
				}
			}
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				tk := get()
				if tk.State == apitype.TaskStateCompleted {
					break
				}
				if tk.State == apitype.TaskStateFailed || time.Now().After(deadline) {
					t.Fatalf("a run over the cap on its last delivery: %s (%s %s), want completed", tk.State, tk.ErrCode, tk.ErrMsg)
				}
			}
			if err := f.store.ReleaseSlot(f.ctx, hold); err != nil {
				t.Fatal(err)
			}
			f.waitParked(t, "k1", 0)
		})
	}
}

// Only a run that a freed slot promoted hands a slot on when it takes
// none: one that came back by its retry delay (or from a solve's parked
// set) was given no slot, and passing one on would move more parked runs
// than slots are free (each then parks again, at the back of the line).
func TestOnlyPromotedRunsPassTheSlotOn(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	hold := worker.SlotRun{Slot: "other", Owner: "k1"}
	if a, err := f.store.AdmitSlot(f.ctx, hold, 1); err != nil || a.Verdict != worker.VerdictRun {
		t.Fatalf("take k1's slot: %+v, %v", a, err)
	}
	// Three parked runs, each an asynq task waiting in its retry set for
	// its WaitError (asynq keeps the error's text in the task's message,
	// which is all a promotion reads of it).
	run := func(id string) worker.SlotRun {
		return worker.SlotRun{Slot: "item-" + id, Owner: "k1", Solve: "s-" + id, CacheKey: "c-" + id, Queue: "q", AsynqID: id}
	}
	for _, id := range []string{"p1", "p2", "p3"} {
		if a, err := f.store.AdmitSlot(f.ctx, run(id), 1); err != nil || a.Verdict != worker.VerdictWait {
			t.Fatalf("park %s: %+v, %v", id, a, err)
		}
		f.rdb.HSet(f.ctx, "asynq:{q}:t:"+id, "state", "retry", "msg", (&worker.WaitError{In: time.Hour}).Error())
		f.rdb.ZAdd(f.ctx, "asynq:{q}:retry", redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: id})
	}
	state := func(id string) string { return f.rdb.HGet(f.ctx, "asynq:{q}:t:"+id, "state").Val() }
	if err := f.store.ReleaseSlot(f.ctx, hold); err != nil {
		t.Fatal(err)
	}
	if state("p1") != "pending" || state("p2") != "retry" {
		t.Fatalf("after the release: p1 %s, p2 %s; want p1 promoted", state("p1"), state("p2"))
	}
	// p3 comes back by its retry delay and needs no slot: nothing moves.
	if err := f.store.PassSlot(f.ctx, run("p3"), 1); err != nil {
		t.Fatal(err)
	}
	if state("p2") != "retry" {
		t.Fatalf("a run that was not promoted passed a slot on: p2 %s", state("p2"))
	}
	// p1, promoted, needs no slot: p2 gets it.
	if err := f.store.PassSlot(f.ctx, run("p1"), 1); err != nil {
		t.Fatal(err)
	}
	if state("p2") != "pending" {
		t.Fatalf("the promoted run did not pass its slot on: p2 %s", state("p2"))
	}
	if n, err := f.store.Parked(f.ctx, "k1"); err != nil || n != 0 {
		t.Fatalf("parked after: %d, %v", n, err)
	}
}

// A delivery of a batch item that finds its item ended leaves the parked
// set of the solve it waited for, though that solve is still in flight:
// an earlier delivery whose worker died while it was being told to wait
// stays in that set with asynq's state active, which no promotion takes
// out, and its next delivery is the only run that knows it is there.
func TestEndedItemLeavesTheSolvesParkedSet(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	h := worker.NewHandler(f.store, nil, testLimits(), worker.NewMetrics(prometheus.NewRegistry()), nil)
	h.SetGate(f.store, func() int { return 0 })
	board := sweeps(t, 1)[0]
	p := mustParse(t, board)
	// Another key's single task solves the board, and holds the solve
	// for the whole test.
	if _, _, err := f.store.SubmitTask(f.ctx, store.NewTask{ID: "k2-0", Kind: string(p.Kind()), Owner: "k2", CacheKey: p.Key()}, 0); err != nil {
		t.Fatal(err)
	}
	lead := worker.SolveRun{ID: "k2-0", Owner: "k2", Solve: worker.SolveKey(p), CacheKey: p.Key(), Lease: time.Hour}
	if a, err := f.store.Admit(f.ctx, lead, 0); err != nil || a.Verdict != worker.VerdictRun {
		t.Fatalf("k2's solve: %+v, %v", a, err)
	}
	f.slotServer(t, h, 2)
	f.stageOwned(t, "a", "k1", []string{board})
	if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, 10, 10); err != nil {
		t.Fatal(err)
	}
	pk := "pq:solve:" + worker.SolveKey(p) + ":parked"
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if n := f.rdb.ZCard(f.ctx, pk).Val(); n == 1 && f.allRetrying(t, pk) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the item never waited for the solve in flight: %v", f.rdb.ZRange(f.ctx, pk, 0, -1).Val())
		}
	}
	member := f.rdb.ZRange(f.ctx, pk, 0, -1).Val()[0]
	q, id, _ := strings.Cut(member, "\t")
	b, err := f.store.GetBatch(f.ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if prev, err := f.store.CancelItem(f.ctx, b, 0); err != nil || prev != apitype.TaskStatePending {
		t.Fatalf("cancel the item: %s, %v", prev, err)
	}
	// Its retry delay is an hour: deliver it again now, as asynq would.
	base := "asynq:{" + q + "}:"
	if f.rdb.ZRem(f.ctx, base+"retry", id).Val() != 1 {
		t.Fatalf("%s is not in asynq's retry set", id)
	}
	f.rdb.HSet(f.ctx, base+"t:"+id, "state", "pending")
	f.rdb.LPush(f.ctx, base+"pending", id)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st := f.rdb.HGet(f.ctx, base+"t:"+id, "state").Val()
		if st != "pending" && st != "active" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the canceled item's delivery did not end: state %s", st)
		}
	}
	if left := f.rdb.ZRange(f.ctx, pk, 0, -1).Val(); len(left) != 0 {
		t.Fatalf("the canceled item's delivery ended and left the solve's parked set holding %v", left)
	}
	if f.rdb.Exists(f.ctx, "pq:solve:"+worker.SolveKey(p)).Val() != 1 {
		t.Fatal("the solve in flight ended: the test no longer shows what it is for")
	}
}
