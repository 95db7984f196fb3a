// Package admission bounds the bytes that the API's requests hold in
// memory at once (request bodies as they arrive, results on their way
// out), with a share per API key so that one tenant cannot take it all.
// A request holds a Ticket and takes weight piece by piece as it holds
// it; internal/api meters bodies and results through it.
package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Pool bounds the bytes that requests hold in the API's memory at once:
// request bodies as they arrive, and results on their way out. A request
// takes weight for each piece as it holds it, never ahead (a slow upload
// that has sent ten bytes holds ten bytes), and gives it all back when it
// ends.
//
// Taking weight bit by bit invites a deadlock that a plain weighted
// semaphore (golang.org/x/sync/semaphore) cannot avoid: when every request
// holds part of the pool and waits for more, none can finish. So the
// oldest holder may always take more, beyond the capacity: it can never be
// blocked, it finishes and gives back, and the next oldest goes on. The
// memory bound is thus the capacity plus one request's own limit (its body
// limit, or one result).
//
// The pool is shared fairly between API keys (owners): with n keys
// holding or waiting for weight, each may hold at most
//
//	share = min(keyCapacity, capacity/(n+1))
//
// and a key that holds more than capacity/(n+2) may take more only while
// that much of the pool stays free: the room of a key that is not here
// yet. So however many keys fill their shares, and in whatever order they
// came, a key that arrives finds room at once, and every key's share
// shrinks as more keys wait (max-min fairness: a key over its share takes
// nothing more, so what its requests give back goes to the others). A
// lone key may use up to keyCapacity (MAX_KEY_BYTES_IN_FLIGHT), the
// ceiling. The weight a key held before others came is not taken back
// (a request's bytes cannot be), but the key takes nothing more until it
// is under its new share.
//
// A key's own requests cannot deadlock on its share: the key's oldest
// holder may go past the share (not past the room kept for others). The
// pool's oldest holder is also its key's oldest, so it is never blocked by
// either bound, and the memory bound above stands. Requests without an
// owner (auth off: one tenant) are bound by the pool alone, as are all
// when keyCapacity is the capacity or more.
//
// A take waits for room until its context ends or its deadline
// (TakeUntil): internal/api gives a request body's reads a short one, so
// that a body that cannot get room is refused while its client waits.
type Pool struct {
	capacity    int64
	keyCapacity int64 // each owner's share; no share when it is the capacity or more

	mu      sync.Mutex
	used    int64
	holders []*Ticket            // in the order of their first take; holders[0] may overdraw
	keys    map[string]*keyShare // the owners that hold or wait for weight now
	changed chan struct{}        // closed and replaced whenever weight is given back
}

// keyShare is what one owner's requests hold of the pool.
type keyShare struct {
	used    int64
	holders []*Ticket // the owner's, in the order of their first take; holders[0] may go past its share
	waiting int       // the owner's takes waiting for room now
}

func New(capacity, keyCapacity int64) *Pool {
	return &Pool{capacity: capacity, keyCapacity: keyCapacity, keys: map[string]*keyShare{}, changed: make(chan struct{})}
}

// Ticket is one request's share of the pool.
type Ticket struct {
	p     *Pool
	owner string // the API key's name, "" when auth is off
	held  int64
}

// Ticket returns an empty share for one request of owner; Release it
// when the request ends.
func (p *Pool) Ticket(owner string) *Ticket { return &Ticket{p: p, owner: owner} }

// ErrKeyShareFull marks a take that gave up while the ticket's owner held
// its whole share of the pool: the owner's own requests were in the way,
// not other tenants'. It wraps why the take gave up (its deadline, or its
// context's error), and a request that met it is answered 429
// rate_limited (internal/api's errKeyShare), whether it was reading a body or a result.
var ErrKeyShareFull = errors.New("admission: the key's share of the admission pool is full")

// Take adds n bytes to the share, waiting while the pool (or the owner's
// share of it) is full and the ticket is not the oldest holder. It fails
// only when ctx ends: with ErrKeyShareFull wrapping ctx's error when the
// owner's share was what it waited for.
func (t *Ticket) Take(ctx context.Context, n int64) error { return t.TakeUntil(ctx, time.Time{}, n) }

