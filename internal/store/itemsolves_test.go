package store_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/tasks"
)

// itemRun names item index of batch as the gate's run on solve key.
func itemRun(batch string, index int, owner, key string) (tasks.SolveRun, tasks.UnitRef) {
	return tasks.SolveRun{ID: apitype.ItemID(batch, index), Owner: owner, Solve: key, CacheKey: key},
		tasks.UnitRef{BatchID: batch, Unit: tasks.OwnUnit(index), Timeout: time.Minute}
}

func (f *gateFixture) admitItem(batch string, index int, owner, key string, limit int, want tasks.Verdict) tasks.Admission {
	f.t.Helper()
	r, ref := itemRun(batch, index, owner, key)
	a, err := f.s.AdmitItem(f.ctx, r, ref, index, limit)
	if err != nil {
		f.t.Fatal(err)
	}
	if a.Verdict != want {
		f.t.Fatalf("admit item %s: %+v, want %s", r.ID, a, want)
	}
	return a
}

func (f *gateFixture) counts(batch string) map[apitype.TaskState]int {
	f.t.Helper()
	b, err := f.s.GetBatch(f.ctx, batch)
	if err != nil {
		f.t.Fatal(err)
	}
	return b.Counts
}

func (f *gateFixture) item(batch string, index int) *store.Task {
	f.t.Helper()
	tk, err := f.s.GetItem(f.ctx, batch, index)
	if err != nil {
		f.t.Fatal(err)
	}
	return tk
}

