package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/lease"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// SetGate makes h run expensive work through g (see Gate): one solve per
// identical puzzle in flight for single tasks, and at most capOf() runs
// per key holding slots (0: no ceiling), single tasks and batch items
// alike, read at each admission. Without it every task runs as it comes.
// Call it before the handler serves tasks.
func (h *Handler) SetGate(g Gate, capOf func() int) { h.gate, h.capOf = g, capOf }

// SetSlots makes the keys with expensive work share slotsOf() solver
// slots, the cluster's, by weight (see Gate), read at each admission so
// that the share follows the cluster's size. Without it (or while it
// returns 0) only SetGate's ceiling holds a key back.
func (h *Handler) SetSlots(slotsOf func() int) { h.slotsOf = slotsOf }

// slots is the cluster's solver slots now (SetSlots), 0 for no sharing.
func (h *Handler) slots() int {
	if h.slotsOf == nil {
		return 0
	}
	return h.slotsOf()
}

// cap is the per-key cap of expensive runs now (SetGate's capOf), 0 for
// none.
func (h *Handler) cap() int {
	if h.capOf == nil {
		return 0
	}
	return h.capOf()
}

// delivery names the asynq task that ctx runs (its queue and ID), under
// which a run told to wait is parked; both are empty outside asynq (a
// direct call, as in tests), and such a run is never parked.
func delivery(ctx context.Context) (queue, id string) {
	queue, _ = asynq.GetQueueName(ctx)
	id, _ = asynq.GetTaskID(ctx)
	return queue, id
}

// SetSolveLease sets the lease of expensive runs (SolveLease until
// then), for tests that kill workers.
func (h *Handler) SetSolveLease(d time.Duration) { h.lease = d }

// solveRun is the Gate's name for a run of single task it.
func solveRun(owner string, it tasks.Item, p *puzzle.Parsed) SolveRun {
	k := p.Key()
	return SolveRun{ID: it.ID, Owner: owner, Solve: solveKey(p, k), CacheKey: k}
}

// processExpensive runs an expensive single task through the gate. Every
// step is idempotent, as in processItems: a redelivered task that leads
// its solve takes it over (same ID), one that joined joins again, and
// FinishSolve ends each waiting record once.
func (h *Handler) processExpensive(ctx context.Context, owner string, it tasks.Item, p *puzzle.Parsed) error {
	r := solveRun(owner, it, p)
	r.Lease = h.lease
	r.Queue, r.AsynqID = delivery(ctx)
	r.Slots, r.Ceiling = h.slots(), h.cap()
	limit, ask := r.Ceiling, r
	if lastDelivery(ctx) {
		// asynq would archive it if it waited: it runs, over its share.
		limit, ask.Slots = 0, 0
	}
	// Register for cancellation before admitting, so a cancel that lands
	// between the two is not missed. The solve runs under this task's ID
	// whoever waits on it; the store announces its cancel only once no
	// waiter is left (cancelSolveScript).
	sctx, cancel := context.WithCancel(ctx)
	release := h.cancels.register(it.ID, cancel)
	defer func() { release(); cancel() }()

	h.holdNow(ctx, it.ID)
	a, err := h.gate.Admit(ctx, ask, limit)
	if err != nil {
		return fmt.Errorf("tasks: admit %s: %w", it.ID, err)
	}
	switch a.Verdict {
	case VerdictSkip:
		return nil
	case VerdictJoined:
		h.log.Debug("expensive task joined an identical solve in flight", "task_id", it.ID, "lead_id", a.Lead)
		if h.metrics != nil {
			h.metrics.Joins.Inc()
		}
		return nil
	case VerdictWait:
		if h.metrics != nil {
			h.metrics.Waits.Inc()
		}
		return &WaitError{In: waitDelay(a.Waits, rand.N(time.Second))}
	case VerdictHit:
		return h.finishSolve(ctx, r, p, &outcome{result: a.Result, cached: true})
	}

	stop := h.renewWhile(ctx, r)
	defer stop()
	for {
		if h.metrics != nil {
			h.metrics.Searches.WithLabelValues(string(p.Kind())).Inc()
		}
		o := h.tracedSolve(ctx, sctx, it.ID, p)
		if ctx.Err() != nil {
			// Shutdown or a lost lease: asynq runs the task again, and
			// that run takes the solve over (it has the same ID); the
			// leases last until then.
			return fmt.Errorf("tasks: interrupted: %w", ctx.Err())
		}
		if o.overrun && !h.lastDeadlineAttempt(ctx) {
			// Wall time ran out, not the search's budget: asynq runs the
			// task again, which takes the solve over like a run after a
			// lost lease (same ID).
			return fmt.Errorf("tasks: task %s: %w", it.ID, ErrDeadlineOverrun)
		}
		if !o.skip {
			return h.finishSolve(ctx, r, p, o)
		}
		// Canceled: no waiter was left. Give the solve up, unless a task
		// joined it meanwhile, whose answer is then still owed.
		wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		n, err := h.gate.ReleaseSolve(wctx, r)
		wcancel()
		if err != nil {
			return fmt.Errorf("tasks: release solve of %s: %w", it.ID, err)
		}
		if n == 0 {
			return nil
		}
		h.log.Info("canceled solve resumed for tasks that joined it", "task_id", it.ID, "waiters", n)
		release()
		cancel()
		sctx, cancel = context.WithCancel(ctx)
		release = h.cancels.register(it.ID, cancel)
	}
}

