package worker_test

import (
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// Two deliveries of one own unit (asynq's duplicate, or a watchdog's copy
// under another ID) interleave their start, admission, yield and finish
// in every order that can happen: the batch's counts say pending while no
// delivery runs the item, the item ends once, and the owner's quota is
// given back exactly once.
func TestYieldUnderDuplicateDeliveries(t *testing.T) {
	t.Parallel()
	// Steps: "h" another run takes k1's one slot, "f" frees it; "s1"
	// start delivery 1, "p1" its admission parks (then "y1" yields), "r1"
	// its admission takes the slot, "e1" it finishes and releases.
	for _, seq := range []string{
		"h s1 p1 y1 s2 p2 y2 f s1 r1 e1",
		"h s1 s2 p1 p2 y1 y2 f s1 r1 e1",
		"h s1 s2 p1 p2 y2 y1 f s2 r2 e2",
		"h s1 p1 s2 f r2 y1 e2",
		"h s1 s2 p1 f r2 y1 e2",
		"h s1 p1 s2 f r2 e2 y1",
		"s1 s2 r1 r2 e1 e2",
		"s1 s2 r2 e2 r1 e1",
		"h s1 s2 p1 f r2 e2 y1",
	} {
		t.Run(seq, func(t *testing.T) {
			t.Parallel()
			f := newUnitFixture(t)
			board := sweeps(t, 1)[0]
			f.stageOwned(t, "b1", "k1", []string{board})
			key := mustParse(t, board).Key()
			ref := tasks.UnitRef{BatchID: "b1", Unit: tasks.OwnUnit(0)}
			hold := worker.SlotRun{Slot: "other", Owner: "k1"}
			run := func(d byte) worker.SlotRun {
				return worker.SlotRun{Slot: apitype.ItemID("b1", 0), Owner: "k1", Solve: key, CacheKey: key, Queue: "bulk", AsynqID: "d" + string(d)}
			}
			counts := func(when string) map[apitype.TaskState]int {
				b, err := f.store.GetBatch(f.ctx, "b1")
				if err != nil {
					t.Fatal(err)
				}
				if b.Counts[apitype.TaskStatePending]+b.Counts[apitype.TaskStateActive]+b.Counts[apitype.TaskStateCompleted] != 1 {
					t.Fatalf("%s: counts %v", when, b.Counts)
				}
				return b.Counts
			}
			open := 0 // deliveries started and not yielded
			for _, step := range strings.Fields(seq) {
				var err error
				switch step[0] {
				case 'h':
					_, err = f.store.AdmitSlot(f.ctx, hold, 1)
				case 'f':
					err = f.store.ReleaseSlot(f.ctx, hold)
				case 's':
					_, err = f.store.StartUnit(f.ctx, ref)
				case 'p', 'r':
					var a worker.SlotAdmission
					a, err = f.store.AdmitSlot(f.ctx, run(step[1]), 1)
					if want := map[byte]worker.Verdict{'p': worker.VerdictWait, 'r': worker.VerdictRun}[step[0]]; err == nil && a.Verdict != want {
						t.Fatalf("%s: admission %+v, want %s", step, a, want)
					}
				case 'y':
					err = f.store.YieldUnit(f.ctx, ref)
				case 'e':
					_, err = f.store.FinishUnit(f.ctx, ref, "", []worker.ItemOutcome{{Index: 0, State: apitype.TaskStateCompleted, Result: []byte(`{"n":1}`)}})
					if err == nil {
						err = f.store.ReleaseSlot(f.ctx, run(step[1]))
					}
				}
				if err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				if step[0] == 's' {
					open++
				}
				if step[0] == 'y' {
					open--
				}
				// With every start taken back, the item is pending.
				if c := counts(step); open == 0 && c[apitype.TaskStateCompleted] == 0 && c[apitype.TaskStatePending] != 1 {
					t.Fatalf("%s: every start taken back, counts %v", step, c)
				}
			}
			c := counts("the end")
			if c[apitype.TaskStateCompleted] != 1 || c[apitype.TaskStateActive] != 0 || c[apitype.TaskStatePending] != 0 {
				t.Fatalf("counts at the end: %v", c)
			}
			if n, err := f.store.Pending(f.ctx, "k1"); err != nil || n != 0 {
				t.Fatalf("k1's quota count at the end: %d, %v", n, err)
			}
			if it := f.item(t, "b1", 0); it.State != apitype.TaskStateCompleted {
				t.Fatalf("item: %s", it.State)
			}
		})
	}
}