// TestGateItems: expensive batch items share the singles' gate. Identical
// items of two batches and a single task share one solve, which ends
// them all with its result (stored once, in the cache) and moves each
// batch's counts and quota exactly; the key's items count against its
// cap; canceling the lead while others wait does not stop it, and a
// failure ends its waiters with the same error.
func TestGateItems(t *testing.T) {
	t.Parallel()
	f := newGate(t)
	e := &env{s: f.s, ctx: f.ctx}
	a, b := bid("items-a"), bid("items-b")
	req := `{"kind":"sliding","puzzle":{"board":[[1,2,3,4],[5,6,7,8],[9,10,11,12],[13,14,0,15]]}}`
	e.commit(t, store.CommitBatch{ID: a, Owner: "o1"}, 2, []store.StagedItem{own(req), own(req), own(req)})
	e.commit(t, store.CommitBatch{ID: b, Owner: "o2"}, 2, []store.StagedItem{own(req)})
	s := f.submit("s", "o2")

	f.admitItem(a, 0, "o1", "k", 1, tasks.VerdictRun)
	f.admitItem(a, 1, "o1", "k", 1, tasks.VerdictJoined)
	if w := f.admitItem(a, 2, "o1", "k2", 1, tasks.VerdictWait); w.Waits != 1 {
		t.Errorf("first wait of a-2 counted %d", w.Waits)
	}
	f.admit(s, 1, tasks.VerdictJoined)
	f.admitItem(b, 0, "o2", "k", 1, tasks.VerdictJoined)
	if c := f.counts(a); c[apitype.TaskStateActive] != 2 || c[apitype.TaskStatePending] != 1 {
		t.Fatalf("a's counts with two items admitted and one waiting: %v", c)
	}
	if n, err := f.s.Running(f.ctx, "o1"); err != nil || n != 1 {
		t.Fatalf("o1 holds %d slots (%v), want 1", n, err)
	}

	// Canceling the lead and one joined item leaves the solve running
	// for the others: nothing is announced.
	ab, err := f.s.GetBatch(f.ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1} {
		if prev, err := f.s.CancelItem(f.ctx, ab, i); err != nil || prev != apitype.TaskStateActive {
			t.Fatalf("cancel a-%d: %s %v", i, prev, err)
		}
	}
	if got := f.announced(""); len(got) != 0 {
		t.Fatalf("canceling a-0 and a-1 with others waiting announced %v", got)
	}

	lead, _ := itemRun(a, 0, "o1", "k")
	if n, err := f.s.FinishSolve(f.ctx, lead, completed(lead)); err != nil || n != 2 {
		t.Fatalf("finish by the canceled lead: %d %v, want s and b-0", n, err)
	}
	if n, err := f.s.FinishSolve(f.ctx, lead, completed(lead)); err != nil || n != 0 {
		t.Fatalf("second finish: %d %v, want nothing", n, err)
	}
	if st := f.state("s"); st.State != apitype.TaskStateCompleted || string(st.Result) != string(answer) {
		t.Errorf("s: %+v", st)
	}
	if tk := f.item(b, 0); tk.State != apitype.TaskStateCompleted || string(tk.Result) != string(answer) || tk.Cached || tk.Attempts != 1 {
		t.Errorf("b-0: %+v %s", tk, tk.Result)
	}
	if c := f.counts(b); c[apitype.TaskStateCompleted] != 1 || c[apitype.TaskStateActive] != 0 {
		t.Errorf("b's counts: %v", c)
	}
	if c := f.counts(a); c[apitype.TaskStateCanceled] != 2 || c[apitype.TaskStatePending] != 1 || c[apitype.TaskStateActive] != 0 {
		t.Errorf("a's counts: %v", c)
	}
	if n, _ := f.s.Running(f.ctx, "o1"); n != 0 {
		t.Errorf("o1 holds %d slots after the finish", n)
	}
	if p := f.pending("o2"); p != 0 {
		t.Errorf("o2's quota counts %d after its task and item ended", p)
	}
	if p := f.pending("o1"); p != 1 {
		t.Errorf("o1's quota counts %d, want a-2 alone", p)
	}

	// The slot is free: a-2 runs, and its failure is its waiters' too.
	f.admitItem(a, 2, "o1", "k2", 1, tasks.VerdictRun)
	s2 := f.submit("s2", "o1")
	s2.Solve, s2.CacheKey = "k2", "k2"
	f.admit(s2, 1, tasks.VerdictJoined)
	run2, _ := itemRun(a, 2, "o1", "k2")
	fail := tasks.Transition{State: apitype.TaskStateFailed, Code: apitype.CodeBudgetExceeded, Msg: "out of nodes"}
	if n, err := f.s.FinishSolve(f.ctx, run2, fail); err != nil || n != 2 {
		t.Fatalf("failed finish: %d %v, want a-2 and s2", n, err)
	}
	if tk := f.item(a, 2); tk.State != apitype.TaskStateFailed || tk.ErrCode != apitype.CodeBudgetExceeded || tk.ErrMsg != "out of nodes" {
		t.Errorf("a-2: %+v", tk)
	}
	if st := f.state("s2"); st.State != apitype.TaskStateFailed || st.ErrCode != apitype.CodeBudgetExceeded {
		t.Errorf("s2: %+v", st)
	}
	if ab, _ := f.s.GetBatch(f.ctx, a); !ab.Done() || f.pending("o1") != 0 {
		t.Errorf("a after its last item: %v, quota %d", ab.Counts, f.pending("o1"))
	}
	// An ended item with no live waiter is skipped; its solve's answer is
	// in the cache for the next one.
	f.admitItem(a, 0, "o1", "k", 1, tasks.VerdictSkip)
}

