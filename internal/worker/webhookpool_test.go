package worker

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func acquireOK(t *testing.T, p *DeliveryPool, owner string) *DeliveryLease {
	t.Helper()
	l, wait := p.Acquire(context.Background(), owner, false)
	if l == nil {
		t.Fatalf("%s refused (wait %v), held %v", owner, wait, p.Held())
	}
	return l
}

func wantHeld(t *testing.T, p *DeliveryPool, want map[string]int) {
	t.Helper()
	if got := p.Held(); !maps.Equal(got, want) {
		t.Fatalf("held %v, want %v", got, want)
	}
}

// A key alone uses every slot; past them it waits, for at least a second.
func TestDeliveryPoolLoneKeyUsesAll(t *testing.T) {
	p := NewDeliveryPool(4)
	// A turnover of an hour tells "at once" from "waited for a slot to
	// free" by seconds, not by milliseconds a loaded machine may take.
	p.turnover = time.Hour
	for range 4 {
		acquireOK(t, p, "a")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	l, wait := p.Acquire(ctx, "a", false)
	if l != nil || wait < time.Second || wait > 11*time.Second {
		t.Fatalf("fifth delivery of a lone key: lease %v wait %v; want refused, 1-11 s", l, wait)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("refusal with no slot ever freed took %v, want at once", d)
	}
	wantHeld(t, p, map[string]int{"a": 4})
}

// A newcomer takes slots from the key holding every one, newest first,
// until both hold as many; then it waits too.
func TestDeliveryPoolPreemptsToEqualShares(t *testing.T) {
	p := NewDeliveryPool(4)
	var a []*DeliveryLease
	for range 4 {
		a = append(a, acquireOK(t, p, "a"))
		time.Sleep(time.Millisecond) // distinct start times
	}
	b1 := acquireOK(t, p, "b")
	if !a[3].Preempted() || context.Cause(a[3].Context()) != ErrPreempted {
		t.Fatalf("a's newest delivery: preempted %v cause %v", a[3].Preempted(), context.Cause(a[3].Context()))
	}
	for _, l := range a[:3] {
		if l.Preempted() || l.Context().Err() != nil {
			t.Fatal("an older delivery of a was preempted")
		}
	}
	wantHeld(t, p, map[string]int{"a": 3, "b": 1})
	acquireOK(t, p, "b")
	if !a[2].Preempted() {
		t.Fatal("a's second newest was not preempted for b's second delivery")
	}
	wantHeld(t, p, map[string]int{"a": 2, "b": 2})
	if l, _ := p.Acquire(context.Background(), "b", false); l != nil {
		t.Fatalf("b took a third slot from a holding 2: held %v", p.Held())
	}
	// The preempted ones give nothing back: their slots are b's.
	a[3].Release()
	a[2].Release()
	wantHeld(t, p, map[string]int{"a": 2, "b": 2})
	b1.Release()
	wantHeld(t, p, map[string]int{"a": 2, "b": 1})
	b1.Release() // twice: no effect
	wantHeld(t, p, map[string]int{"a": 2, "b": 1})
	acquireOK(t, p, "a") // a free slot goes to whoever asks
	wantHeld(t, p, map[string]int{"a": 3, "b": 1})
}

// Two keys that share every slot cannot keep a third out: it takes one
// from one of them (max-min 2/1/1 of 4), and no more.
func TestDeliveryPoolThirdKeyGetsShare(t *testing.T) {
	p := NewDeliveryPool(4)
	for range 2 {
		acquireOK(t, p, "a")
		acquireOK(t, p, "c")
	}
	acquireOK(t, p, "d")
	h := p.Held()
	if h["d"] != 1 || h["a"]+h["c"] != 3 || h["a"] < 1 || h["c"] < 1 {
		t.Fatalf("held %v, want d 1 and a, c 2 and 1", h)
	}
	if l, _ := p.Acquire(context.Background(), "d", false); l != nil {
		t.Fatalf("d took a second slot: %v", p.Held())
	}
	// The key with two gives one to a fourth key, and then none.
	acquireOK(t, p, "e")
	wantHeld(t, p, map[string]int{"a": 1, "c": 1, "d": 1, "e": 1})
	if l, _ := p.Acquire(context.Background(), "f", false); l != nil {
		t.Fatalf("a fifth key took a slot from keys holding one each: %v", p.Held())
	}
}

// A task's last delivery is admitted over the slots, and never preempted.
func TestDeliveryPoolPinned(t *testing.T) {
	p := NewDeliveryPool(2)
	l1, _ := p.Acquire(context.Background(), "a", true)
	l2, _ := p.Acquire(context.Background(), "a", true)
	l3, _ := p.Acquire(context.Background(), "a", true)
	if l1 == nil || l2 == nil || l3 == nil {
		t.Fatal("a last delivery was refused")
	}
	if l, _ := p.Acquire(context.Background(), "b", false); l != nil {
		t.Fatalf("b preempted pinned deliveries: %v", p.Held())
	}
	for _, l := range []*DeliveryLease{l1, l2, l3} {
		if l.Preempted() {
			t.Fatal("a pinned delivery was preempted")
		}
		l.Release()
	}
	wantHeld(t, p, map[string]int{})
	acquireOK(t, p, "b")
	acquireOK(t, p, "b")
}

// While slots turn over (one freed within the turnover), a refused
// delivery waits for the next to free instead of going round asynq's
// retry set; the one that waited gets it.
func TestDeliveryPoolWaitsWhileSlotsTurnOver(t *testing.T) {
	p := NewDeliveryPool(1)
	p.turnover = 20 * time.Second
	first := acquireOK(t, p, "a")
	first.Release() // a slot freed just now
	held := acquireOK(t, p, "a")
	var released atomic.Bool
	go func() {
		time.Sleep(50 * time.Millisecond)
		released.Store(true)
		held.Release()
	}()
	l, wait := p.Acquire(context.Background(), "a", false)
	if l == nil {
		t.Fatalf("refused (wait %v) while slots turn over", wait)
	}
	if !released.Load() {
		t.Error("got a slot before the held one was released")
	}
	l.Release()
	// No slot freed within the turnover: refused at once. The pool's clock
	// runs an hour ahead, so the last free is an hour old, and waiting
	// (the turnover, 20 s) is told from refusing at once by 10 s.
	hold := acquireOK(t, p, "a")
	defer hold.Release()
	p.mu.Lock()
	p.now = func() time.Time { return time.Now().Add(time.Hour) }
	p.mu.Unlock()
	start := time.Now()
	if l, _ := p.Acquire(context.Background(), "a", false); l != nil {
		t.Fatal("admitted over the slots")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("refusal took %v with no slot turning over, want at once (not the turnover, %v)", d, p.turnover)
	}
}

// A waiter whose context ends stops waiting.
func TestDeliveryPoolWaitEndsWithContext(t *testing.T) {
	p := NewDeliveryPool(1)
	p.turnover = time.Minute
	acquireOK(t, p, "x").Release()
	acquireOK(t, p, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	if l, _ := p.Acquire(ctx, "a", false); l != nil {
		t.Fatal("admitted over the slots")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("waited %v past its context", d)
	}
}

// Many deliveries of several keys at once: no more run than the slots,
// every lease ends, and the counts go back to nothing (run with -race).
func TestDeliveryPoolConcurrent(t *testing.T) {
	const slots = 4
	p := NewDeliveryPool(slots)
	var running, peak, preempted atomic.Int64
	var wg sync.WaitGroup
	keys := []string{"a", "b", "c"}
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				l, _ := p.Acquire(context.Background(), keys[(g+i)%len(keys)], false)
				if l == nil {
					continue
				}
				p.mu.Lock()
				if p.used > slots {
					t.Errorf("%d slots used of %d", p.used, slots)
				}
				p.mu.Unlock()
				n := running.Add(1)
				for {
					m := peak.Load()
					if n <= m || peak.CompareAndSwap(m, n) {
						break
					}
				}
				select {
				case <-l.Context().Done():
					if !errors.Is(context.Cause(l.Context()), ErrPreempted) {
						t.Errorf("lease ended with %v", context.Cause(l.Context()))
					}
					preempted.Add(1)
				case <-time.After(time.Duration(i%3) * time.Millisecond):
				}
				running.Add(-1)
				l.Release()
			}
		}()
	}
	wg.Wait()
	wantHeld(t, p, map[string]int{})
	p.mu.Lock()
	used := p.used
	p.mu.Unlock()
	if used != 0 {
		t.Fatalf("%d slots used after every lease ended", used)
	}
	// A preempted delivery still runs until it sees its context end, so
	// running may pass the slots by the preempted ones still unwinding.
	if peak.Load() > slots+preempted.Load() {
		t.Errorf("peak %d running over %d slots with %d preemptions", peak.Load(), slots, preempted.Load())
	}
	t.Logf("peak %d, preemptions %d", peak.Load(), preempted.Load())
}
