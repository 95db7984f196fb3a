package admission

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// Requests that each take their bytes bit by bit from a pool smaller
// than their sum all finish: the oldest holder may always take more, so
// holding part of the pool while waiting for the rest never deadlocks. A
// plain weighted semaphore stops here with every request holding a share.
func TestPoolNeverDeadlocks(t *testing.T) {
	const capacity, requests, body, piece = 1000, 16, 600, 50
	p := New(capacity, capacity)
	var wg sync.WaitGroup
	var peak int64
	var mu sync.Mutex
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk := p.Ticket("")
			defer tk.Release()
			for got := 0; got < body; got += piece {
				if err := tk.Take(ctx, piece); err != nil {
					t.Errorf("take: %v", err)
					return
				}
				mu.Lock()
				peak = max(peak, p.InUse())
				mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if p.InUse() != 0 {
		t.Errorf("%d bytes still held after every request ended", p.InUse())
	}
	// The capacity, plus what the oldest may overdraw: one body.
	if peak > capacity+body {
		t.Errorf("peak %d bytes held, want at most %d", peak, capacity+body)
	}
	if peak <= body {
		t.Errorf("peak %d: requests never overlapped; the test proves nothing", peak)
	}
}

// A request that is not the oldest waits while the pool is full, and
// goes on once weight comes back; its context ends the wait.
func TestPoolWaitsAndGivesUp(t *testing.T) {
	p := New(100, 100)
	first := p.Ticket("")
	ctx := context.Background()
	if err := first.Take(ctx, 100); err != nil {
		t.Fatal(err)
	}
	// The oldest may go beyond the capacity.
	if err := first.Take(ctx, 1); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	third := p.Ticket("")
	if err := third.Take(short, 10); err == nil {
		t.Fatalf("took 10 from a full pool")
	}
	done := make(chan error, 1)
	go func() { done <- third.Take(ctx, 10) }()
	time.Sleep(20 * time.Millisecond)
	first.Release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("take after release: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("take still waits after the pool emptied")
	}
	if got := p.InUse(); got != 10 {
		t.Errorf("in use %d, want 10", got)
	}
}

// A ticket that gave back all it held (put) and was released is no
// holder any more: before, it stayed first in the holders for good, so
// no later request was ever the oldest, and one that needed more than
// the capacity (a large fill batch) waited until its deadline (503),
// whatever else was running. An events stream that sent results (take,
// then put) and ended left such a ticket.
func TestPoolForgetsAnEmptyTicket(t *testing.T) {
	p := New(100, 100)
	ctx := context.Background()
	gone := p.Ticket("")
	if err := gone.Take(ctx, 10); err != nil {
		t.Fatal(err)
	}
	gone.Put(10)
	gone.Release()
	again := p.Ticket("") // took, gave back, took again: one entry
	for range 2 {
		if err := again.Take(ctx, 5); err != nil {
			t.Fatal(err)
		}
		again.Put(5)
	}
	again.Release()
	alone, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tk := p.Ticket("")
	defer tk.Release()
	if err := tk.Take(alone, 150); err != nil {
		t.Fatalf("the only holder could not overdraw the pool: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.holders) != 1 {
		t.Errorf("%d holders, want the one that holds", len(p.holders))
	}
}

// One key's requests hold at most its share of the pool, so a request of
// another key is admitted at once while the first key's newer requests
// wait; the key's oldest request may go past its share (or a key whose
// requests each need more than the share would wait on itself); and a
// request without an owner is bound by the pool alone.
func TestPoolKeyShare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	short := func(t *testing.T) context.Context {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	for _, tc := range []struct {
		name string
		// a's first ticket takes first, then a's second, then b's one.
		aFirst, aSecond, b int64
		keyCap             int64
		secondOK, bOK      bool
	}{
		// With a and b sharing 100, each may hold 33 and, past 25, only
		// while 25 stay free for a key yet to come.
		{"a's second waits on its share, b goes on", 40, 20, 30, 50, false, true},
		{"a's two fit in its share", 30, 20, 25, 50, true, true},
		{"b may not take the room kept for a third key", 30, 20, 30, 50, true, false},
		{"no share (as large as the pool): a fills the pool, b waits", 40, 50, 20, 100, true, false},
		{"a's oldest may go past its share; b still has the room kept for it", 70, 0, 20, 50, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := New(100, tc.keyCap)
			a1, a2, b := p.Ticket("a"), p.Ticket("a"), p.Ticket("b")
			defer a1.Release()
			defer a2.Release()
			defer b.Release()
			if err := a1.Take(ctx, tc.aFirst); err != nil {
				t.Fatalf("a's first request: %v", err)
			}
			err := a2.TakeUntil(short(t), time.Now().Add(30*time.Millisecond), tc.aSecond)
			if tc.secondOK != (err == nil) {
				t.Fatalf("a's second request took %d: %v, want ok=%v", tc.aSecond, err, tc.secondOK)
			}
			if err != nil && !errors.Is(err, ErrKeyShareFull) {
				t.Errorf("a's second request: %v, want ErrKeyShareFull (its own key was in the way)", err)
			}
			err = b.TakeUntil(short(t), time.Now().Add(30*time.Millisecond), tc.b)
			if tc.bOK != (err == nil) {
				t.Fatalf("b took %d: %v, want ok=%v", tc.b, err, tc.bOK)
			}
			if err != nil && errors.Is(err, ErrKeyShareFull) {
				t.Errorf("b: %v: b holds nothing of its own share, the pool was in the way", err)
			}
		})
	}

	t.Run("no owner: the pool alone", func(t *testing.T) {
		p := New(100, 10)
		x, y := p.Ticket(""), p.Ticket("")
		defer x.Release()
		defer y.Release()
		if err := x.Take(ctx, 60); err != nil {
			t.Fatal(err)
		}
		if err := y.TakeUntil(short(t), time.Time{}, 40); err != nil {
			t.Fatalf("a second request without an owner waited on a share: %v", err)
		}
	})

	t.Run("a waiting request goes on when its key gives back", func(t *testing.T) {
		p := New(100, 50)
		a1, a2 := p.Ticket("a"), p.Ticket("a")
		defer a2.Release()
		if err := a1.Take(ctx, 50); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- a2.Take(ctx, 30) }()
		time.Sleep(20 * time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("a's second request did not wait on its share: %v", err)
		default:
		}
		a1.Release()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("a's second request still waits after the first gave back")
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if ks := p.keys["a"]; ks == nil || ks.used != 30 || len(ks.holders) != 1 || p.used != 30 {
			t.Errorf("a's share %+v, pool %d used: want 30 held by one request", ks, p.used)
		}
	})

	t.Run("shares are forgotten when empty", func(t *testing.T) {
		p := New(100, 50)
		a := p.Ticket("a")
		if err := a.Take(ctx, 10); err != nil {
			t.Fatal(err)
		}
		a.Put(10)
		w := p.Ticket("w")
		if err := w.TakeUntil(short(t), time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		a.Release()
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.keys) != 0 || p.used != 0 || len(p.holders) != 0 {
			t.Errorf("after every request gave back: %d shares, %d used, %d holders; want none", len(p.keys), p.used, len(p.holders))
		}
	})
}