// finishSolve ends every task waiting on r's solve with o and counts the
// records it ended.
func (h *Handler) finishSolve(ctx context.Context, r SolveRun, p *puzzle.Parsed, o *outcome) error {
	t := Transition{ID: r.ID, Owner: r.Owner}
	label := string(apitype.TaskStateCompleted)
	if o.code == "" {
		t.State, t.Result, t.Cached = apitype.TaskStateCompleted, o.result, o.cached
	} else {
		t.State, t.Code, t.Msg = apitype.TaskStateFailed, o.code, o.msg
		label = o.code
	}
	// Done work is written even if the task's ctx just ended.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	n, byOwner, err := h.gate.FinishSolve(wctx, r, t)
	if err != nil {
		return fmt.Errorf("tasks: finish solve of %s: %w", r.ID, err)
	}
	h.countSolveHistory(ctx, r.Owner, o.code == "", byOwner)
	if h.metrics != nil && n > 0 {
		h.metrics.Tasks.WithLabelValues(string(p.Kind()), label).Add(float64(n))
		if o.cached {
			h.metrics.CacheHits.Add(float64(n))
		}
	}
	return nil
}

// renewWhile renews r's slot and solve every third of its lease until
// the returned stop is called (or ctx ends). A failed renewal is only
// logged: the next one may work, and a lease that lapsed costs at most a
// second run of the same puzzle, never a lost task.
func (h *Handler) renewWhile(ctx context.Context, r SolveRun) (stop func()) {
	return lease.Renew(ctx, r.LeaseOrDefault()/3, func(rctx context.Context) {
		if err := h.gate.RenewSolve(rctx, r); err != nil && rctx.Err() == nil {
			h.log.Warn("renew expensive run's lease", "task_id", r.ID, "err", err)
		}
	})
}

