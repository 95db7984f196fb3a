package worker

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// Expensive work (the requests that are not puzzle.Cheap: sweeps, and
// sliding boards over 9 cells) goes through a Gate before it runs:
//
//   - One solve in flight per identical puzzle, cluster-wide. A single
//     task whose puzzle is being solved by another run joins that run: it
//     is ended with the same result or failure when the solve ends, and
//     its own delivery returns at once, so it holds no slot.
//   - A fair share of the cluster's solver slots per API key, single
//     tasks and batch items alike: the keys with expensive work share
//     them by weighted max-min fairness, so a key alone may use every
//     slot and competing keys get slots in proportion to their weights,
//     with an optional hard ceiling per key. A run over its share is not
//     failed: it is parked and returns a WaitError, which asynq turns
//     into a retry after WaitError.In without counting it as a failure
//     (see IsWait); a freed slot moves the parked run of the most
//     under-served key back onto its queue at once.
//
// Both are leases in Redis that the running worker renews every
// SolveLease/3. When a worker dies, any run of the same task record takes
// its slot and in-flight solve over at once, lease or not (the slot's
// member and the solve's lead are the record's ID): the watchdog's copy
// within seconds (Heartbeat, tasks.RedriveTask), or asynq's redelivery after its
// own lease recovery when no watchdog re-drove it. Otherwise both end with
// their lease, and the next identical submission leads the solve.

// SolveLease is how long a run's slot and in-flight solve last without
// being renewed. Its run renews them every third of it, so only a worker
// that died (or froze) for this long loses them.
const SolveLease = 30 * time.Second

// SolveRun names one run of an expensive single task for the Gate.
type SolveRun struct {
	// ID is the task record's ID; it is also the run's member of its
	// owner's slots and the name of its in-flight solve, so a task run
	// twice (a redelivery, a watchdog's copy) holds one slot and leads
	// its own solve, never joins itself.
	ID    string
	Owner string
	// Solve identifies identical work: the puzzle's cache key and, when
	// the request lowered it, its node budget (see SolveKey).
	Solve string
	// CacheKey is where a completed result is cached.
	CacheKey string
	// Lease is how long the run's slot and solve last unrenewed; 0 means
	// SolveLease.
	Lease time.Duration
	// Slots is the cluster's solver slots, which the keys with expensive
	// work share by weight (see Gate); 0 turns the sharing off, leaving
	// only the ceiling (a last delivery, tests).
	Slots int
	// Ceiling is the most slots one key may hold (MAX_EXPENSIVE_PER_KEY,
	// 0: none), for the runs that a slot this run frees may go to.
	Ceiling int
	// Queue and AsynqID name the asynq task of this delivery (a
	// watchdog's copy has an ID of its own), which a run told to wait
	// parks under, so that the next run of its owner to free a slot
	// moves it back onto its queue at once. Empty (a direct call, as in
	// tests): the run waits out its retry delay.
	Queue, AsynqID string
}

// LeaseOrDefault is r.Lease, or SolveLease when it is 0.
func (r SolveRun) LeaseOrDefault() time.Duration {
	if r.Lease > 0 {
		return r.Lease
	}
	return SolveLease
}

// SolveKey is what identical work shares: the cache key, and the node
// budget a request asked for, since a smaller budget may fail where a
// larger one succeeds (the key leaves budgets out, as only answers are
// cached).
func SolveKey(p *puzzle.Parsed) string { return solveKey(p, p.Key()) }

// solveKey is SolveKey given p's cache key k.
func solveKey(p *puzzle.Parsed, k string) string {
	if n := p.MaxNodes(); n > 0 {
		k += "-n" + strconv.FormatInt(n, 10)
	}
	return k
}

// Verdict is what a Gate decided for a run.
type Verdict string

// The verdicts of Gate.Admit.
const (
	// VerdictRun: the run leads the solve and holds a slot: solve, then
	// FinishSolve (or ReleaseSolve if every waiter canceled).
	VerdictRun Verdict = "run"
	// VerdictJoined: another run is solving the same puzzle; the task
	// waits for it, and this delivery is done.
	VerdictJoined Verdict = "joined"
	// VerdictWait: the owner's slots are full; retry later (WaitError).
	VerdictWait Verdict = "wait"
	// VerdictHit: the answer is cached (Admission.Result); FinishSolve
	// with it ends every waiter.
	VerdictHit Verdict = "hit"
	// VerdictSkip: the task has ended and nothing waits on its puzzle.
	VerdictSkip Verdict = "skip"
)

