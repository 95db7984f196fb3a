package lease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/lease"
)

// Renew renews until stop, and never after stop has returned; a renewal
// sees its context end with stop.
func TestRenewUntilStop(t *testing.T) {
	var calls, after atomic.Int32
	var stopped atomic.Bool
	renewed := make(chan struct{}, 1)
	stop := lease.Renew(context.Background(), time.Millisecond, func(ctx context.Context) {
		if stopped.Load() {
			after.Add(1)
		}
		calls.Add(1)
		select {
		case renewed <- struct{}{}:
		default:
		}
	})
	for range 3 {
		select {
		case <-renewed:
		case <-time.After(10 * time.Second):
			t.Fatal("no renewal within 10 s")
		}
	}
	stop()
	stopped.Store(true)
	n := calls.Load()
	time.Sleep(20 * time.Millisecond)
	if got := calls.Load(); got != n || after.Load() != 0 {
		t.Fatalf("renewals after stop returned: %d before, %d after (%d flagged)", n, got, after.Load())
	}
	if n < 3 {
		t.Fatalf("%d renewals, want at least 3", n)
	}
}

// Renew stops when its parent context ends, and stop still returns.
func TestRenewEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	stop := lease.Renew(ctx, time.Millisecond, func(context.Context) { calls.Add(1) })
	cancel()
	stop() // returns once the goroutine has seen ctx end
	n := calls.Load()
	time.Sleep(20 * time.Millisecond)
	if got := calls.Load(); got != n {
		t.Fatalf("renewals after ctx ended and stop returned: %d, then %d", n, got)
	}
}