// TakeUntil is Take that also gives up at deadline (none when zero); it
// makes a timer only when it has to wait, so a body's reads, which take
// from a pool that is seldom full, cost no allocation for it. Giving up
// at the deadline while the owner's share was what stood in the way
// returns ErrKeyShareFull, which wraps context.DeadlineExceeded.
func (t *Ticket) TakeUntil(ctx context.Context, deadline time.Time, n int64) error {
	if n <= 0 {
		return nil
	}
	p := t.p
	var (
		expired <-chan time.Time
		ks      *keyShare
		waiting bool // counted in ks.waiting
	)
	for {
		p.mu.Lock()
		ks = p.share(t.owner)
		keyOK, poolOK := p.fits(t, ks, n)
		if keyOK && poolOK {
			if t.held == 0 {
				p.holders = append(p.holders, t)
				if ks != nil {
					ks.holders = append(ks.holders, t)
				}
			}
			t.held += n
			p.used += n
			if ks != nil {
				ks.used += n
				if waiting {
					ks.waiting--
				}
			}
			p.mu.Unlock()
			return nil
		}
		if ks != nil && !waiting {
			ks.waiting++ // the owner counts among the keys that share the pool
			waiting = true
		}
		changed := p.changed
		p.mu.Unlock()
		if expired == nil && !deadline.IsZero() {
			timer := time.NewTimer(time.Until(deadline))
			defer timer.Stop()
			expired = timer.C
		}
		var why error
		select {
		case <-changed:
			continue
		case <-ctx.Done():
			why = ctx.Err()
		case <-expired:
			why = context.DeadlineExceeded
		}
		p.mu.Lock()
		if waiting {
			p.stopWaiting(t.owner, ks)
		}
		p.mu.Unlock()
		if !keyOK {
			return fmt.Errorf("%w: %w", ErrKeyShareFull, why)
		}
		return why
	}
}

// fits tells whether t may take n bytes now: keyOK when its owner's share
// allows it, poolOK when the pool and the room kept for other keys do.
// The caller holds p.mu, and ks is t's owner's share (share).
func (p *Pool) fits(t *Ticket, ks *keyShare, n int64) (keyOK, poolOK bool) {
	if len(p.holders) == 0 || p.holders[0] == t {
		return true, true // the pool's oldest, never blocked
	}
	if ks == nil {
		return true, p.used+n <= p.capacity
	}
	keys := int64(len(p.keys)) // ks among them
	share := min(p.keyCapacity, p.capacity/(keys+1))
	kept := p.capacity / (keys + 2) // the room of a key yet to come
	keyOK = ks.used+n <= share || len(ks.holders) == 0 || ks.holders[0] == t
	poolOK = p.used+n <= p.capacity-kept || (ks.used+n <= kept && p.used+n <= p.capacity)
	return keyOK, poolOK
}

// stopWaiting ends one wait of owner's: an owner that then neither holds
// nor waits leaves the pool's count of keys, and the others' shares grow.
// The caller holds p.mu.
func (p *Pool) stopWaiting(owner string, ks *keyShare) {
	ks.waiting--
	if len(ks.holders) == 0 && ks.waiting == 0 && p.keys[owner] == ks {
		delete(p.keys, owner)
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

// share is owner's share, made when it takes its first bytes; nil when
// owners have no share of their own (no owner, or a share as large as
// the pool). The caller holds p.mu.
func (p *Pool) share(owner string) *keyShare {
	if owner == "" || p.keyCapacity >= p.capacity {
		return nil
	}
	ks := p.keys[owner]
	if ks == nil {
		ks = &keyShare{}
		p.keys[owner] = ks
	}
	return ks
}

// PageBytes is the most result bytes one page of a batch's items should
// carry for owner: most, or a quarter of what the page may take
// from (the owner's share, or the pool without one) when that is less. A
// page takes twice its results, so it then needs half of it, and a key
// that has an upload in progress can still read its results instead of
// waiting for the upload to end.
func (p *Pool) PageBytes(owner string, most int64) int64 {
	room := p.capacity
	if owner != "" {
		room = min(room, p.keyCapacity)
	}
	return max(1, min(most, room/4))
}

// Put gives back n bytes of the share, which must hold them.
func (t *Ticket) Put(n int64) {
	p := t.p
	p.mu.Lock()
	defer p.mu.Unlock()
	p.giveBack(t, min(n, t.held))
}

// giveBack takes n bytes off t and wakes the waiters; when t holds
// nothing more it is no holder, of the pool or of its owner's share, or
// it would stay first for good and no other could ever be the oldest.
// The caller holds p.mu.
func (p *Pool) giveBack(t *Ticket, n int64) {
	if n <= 0 {
		return
	}
	t.held -= n
	p.used -= n
	ks := p.share(t.owner)
	if ks != nil {
		ks.used -= n
	}
	if t.held == 0 {
		p.holders = drop(p.holders, t)
		if ks != nil {
			ks.holders = drop(ks.holders, t)
		}
	}
	if ks != nil && len(ks.holders) == 0 && ks.waiting == 0 {
		delete(p.keys, t.owner)
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// drop returns holders without t.
func drop(holders []*Ticket, t *Ticket) []*Ticket {
	for i, h := range holders {
		if h == t {
			return append(holders[:i], holders[i+1:]...)
		}
	}
	return holders
}

// Holding is the share's weight now. The body's reader may take more
// meanwhile, on another goroutine.
func (t *Ticket) Holding() int64 {
	t.p.mu.Lock()
	defer t.p.mu.Unlock()
	return t.held
}

// Release gives back the whole share. The ticket may take again after.
func (t *Ticket) Release() {
	p := t.p
	p.mu.Lock()
	defer p.mu.Unlock()
	p.giveBack(t, t.held)
}

// InUse reports the bytes held, for the metrics and tests.
func (p *Pool) InUse() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}