// takeSlot takes a slot of owner's for the expensive item it of own unit
// ref, and the lead of its solve, renewed until the returned release
// frees them (and moves the owner's longest-parked run and the items
// waiting for this solve back onto their queues). An identical solve that
// ended since the unit looked leaves its answer, which takeSlot returns
// as hit (no slot taken). Behind an identical solve in flight, or over
// the owner's cap, it takes back the unit's start (YieldUnit: the item
// waits pending, not active) and returns a WaitError, whose delay grows
// with the item's place in line.
func (h *Handler) takeSlot(ctx context.Context, ref tasks.UnitRef, owner string, it *unitItem) (release func(), hit json.RawMessage, err error) {
	r := SlotRun{Slot: it.id, Owner: owner, Solve: solveKey(it.parsed, it.cacheKey), CacheKey: it.cacheKey, Lease: h.lease,
		Slots: h.slots(), Ceiling: h.cap()}
	r.Queue, r.AsynqID = delivery(ctx)
	limit, ask := r.Ceiling, r
	if r.Alone = lastDelivery(ctx); r.Alone {
		limit, ask.Slots, ask.Alone = 0, 0, true
	}
	h.holdNow(ctx, it.id)
	a, err := h.gate.AdmitSlot(ctx, ask, limit)
	if err != nil {
		return nil, nil, fmt.Errorf("tasks: admit item %s: %w", it.id, err)
	}
	var delay time.Duration
	switch a.Verdict {
	case VerdictHit:
		if hit, err = h.store.Cached(ctx, it.cacheKey); err != nil || hit != nil {
			return nil, hit, err
		}
		// Expired between the two reads: ask again soon, when the
		// answer's absence makes this run lead.
		delay = slotWaitDelay(1, rand.N(time.Second))
	case VerdictJoined:
		if h.metrics != nil {
			h.metrics.Joins.Inc()
		}
		delay = joinWaitDelay(a.Waited, rand.N(time.Second))
	case VerdictWait:
		if h.metrics != nil {
			h.metrics.Waits.Inc()
		}
		delay = slotWaitDelay(a.Place, rand.N(time.Second))
	}
	if delay > 0 {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		defer cancel()
		if err := h.gate.YieldUnit(wctx, ref); err != nil {
			return nil, nil, fmt.Errorf("tasks: yield unit %s: %w", ref.TaskID(), err)
		}
		return nil, nil, &WaitError{In: delay}
	}
	stop := lease.Renew(ctx, r.LeaseOrDefault()/3, func(rctx context.Context) {
		if err := h.gate.RenewSlot(rctx, r); err != nil && rctx.Err() == nil {
			h.log.Warn("renew expensive item's slot", "item_id", it.id, "err", err)
		}
	})
	return func() {
		stop()
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		defer cancel()
		// A slot or lead not freed here ends with its lease; only the
		// promotions are lost, and those runs ask again later.
		if err := h.gate.ReleaseSlot(wctx, r); err != nil {
			h.log.Warn("release expensive item's slot", "item_id", it.id, "err", err)
		}
	}, nil, nil
}

// holdNow writes the task ctx runs into its worker's record before the
// run of id asks for a slot or a solve's lead (HoldNow says why). A failed
// write is only logged: the next flush or beat retries it, and until then
// a kill leaves the task to asynq's recovery, as before.
func (h *Handler) holdNow(ctx context.Context, id string) {
	if err := HoldNow(ctx); err != nil && ctx.Err() == nil {
		h.log.Warn("record expensive run in the worker's record before its admission", "task_id", id, "err", err)
	}
}

// passSlot hands on the slot that own item id's delivery may have been
// promoted into, when it takes none; with solve set the delivery also
// leaves that solve's parked items, and when the solve's answer is cached
// (cacheKey) moves more of the items waiting for it (Gate.PassSlot). Its
// failure costs only the promotions: a parked run still runs after its
// retry delay.
func (h *Handler) passSlot(ctx context.Context, owner, id, solve, cacheKey string) {
	r := SlotRun{Slot: id, Owner: owner, Solve: solve, CacheKey: cacheKey, Slots: h.slots(), Ceiling: h.cap()}
	r.Queue, r.AsynqID = delivery(ctx)
	limit := r.Ceiling
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if err := h.gate.PassSlot(wctx, r, limit); err != nil {
		h.log.Warn("pass on expensive item's slot", "item_id", id, "err", err)
	}
}

// countSolveHistory adds the tasks a solve ended to the history, each to
// its own key's. The run's own task has its latency (acceptedAt); the
// store says how many of each key's tasks ended, not which, so the run's
// key is taken to have its own task among them.
func (h *Handler) countSolveHistory(ctx context.Context, lead string, completed bool, byOwner map[string]int) {
	for owner, c := range byOwner {
		if owner == lead && c > 0 {
			h.history.Ended(owner, completed, 1, acceptedAt(ctx))
			c--
		}
		h.history.Ended(owner, completed, c, 0)
	}
}