// TestGateItemCancelLast: canceling the last item waiting on a solve
// stops its lead, and an item whose worker died frees its slot when its
// lease ends; its unit's redelivery takes the solve over.
func TestGateItemCancelLast(t *testing.T) {
	t.Parallel()
	f := newGate(t)
	e := &env{s: f.s, ctx: f.ctx}
	d := bid("items-d")
	req := `{"kind":"sliding","puzzle":{"board":[[1,2,3,4],[5,6,7,8],[9,10,11,12],[13,14,0,15]]}}`
	e.commit(t, store.CommitBatch{ID: d, Owner: "o1"}, 4, []store.StagedItem{own(req), own(req), own(req)})
	f.admitItem(d, 0, "o1", "k", 1, tasks.VerdictRun)
	f.admitItem(d, 1, "o1", "k", 1, tasks.VerdictJoined)
	db, err := f.s.GetBatch(f.ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.CancelItem(f.ctx, db, 1); err != nil {
		t.Fatal(err)
	}
	if got := f.announced(""); len(got) != 0 {
		t.Fatalf("canceling a joined item announced %v", got)
	}
	if _, err := f.s.CancelItem(f.ctx, db, 0); err != nil {
		t.Fatal(err)
	}
	if got := f.announced(apitype.ItemID(d, 0)); !slices.Contains(got, apitype.ItemID(d, 0)) {
		t.Fatalf("canceling the last waiter announced %v, want the lead", got)
	}
	lead, _ := itemRun(d, 0, "o1", "k")
	if n, err := f.s.ReleaseSolve(f.ctx, lead); err != nil || n != 0 {
		t.Fatalf("release: %d %v", n, err)
	}

	// d-2 leads under a short lease and its worker dies.
	r2, ref2 := itemRun(d, 2, "o1", "k3")
	r2.Lease = 2 * time.Second
	if a, err := f.s.AdmitItem(f.ctx, r2, ref2, 2, 1); err != nil || a.Verdict != tasks.VerdictRun {
		t.Fatalf("admit d-2: %+v %v", a, err)
	}
	s := f.submit("s", "o1")
	s.Solve, s.CacheKey = "k4", "k4"
	f.admit(s, 1, tasks.VerdictWait)
	time.Sleep(2200 * time.Millisecond)
	if n, _ := f.s.Running(f.ctx, "o1"); n != 0 {
		t.Fatalf("o1 holds %d slots after the dead item's lease ended", n)
	}
	f.admit(s, 1, tasks.VerdictRun)
	// The redelivered unit waits for the slot the single now holds, then
	// takes its own solve over.
	f.admitItem(d, 2, "o1", "k3", 1, tasks.VerdictWait)
	if _, err := f.s.FinishSolve(f.ctx, s, completed(s)); err != nil {
		t.Fatal(err)
	}
	f.admitItem(d, 2, "o1", "k3", 1, tasks.VerdictRun)
	if tk := f.item(d, 2); tk.State != apitype.TaskStateActive || tk.Attempts != 2 {
		t.Errorf("d-2 taken over: %+v, want active on its second attempt", tk)
	}
}

// TestGateItemWaitsSpread: the items of a key told to wait ask again at
// most store.ItemWakesPerSecond times a second in all: the n-th waiting
// item waits n/ItemWakesPerSecond s (the singles' backoff of 1 s while
// that is shorter); asking again does not count an item twice, and one
// that runs leaves the waiting set.
func TestGateItemWaitsSpread(t *testing.T) {
	t.Parallel()
	f := newGate(t)
	e := &env{s: f.s, ctx: f.ctx}
	id := bid("items-w")
	const n = 3 * store.ItemWakesPerSecond
	items := make([]store.StagedItem, n+1)
	for i := range items {
		items[i] = own(fmt.Sprintf(`{"w":%d}`, i))
	}
	e.commit(t, store.CommitBatch{ID: id, Owner: "o1"}, 16, items)
	key := func(i int) string { return fmt.Sprintf("k%d", i) }
	f.admitItem(id, 0, "o1", key(0), 1, tasks.VerdictRun)
	var delays []time.Duration
	for i := 1; i <= n; i++ {
		delays = append(delays, f.admitItem(id, i, "o1", key(i), 1, tasks.VerdictWait).Delay)
	}
	for i, d := range delays {
		want := max(time.Second, time.Duration(i+1)*time.Second/store.ItemWakesPerSecond)
		if d != want {
			t.Errorf("waiting item %d of %d waits %v, want %v", i+1, n, d, want)
		}
	}
	// Asking again: the same rank, one more wait counted.
	if a := f.admitItem(id, n, "o1", key(n), 1, tasks.VerdictWait); a.Delay != delays[n-1] || a.Waits != 2 {
		t.Errorf("item %d asking again: %+v, want %v and 2 waits", n, a, delays[n-1])
	}
	run, _ := itemRun(id, 0, "o1", key(0))
	if _, err := f.s.FinishSolve(f.ctx, run, completed(run)); err != nil {
		t.Fatal(err)
	}
	f.admitItem(id, n, "o1", key(n), 1, tasks.VerdictRun)
	// The one that ran left: the next to ask ranks behind n-1 others.
	if a := f.admitItem(id, n-1, "o1", key(n-1), 1, tasks.VerdictWait); a.Delay != time.Duration(n-1)*time.Second/store.ItemWakesPerSecond {
		t.Errorf("after one ran: %+v", a)
	}
}
