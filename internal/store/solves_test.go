package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// gateFixture is a store with single tasks submitted under owners, and the
// cancel announcements it made.
type gateFixture struct {
	t   *testing.T
	s   *store.Store
	ctx context.Context
	mu  sync.Mutex
	ann []string
}

func newGate(t *testing.T) *gateFixture {
	t.Helper()
	s, ctx := newStore(t)
	f := &gateFixture{t: t, s: s, ctx: ctx}
	lctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	probes := make(chan string, 100)
	go s.ListenCancels(lctx, func(id string) {
		if strings.HasPrefix(id, "probe-") {
			probes <- id
			return
		}
		f.mu.Lock()
		f.ann = append(f.ann, id)
		f.mu.Unlock()
	})
	// The subscription is live once the cancel of an active task without
	// a solve comes back through it.
	for i := 0; ; i++ {
		id := fmt.Sprintf("probe-%d", i)
		f.submit(id, "")
		if _, _, err := s.Start(ctx, []worker.Transition{{ID: id}}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Cancel(ctx, id, ""); err != nil {
			t.Fatal(err)
		}
		select {
		case <-probes:
			return f
		case <-time.After(50 * time.Millisecond):
		}
		if i > 100 {
			t.Fatal("cancel subscription never became live")
		}
	}
}

// submit records a pending single task of owner (under a cache key of
// its own, so that the submission never hits) and returns its run on
// solve and cache key "k".
func (f *gateFixture) submit(id, owner string) worker.SolveRun {
	f.t.Helper()
	if _, _, err := f.s.SubmitTask(f.ctx, store.NewTask{ID: id, Kind: "sliding", Owner: owner, CacheKey: "own-" + id}, 0); err != nil {
		f.t.Fatal(err)
	}
	return worker.SolveRun{ID: id, Owner: owner, Solve: "k", CacheKey: "k"}
}

func (f *gateFixture) admit(r worker.SolveRun, limit int, want worker.Verdict) worker.Admission {
	f.t.Helper()
	a, err := f.s.Admit(f.ctx, r, limit)
	if err != nil {
		f.t.Fatal(err)
	}
	if a.Verdict != want {
		f.t.Fatalf("admit %s: %+v, want %s", r.ID, a, want)
	}
	return a
}

func (f *gateFixture) state(id string) *store.Task {
	f.t.Helper()
	tk, err := f.s.Get(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return tk
}

// announced returns the cancels announced so far, once want is among
// them or, when want is "", after a pause long enough for a delivery.
func (f *gateFixture) announced(want string) []string {
	deadline := time.Now().Add(5 * time.Second)
	if want == "" {
		deadline = time.Now().Add(200 * time.Millisecond)
	}
	for {
		f.mu.Lock()
		got := slices.Clone(f.ann)
		f.mu.Unlock()
		if (want != "" && slices.Contains(got, want)) || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f *gateFixture) pending(owner string) int {
	f.t.Helper()
	n, err := f.s.Pending(f.ctx, owner)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

var answer = json.RawMessage(`{"moves":80}`)

func completed(r worker.SolveRun) worker.Transition {
	return worker.Transition{ID: r.ID, Owner: r.Owner, State: apitype.TaskStateCompleted, Result: answer}
}

// TestGateJoin: identical tasks of several owners share one run, which
// ends them all with its result and releases every owner's quota; a
// second finish (a task run twice) changes nothing.
func TestGateJoin(t *testing.T) {
	t.Parallel()
	f := newGate(t)
	a, b, c := f.submit("a", "o1"), f.submit("b", "o2"), f.submit("c", "o1")
	f.admit(a, 0, worker.VerdictRun)
	if j := f.admit(b, 0, worker.VerdictJoined); j.Lead != "a" {
		t.Errorf("b joined %q, want a", j.Lead)
	}
	f.admit(c, 0, worker.VerdictJoined)
	f.admit(a, 0, worker.VerdictRun) // a's redelivery takes its own solve over
	if st := f.state("b"); st.State != apitype.TaskStateActive || st.Attempts != 1 {
		t.Errorf("joined b: %+v, want active after one attempt", st)
	}
	n, byOwner, err := f.s.FinishSolve(f.ctx, a, completed(a))
	if err != nil || n != 3 || len(byOwner) != 2 || byOwner["o1"] != 2 || byOwner["o2"] != 1 {
		t.Fatalf("finish: %d %v %v, want 3 ended: 2 of o1's, 1 of o2's", n, byOwner, err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if st := f.state(id); st.State != apitype.TaskStateCompleted || string(st.Result) != string(answer) {
			t.Errorf("%s: %+v, want completed with the answer", id, st)
		}
	}
	if f.pending("o1")+f.pending("o2") != 0 {
		t.Errorf("quota still counts %d and %d tasks", f.pending("o1"), f.pending("o2"))
	}
	if n, by, err := f.s.FinishSolve(f.ctx, a, completed(a)); err != nil || n != 0 || len(by) != 0 {
		t.Errorf("second finish: %d %v %v, want nothing ended", n, by, err)
	}
	// The answer is cached: the next identical task is answered from it.
	d := f.submit("d", "o1")
	if h := f.admit(d, 0, worker.VerdictHit); string(h.Result) != string(answer) {
		t.Errorf("hit %s, want %s", h.Result, answer)
	}
	// A task that ended, with nothing waiting on its puzzle, is skipped.
	if n, _, err := f.s.FinishSolve(f.ctx, d, worker.Transition{ID: "d", State: apitype.TaskStateCompleted, Result: answer, Cached: true}); err != nil || n != 1 {
		t.Fatalf("finish from cache: %d %v", n, err)
	}
	f.admit(d, 0, worker.VerdictSkip)
}

// TestGateFailureShared: a failed solve fails every task that joined it,
// with the same code and message.
func TestGateFailureShared(t *testing.T) {
	t.Parallel()
	f := newGate(t)
	a, b := f.submit("a", "o1"), f.submit("b", "o2")
	f.admit(a, 0, worker.VerdictRun)
	f.admit(b, 0, worker.VerdictJoined)
	fail := worker.Transition{ID: "a", Owner: "o1", State: apitype.TaskStateFailed, Code: apitype.CodeTimeout, Msg: "too slow"}
	if n, _, err := f.s.FinishSolve(f.ctx, a, fail); err != nil || n != 2 {
		t.Fatalf("finish: %d %v", n, err)
	}
	for _, id := range []string{"a", "b"} {
		if st := f.state(id); st.State != apitype.TaskStateFailed || st.ErrCode != apitype.CodeTimeout || st.ErrMsg != "too slow" {
			t.Errorf("%s: %+v, want failed with timeout", id, st)
		}
	}
	// Nothing was cached: the next one runs.
	f.admit(f.submit("c", "o1"), 0, worker.VerdictRun)
}

// TestGateCancel: canceling the leading task keeps the solve running for
// the one that joined it; canceling that one too stops it, and the run
// then releases its slot. A task that joins between the stop and the
// release keeps the solve owed.
func TestGateCancel(t *testing.T) {
	t.Parallel()
	f := newGate(t)
	a, b := f.submit("a", "o1"), f.submit("b", "o2")
	f.admit(a, 1, worker.VerdictRun)
	f.admit(b, 1, worker.VerdictJoined)
	if _, err := f.s.Cancel(f.ctx, "a", "o1"); err != nil {
		t.Fatal(err)
	}
	if got := f.announced(""); len(got) != 0 {
		t.Fatalf("canceling a with b waiting announced %v, want nothing", got)
	}
	if st := f.state("b"); st.State != apitype.TaskStateActive {
		t.Fatalf("b after a's cancel: %s", st.State)
	}
	if _, err := f.s.Cancel(f.ctx, "b", "o2"); err != nil {
		t.Fatal(err)
	}
	if got := f.announced("a"); !slices.Contains(got, "a") {
		t.Fatalf("canceling the last waiter announced %v, want the run a", got)
	}
	// c joins before the stopped run releases: the solve is still owed.
	c := f.submit("c", "o2")
	f.admit(c, 1, worker.VerdictJoined)
	if n, err := f.s.ReleaseSolve(f.ctx, a); err != nil || n != 1 {
		t.Fatalf("release with c waiting: %d %v, want 1", n, err)
	}
	if n, _, err := f.s.FinishSolve(f.ctx, a, completed(a)); err != nil || n != 1 {
		t.Fatalf("finish for c: %d %v, want 1", n, err)
	}
	if st := f.state("a"); st.State != apitype.TaskStateCanceled {
		t.Errorf("a: %s, want it to stay canceled", st.State)
	}
	if st := f.state("c"); st.State != apitype.TaskStateCompleted {
		t.Errorf("c: %s, want completed", st.State)
	}
	if n, err := f.s.Running(f.ctx, "o1"); err != nil || n != 0 {
		t.Errorf("o1 holds %d slots after the finish (%v)", n, err)
	}
	// With nobody waiting, a stopped run releases.
	d := f.submit("d", "o1")
	d.Solve = "k2"
	d.CacheKey = "k2"
	f.admit(d, 1, worker.VerdictRun)
	if _, err := f.s.Cancel(f.ctx, "d", "o1"); err != nil {
		t.Fatal(err)
	}
	if n, err := f.s.ReleaseSolve(f.ctx, d); err != nil || n != 0 {
		t.Fatalf("release: %d %v", n, err)
	}
	if n, _ := f.s.Running(f.ctx, "o1"); n != 0 {
		t.Errorf("o1 holds %d slots after the release", n)
	}
}

// TestGateWorkerDied: a run that died without renewing its lease is
// taken over by the redelivery of its task, or by the next identical
// task once the lease ended, and either run ends every waiter; a
// redelivery of the first then joins the second. A canceled lead's
// redelivery still solves for the tasks that joined it.
func TestGateWorkerDied(t *testing.T) {
	t.Parallel()
	f := newGate(t)
	a, b := f.submit("a", "o1"), f.submit("b", "o2")
	a.Lease, b.Lease = 2*time.Second, 2*time.Second
	f.admit(a, 0, worker.VerdictRun)
	f.admit(b, 0, worker.VerdictJoined)
	// a's worker dies; the lease ends.
	time.Sleep(2200 * time.Millisecond)
	c := f.submit("c", "o1")
	c.Lease = time.Minute
	f.admit(c, 0, worker.VerdictRun)
	if j := f.admit(a, 0, worker.VerdictJoined); j.Lead != "c" {
		t.Errorf("a's redelivery joined %q, want c", j.Lead)
	}
	if n, _, err := f.s.FinishSolve(f.ctx, c, completed(c)); err != nil || n != 3 {
		t.Fatalf("finish by c: %d %v, want a, b, c", n, err)
	}

	// The lead is canceled while b2 waits, then its worker dies: its
	// redelivery runs for b2.
	a2, b2 := f.submit("a2", "o1"), f.submit("b2", "o2")
	a2.Solve, b2.Solve, a2.CacheKey, b2.CacheKey = "k3", "k3", "k3", "k3"
	f.admit(a2, 0, worker.VerdictRun)
	f.admit(b2, 0, worker.VerdictJoined)
	if _, err := f.s.Cancel(f.ctx, "a2", "o1"); err != nil {
		t.Fatal(err)
	}
	f.admit(a2, 0, worker.VerdictRun)
	if n, _, err := f.s.FinishSolve(f.ctx, a2, completed(a2)); err != nil || n != 1 {
		t.Fatalf("finish by the canceled lead: %d %v, want b2", n, err)
	}
	if st := f.state("b2"); st.State != apitype.TaskStateCompleted {
		t.Errorf("b2: %s", st.State)
	}
}

// TestGateCap: a key holds at most cap slots; the next run waits (and
// says how often it waited) until a slot is released or its lease ends.
// Other keys are not held back, and joining takes no slot.
func TestGateCap(t *testing.T) {
	t.Parallel()
	f := newGate(t)
	run := func(id, owner, key string, lease time.Duration) worker.SolveRun {
		r := f.submit(id, owner)
		r.Solve, r.CacheKey, r.Lease = key, key, lease
		return r
	}
	x1, x2, x3 := run("x1", "o1", "k1", time.Minute), run("x2", "o1", "k2", 2*time.Second), run("x3", "o1", "k3", time.Minute)
	f.admit(x1, 2, worker.VerdictRun)
	f.admit(x2, 2, worker.VerdictRun)
	f.admit(run("j", "o1", "k1", time.Minute), 2, worker.VerdictJoined)
	if w := f.admit(x3, 2, worker.VerdictWait); w.Waits != 1 {
		t.Errorf("first wait counted %d", w.Waits)
	}
	if w := f.admit(x3, 2, worker.VerdictWait); w.Waits != 2 {
		t.Errorf("second wait counted %d", w.Waits)
	}
	if st := f.state("x3"); st.State != apitype.TaskStatePending || st.Attempts != 0 {
		t.Errorf("waiting x3: %+v, want pending, no attempt", st)
	}
	f.admit(run("y", "o2", "k4", time.Minute), 2, worker.VerdictRun)
	f.admit(x1, 2, worker.VerdictRun) // a run holding a slot keeps it
	if _, _, err := f.s.FinishSolve(f.ctx, x1, completed(x1)); err != nil {
		t.Fatal(err)
	}
	f.admit(x3, 2, worker.VerdictRun)
	x4 := run("x4", "o1", "k5", time.Minute)
	f.admit(x4, 2, worker.VerdictWait)
	time.Sleep(2200 * time.Millisecond) // x2's worker died: its lease ends
	f.admit(x4, 2, worker.VerdictRun)
	if n, err := f.s.Running(f.ctx, "o1"); err != nil || n != 2 {
		t.Errorf("o1 holds %d slots (%v), want 2", n, err)
	}
	if err := f.s.RenewSolve(f.ctx, x4); err != nil {
		t.Fatal(err)
	}
}