// Admission is a Gate's answer to Admit.
type Admission struct {
	Verdict Verdict
	// Result is the cached answer of VerdictHit.
	Result json.RawMessage
	// Lead is the task whose run a VerdictJoined task joined.
	Lead string
	// Waits is how many times the task has been told to wait, for its
	// backoff (VerdictWait).
	Waits int
}

// SlotRun names one run of an expensive batch item for the Gate: it
// counts against its owner's cap like an expensive single task, and it
// joins an identical solve in flight (a single task's or another batch
// item's) by waiting for it to end, then reading its answer from the
// cache. Single tasks do not join a batch item's run: its end writes the
// item's entry, not their records.
type SlotRun struct {
	// Slot is the run's member of its owner's slots: the item's ID
	// (apitype.ItemID), so that every delivery of the item holds one.
	Slot  string
	Owner string
	// Solve identifies identical work, as in SolveRun, and CacheKey is
	// where its completed answer is cached.
	Solve, CacheKey string
	// Lease is how long the slot lasts unrenewed; 0 means SolveLease.
	Lease time.Duration
	// Slots is the cluster's solver slots, which the keys with expensive
	// work share by weight (see Gate); 0 turns the sharing off, leaving
	// only the ceiling (a last delivery, tests).
	Slots int
	// Ceiling is the most slots one key may hold (MAX_EXPENSIVE_PER_KEY,
	// 0: none), for the runs that a slot this run frees may go to.
	Ceiling int
	// Queue and AsynqID name the delivery's asynq task, as in SolveRun.
	Queue, AsynqID string
	// Alone runs r even when an identical solve is in flight, rather than
	// wait for it: set for a task's last delivery (lastDelivery), which
	// asynq would archive if it waited.
	Alone bool
}

// LeaseOrDefault is r.Lease, or SolveLease when it is 0.
func (r SlotRun) LeaseOrDefault() time.Duration {
	if r.Lease > 0 {
		return r.Lease
	}
	return SolveLease
}

// SlotAdmission is a Gate's answer to AdmitSlot.
type SlotAdmission struct {
	Verdict Verdict
	// Place is a VerdictWait run's place in its owner's line (1: the next
	// to be promoted).
	Place int
	// Waited is how long a VerdictJoined run has waited for the solve it
	// joined, since its first wait.
	Waited time.Duration
}

// Gate admits expensive runs; *store.Store satisfies it.
//
// With a run's Slots set (the cluster's solver slots, S), a run takes a
// slot when one is free cluster-wide and its owner holds fewer than its
// weighted max-min fair share of S between the keys with expensive work
// (their demand: slots held and runs parked), and under the ceiling (the
// cap argument; 0: none). A run that may not is parked: its asynq task
// waits out a retry delay, and the run that frees a slot (FinishSolve,
// ReleaseSolve, ReleaseSlot) or hands one on (PassSlot) moves the
// longest-parked run of the key holding the fewest slots per unit of
// weight among those under their share back onto its queue at once. So
// waiting work runs as fast as slots free up, and the retry delay
// matters only when no run frees one (a worker died holding it, and its
// lease ran out). With Slots 0 only the ceiling holds a key back, and a
// freed slot goes to its own key's longest-parked run.
type Gate interface {
	// Admit decides what a run does, and for VerdictRun takes its slot
	// and its in-flight solve for SolveLease; cap is the owner's most
	// runs holding slots (0: no cap).
	Admit(ctx context.Context, r SolveRun, cap int) (Admission, error)
	// RenewSolve extends a VerdictRun's slot and solve by SolveLease.
	RenewSolve(ctx context.Context, r SolveRun) error
	// FinishSolve ends every task waiting on the run's solve (this one
	// included) with t's outcome, caches a completed result, and frees
	// the run's slot and solve. It returns how many records it ended,
	// and how many of each owner's (the tasks that joined the run may be
	// other keys'); records that had ended already (canceled, or ended by another run
	// of the same solve) are left alone, so it is idempotent.
	FinishSolve(ctx context.Context, r SolveRun, t Transition) (ended int, byOwner map[string]int, err error)
	// ReleaseSolve gives up a run whose solve was canceled because no
	// task waits on it any more. It returns how many tasks joined
	// meanwhile: when not 0 the solve is still owed, and the run keeps
	// its slot and solve.
	ReleaseSolve(ctx context.Context, r SolveRun) (int, error)

	// AdmitSlot decides what a run of an expensive batch item does:
	// VerdictRun when it took one of r.Owner's slots and leads r.Solve
	// for r's lease; VerdictJoined when an identical solve is in flight,
	// which r waits for (parked until that solve ends); VerdictHit when
	// r.CacheKey holds the answer now; VerdictWait when the owner holds
	// cap (0: no cap) slots already, and r is parked in line.
	AdmitSlot(ctx context.Context, r SlotRun, cap int) (SlotAdmission, error)
	// RenewSlot extends r's slot and lead by its lease.
	RenewSlot(ctx context.Context, r SlotRun) error
	// ReleaseSlot frees r's slot and lead: the owner's longest-parked
	// run and every item waiting for r's solve go back onto their queue.
	// The item's outcome must be written first.
	ReleaseSlot(ctx context.Context, r SlotRun) error
	// PassSlot is for a run of r's item that takes no slot after all
	// (the item ended, was canceled or is cached): r leaves the owner's
	// parked runs, and while the owner holds fewer than cap slots (0: no
	// cap) its longest-parked run is promoted in r's place, since r may
	// have been promoted into a slot that it leaves free. With r.Solve
	// set r also leaves the items waiting for that solve, and when
	// r.CacheKey holds the solve's answer more of them go back onto their
	// queue, so that many copies follow one solve within a few rounds.
	PassSlot(ctx context.Context, r SlotRun, cap int) error
	// YieldUnit takes back StartUnit's start of the own unit ref whose
	// item was told to wait: its attempt, and its active count when this
	// start made it active.
	YieldUnit(ctx context.Context, ref tasks.UnitRef) error
}