// Requests of a few keys, each taking bit by bit more than its key's
// share in all, all finish (the key's oldest may go past the share, the
// pool's oldest past the pool), and no key ever holds more than its share
// plus one request's body while another key waits on it.
func TestPoolKeySharesNeverDeadlock(t *testing.T) {
	const capacity, keyCap, perKey, body, piece = 1000, 400, 6, 300, 25
	p := New(capacity, keyCap)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var peakPool, peakKey int64
	for k := range 3 {
		owner := string(rune('a' + k))
		for range perKey {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk := p.Ticket(owner)
				defer tk.Release()
				for got := 0; got < body; got += piece {
					if err := tk.Take(ctx, piece); err != nil {
						t.Errorf("take: %v", err)
						return
					}
					p.mu.Lock()
					used := int64(0)
					if ks := p.keys[owner]; ks != nil {
						used = ks.used
					}
					inUse := p.used
					p.mu.Unlock()
					mu.Lock()
					peakPool, peakKey = max(peakPool, inUse), max(peakKey, used)
					mu.Unlock()
					time.Sleep(time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	if p.InUse() != 0 || len(p.keys) != 0 {
		t.Errorf("%d bytes and %d shares still held after every request ended", p.InUse(), len(p.keys))
	}
	if peakKey > keyCap+body {
		t.Errorf("a key held %d bytes at its peak, want at most its share %d plus one body %d", peakKey, keyCap, body)
	}
	if peakPool > capacity+body {
		t.Errorf("the pool held %d bytes at its peak, want at most %d", peakPool, capacity+body)
	}
	if peakKey <= body {
		t.Errorf("a key's peak %d: its requests never overlapped; the test proves nothing", peakKey)
	}
}

// fill takes piece by piece from tk, each take refused at once when it
// does not fit, until the pool refuses one: what a key's stalled uploads
// hold when they arrive one after another. It returns what tk holds.
func fill(t *testing.T, tk *Ticket, piece int64) int64 {
	t.Helper()
	for {
		if err := tk.TakeUntil(context.Background(), time.Now().Add(time.Millisecond), piece); err != nil {
			return tk.Holding()
		}
	}
}

// Keys that arrive one after another and each take all the pool lets
// them (holding it, as stalled uploads do) leave room for the next key,
// up to the three abusive keys of the fault suite's scenario: each key's
// share shrinks as more come (max-min), a lone key reaches its ceiling,
// and room stays kept for a key yet to come.
func TestPoolFairSharesLeaveRoomForTheNextKey(t *testing.T) {
	t.Parallel()
	const capacity, ceiling, piece = 32 << 20, 16 << 20, 32 << 10
	p := New(capacity, ceiling)
	// Each key's requests: an oldest one that holds little (a key's
	// oldest may go past its share), then the many that fill it.
	var held []int64
	for k := range 3 {
		owner := string(rune('a' + k))
		first := p.Ticket(owner)
		defer first.Release()
		if err := first.Take(context.Background(), piece); err != nil {
			t.Fatal(err)
		}
		tk := p.Ticket(owner)
		defer tk.Release()
		got := piece + fill(t, tk, piece)
		held = append(held, got)
		keys := int64(k + 1)
		if bound := min(ceiling, capacity/(keys+1)); got > bound {
			t.Errorf("key %s took %d alongside %d keys, want at most its share %d", owner, got, keys-1, bound)
		}
		free := capacity - p.InUse()
		if kept := capacity / (keys + 2); free < min(kept, capacity/20) {
			t.Errorf("after key %s: %d free, want the room kept for the next key", owner, free)
		}
	}
	if held[0] < ceiling-piece {
		t.Errorf("a lone key took %d, want up to its ceiling %d", held[0], ceiling)
	}
	// A fourth key's small requests get room at once, and its share
	// (capacity/5, or what is free) is at least a megabyte here.
	d := p.Ticket("d")
	defer d.Release()
	got := fill(t, d, piece)
	if got < 1<<20 {
		t.Errorf("a fourth key got %d bytes at once next to three keys that fill their shares, want at least 1 MiB (holds %v)", got, held)
	}
	t.Logf("three keys in turn hold %v of %d; a fourth gets %d at once", held, capacity, got)
}

// A key that waits counts among those that share the pool: the keys
// already over the new share take nothing more, so what they give back
// goes to the waiting key; and once the waiting key leaves, the others'
// shares grow back.
func TestPoolWaitingKeyShrinksTheOthersShares(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := New(120, 120/2)
	a1, a2 := p.Ticket("a"), p.Ticket("a")
	defer a1.Release()
	defer a2.Release()
	if err := a1.Take(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := a2.Take(ctx, 50); err != nil { // a alone: share 60
		t.Fatal(err)
	}
	c := p.Ticket("c")
	defer c.Release()
	if err := c.Take(ctx, 30); err != nil { // two keys: share 40, 30 kept
		t.Fatal(err)
	}
	// b needs 40: more than the room kept for it and more than is free
	// beyond the room kept for a fourth key, so it waits; a, at 60, is
	// over its share of three keys (30) and takes nothing more.
	b := p.Ticket("b")
	defer b.Release()
	done := make(chan error, 1)
	go func() { done <- b.Take(ctx, 25) }()
	waitFor(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.keys["b"] != nil && p.keys["b"].waiting == 1 })
	a3 := p.Ticket("a")
	defer a3.Release()
	if err := a3.TakeUntil(ctx, time.Now().Add(20*time.Millisecond), 1); !errors.Is(err, ErrKeyShareFull) {
		t.Fatalf("a, over its share while b waits, took 1 more: %v", err)
	}
	a2.Release() // a gives back 50: b gets its 25
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b still waits after a gave back")
	}
	b.Release()
	c.Release()
	// a alone again: its share is its ceiling.
	if err := a3.TakeUntil(ctx, time.Now().Add(20*time.Millisecond), 45); err != nil {
		t.Fatalf("a alone again could not take up to its ceiling: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.keys) != 1 {
		t.Errorf("%d keys share the pool, want a alone", len(p.keys))
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition never held")
		}
	}
}

// A take gives up at its deadline, however far its context's end:
// with context.DeadlineExceeded when other keys hold the pool, wrapped in
// ErrKeyShareFull when its own key's requests hold its share; and the
// give-up leaves no trace of the waiting key.
func TestPoolGivesUpAtItsDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const bound = 100 * time.Millisecond
	p := New(100, 50)
	a1 := p.Ticket("a")
	defer a1.Release()
	if err := a1.Take(ctx, 95); err != nil { // the pool's oldest: past the pool and a's share
		t.Fatal(err)
	}
	for _, tc := range []struct {
		owner string
		share bool
	}{{"b", false}, {"a", true}} {
		tk := p.Ticket(tc.owner)
		start := time.Now()
		err := tk.TakeUntil(ctx, time.Now().Add(bound), 10)
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrKeyShareFull) != tc.share {
			t.Errorf("%s: %v, want the deadline, ErrKeyShareFull %v", tc.owner, err, tc.share)
		}
		if took < bound || took > bound+2*time.Second {
			t.Errorf("%s gave up after %v, want about %v", tc.owner, took, bound)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.keys["b"]; ok || p.keys["a"].waiting != 0 {
		t.Errorf("a give-up left a waiting key: %+v", p.keys)
	}
}

// Many keys' requests take and give back at random, some with a short
// deadline, some without, under -race: every request ends, none holds past the pool's
// bound, and the pool is empty after.
func TestPoolManyKeysChurn(t *testing.T) {
	t.Parallel()
	const capacity, ceiling, body, piece = 4000, 2000, 300, 50
	p := New(capacity, ceiling)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var peak, refused, done int64
	for k := range 6 {
		owner := string(rune('a' + k))
		for r := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 20 {
					tk := p.Ticket(owner)
					var deadline time.Time
					if (r+i)%2 == 0 {
						deadline = time.Now().Add(5 * time.Millisecond)
					}
					ok := true
					for got := 0; got < body && ok; got += piece {
						if err := tk.TakeUntil(ctx, deadline, piece); err != nil {
							if !errors.Is(err, context.DeadlineExceeded) {
								t.Errorf("take: %v", err)
							}
							ok = false
						}
						mu.Lock()
						peak = max(peak, p.InUse())
						mu.Unlock()
					}
					tk.Release()
					mu.Lock()
					if ok {
						done++
					} else {
						refused++
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if p.InUse() != 0 || len(p.keys) != 0 || len(p.holders) != 0 {
		t.Errorf("after every request: %d bytes, %d keys, %d holders; want none", p.InUse(), len(p.keys), len(p.holders))
	}
	if peak > capacity+body {
		t.Errorf("peak %d, want at most %d", peak, capacity+body)
	}
	if done == 0 {
		t.Error("no request finished")
	}
	t.Logf("%d finished, %d refused at their bound, peak %d of %d", done, refused, peak, capacity)
}
