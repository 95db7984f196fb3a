package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"
)

// DeliveryPool shares one worker's webhook delivery slots
// (WEBHOOK_CONCURRENCY) between API keys by max-min fairness:
//
//   - A free slot goes to whoever asks: a key alone uses every slot.
//   - With every slot taken, a key that holds fewer than the key holding
//     most, less one, takes a slot from it: that key's newest delivery is
//     canceled (preempted) and asked again later, not counted as a failed
//     attempt. Repeated, this converges on equal shares, and a key whose
//     receiver never answers holds at most its share once others ask.
//   - Otherwise the delivery waits (WaitError) and asks again later.
//
// The asynq server that feeds the pool runs one more goroutine than it
// has slots (WebhookServerConcurrency), so a delivery of another key is
// always taken off the queue and looked at while every slot hangs on a
// receiver: it is admitted or refused at once, never stuck behind them.
//
// The pool is per worker, guarded by one mutex: a slot is this worker's,
// so no other process can give the same slot away, and a decision costs
// no Redis round trip. Deliveries spread over the workers as asynq hands
// them out, so shares per worker add up to shares of the cluster.
type DeliveryPool struct {
	slots int
	// turnover is how long a delivery refused with every slot taken waits
	// for one to free, when one freed that recently: receivers that
	// answer at once free slots every few milliseconds, and a delivery
	// that waits that long costs less than a round trip through asynq's
	// retry set. Receivers that hang free none, and nothing waits on them.
	turnover time.Duration
	now      func() time.Time

	mu       sync.Mutex
	used     int
	runs     map[string][]*DeliveryLease // in flight per key, oldest first
	lastFree time.Time
	freed    chan struct{} // closed, and replaced, when a slot frees
}

// DeliveryTurnover is DeliveryPool's default turnover.
const DeliveryTurnover = 50 * time.Millisecond

// ErrPreempted is the cause of a preempted delivery's context.
var ErrPreempted = errors.New("worker: webhook delivery preempted: another key's delivery took its slot")

// NewDeliveryPool returns a pool of slots delivery slots.
func NewDeliveryPool(slots int) *DeliveryPool {
	return &DeliveryPool{slots: max(slots, 1), turnover: DeliveryTurnover, now: time.Now,
		runs: map[string][]*DeliveryLease{}, freed: make(chan struct{})}
}

// WebhookServerConcurrency is the asynq concurrency of a webhook server
// whose pool has slots slots: one goroutine more, to take the next task
// off the queue while every slot is held.
func WebhookServerConcurrency(slots int) int { return slots + 1 }

// DeliveryLease is a slot a delivery holds until Release.
type DeliveryLease struct {
	pool    *DeliveryPool
	owner   string
	ctx     context.Context
	cancel  context.CancelCauseFunc
	started time.Time
	// pinned: the task's last delivery, which asynq archives if it
	// returns a WaitError; it is never preempted.
	pinned bool
	// preempted and released are guarded by pool.mu.
	preempted, released bool
}

// Context is the delivery's context: it ends with the one Acquire was
// given, or when another key's delivery preempts this one (cause
// ErrPreempted).
func (l *DeliveryLease) Context() context.Context { return l.ctx }

// Preempted reports whether another key's delivery took the slot.
func (l *DeliveryLease) Preempted() bool {
	l.pool.mu.Lock()
	defer l.pool.mu.Unlock()
	return l.preempted
}

// Release gives the slot back (once; a preempted delivery's slot is
// already another's).
func (l *DeliveryLease) Release() {
	p := l.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.released {
		return
	}
	l.released = true
	l.cancel(nil)
	if l.preempted {
		return
	}
	p.remove(l)
	p.used--
	p.lastFree = p.now()
	close(p.freed)
	p.freed = make(chan struct{})
}

// remove drops l from its key's runs.
func (p *DeliveryPool) remove(l *DeliveryLease) {
	rs := p.runs[l.owner]
	for i, r := range rs {
		if r == l {
			rs = append(rs[:i], rs[i+1:]...)
			break
		}
	}
	if len(rs) == 0 {
		delete(p.runs, l.owner)
	} else {
		p.runs[l.owner] = rs
	}
}

// Acquire asks for a slot for a delivery of owner's. It returns the
// lease, or nil and how long the delivery should wait before it asks
// again. pinned marks the task's last delivery: it is admitted even over
// the slots, and never preempted (asynq would archive it for waiting).
func (p *DeliveryPool) Acquire(ctx context.Context, owner string, pinned bool) (*DeliveryLease, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var deadline time.Time
	for {
		if l := p.tryLocked(ctx, owner, pinned); l != nil {
			return l, 0
		}
		now := p.now()
		if deadline.IsZero() {
			if now.Sub(p.lastFree) > p.turnover {
				return nil, p.waitLocked(owner, now)
			}
			deadline = now.Add(p.turnover)
		}
		if !now.Before(deadline) {
			return nil, p.waitLocked(owner, now)
		}
		freed := p.freed
		p.mu.Unlock()
		t := time.NewTimer(deadline.Sub(now))
		select {
		case <-freed:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		p.mu.Lock()
		if ctx.Err() != nil {
			return nil, p.waitLocked(owner, p.now())
		}
	}
}

// tryLocked takes a free slot, or one preempted from the key holding
// most, or returns nil.
func (p *DeliveryPool) tryLocked(ctx context.Context, owner string, pinned bool) *DeliveryLease {
	if p.used < p.slots || pinned {
		p.used++
		return p.grantLocked(ctx, owner, pinned)
	}
	mine := len(p.runs[owner])
	var victim *DeliveryLease
	most := 0
	for k, rs := range p.runs {
		if k == owner || len(rs) <= mine+1 {
			continue
		}
		// The key's newest delivery that may be preempted: it has done
		// the least. Between keys that hold as many, the newest.
		var c *DeliveryLease
		for i := len(rs) - 1; i >= 0 && c == nil; i-- {
			if !rs[i].pinned {
				c = rs[i]
			}
		}
		if c != nil && (victim == nil || len(rs) > most || (len(rs) == most && c.started.After(victim.started))) {
			victim, most = c, len(rs)
		}
	}
	if victim == nil {
		return nil
	}
	victim.preempted = true
	victim.cancel(ErrPreempted)
	p.remove(victim)
	return p.grantLocked(ctx, owner, pinned)
}

func (p *DeliveryPool) grantLocked(ctx context.Context, owner string, pinned bool) *DeliveryLease {
	lctx, cancel := context.WithCancelCause(ctx)
	l := &DeliveryLease{pool: p, owner: owner, ctx: lctx, cancel: cancel, started: p.now(), pinned: pinned}
	p.runs[owner] = append(p.runs[owner], l)
	return l
}

// waitLocked is how long a refused delivery of owner's waits: about as
// long as owner's oldest delivery in flight has run, since its slots free
// no faster than its receiver answers (a second for one that answers at
// once, up to 10 s for one that hangs), plus up to a second of jitter, so
// that a key's many waiting deliveries cost a few asks a second.
func (p *DeliveryPool) waitLocked(owner string, now time.Time) time.Duration {
	d := time.Second
	if rs := p.runs[owner]; len(rs) > 0 {
		d = min(max(now.Sub(rs[0].started), time.Second), 10*time.Second)
	}
	return d + rand.N(time.Second)
}

// Held returns how many slots each key holds now, for metrics and tests.
func (p *DeliveryPool) Held() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]int, len(p.runs))
	for k, rs := range p.runs {
		m[k] = len(rs)
	}
	return m
}