// WaitError is returned by a run over its owner's cap: asynq retries the
// task after In, and the binaries' asynq configuration (IsWait) counts
// neither a retry nor a failure for it, so a task can wait as long as it
// needs to. A task's last delivery never waits (lastDelivery): asynq
// would archive it.
type WaitError struct {
	In time.Duration
	// Why replaces WaitMessage in the message; set by the webhook
	// deliveries, whose waits no promotion looks for.
	Why string
}

// WaitMessage begins every WaitError's message. asynq keeps a retried
// task's last error message in Redis, and the store's promotion of parked
// runs moves only a task whose message holds it: one that asynq retried
// for a WaitError, not one retried for another reason (its worker died,
// say) whose retry delay is meant to be waited out.
const WaitMessage = "tasks: the key's expensive slots are full; runs again in "

func (e *WaitError) Error() string {
	if e.Why != "" {
		return e.Why + e.In.String()
	}
	return WaitMessage + e.In.String()
}

// IsWait reports whether err is a WaitError, and its delay.
func IsWait(err error) (time.Duration, bool) {
	var we *WaitError
	if errors.As(err, &we) {
		return we.In, true
	}
	return 0, false
}

// waitDelay is how long a capped run waits before it asks again: a second
// plus jitter at first, so a slot that frees is taken within a second or
// two, one more second every fourth wait, to at most 10 s plus jitter,
// so that many waiting tasks of
// a flooding key cost Redis and the workers little (a wait is one script
// call and a few microseconds of a slot).
func waitDelay(waits int, jitter time.Duration) time.Duration {
	return min(time.Second+time.Duration(waits/4)*time.Second, 10*time.Second) + jitter
}

// slotWaitDelay is how long a parked batch item waits before it asks
// again, given its place in its owner's line (1: the next): a second at
// the front, 100 ms more per run ahead of it, at most 30 s, plus jitter.
// A batch of a thousand hard boards parks a thousand items at once; they
// are promoted one per freed slot, so the delay is only the fallback for
// a slot that no run frees (its worker died), and an item far back in the
// line need not ask often.
func slotWaitDelay(place int, jitter time.Duration) time.Duration {
	return min(time.Second+time.Duration(max(place-1, 0))*100*time.Millisecond, 30*time.Second) + jitter
}

// joinWaitDelay is how long a batch item waiting for an identical solve
// waits before it asks again, given how long it has waited: half that, at
// least a second and at most 30 s, plus jitter. The solve's end moves it
// back at once, so the delay matters for a solve whose run died (its lease
// ends within SolveLease) and for an item that was told to wait just as
// the solve ended, whose promotion found it not yet in asynq's retry set:
// that one has waited for nothing, so it asks again within a second or
// two, while a thousand copies waiting on an hour-long search ask seldom.
func joinWaitDelay(waited, jitter time.Duration) time.Duration {
	return min(max(waited/2, time.Second), 30*time.Second) + jitter
}
