package store_test

import (
	"testing"
	"time"
)

// TestLease: one holder at a time; the holder renews, and another takes
// over once the lease has expired.
func TestLease(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	if ok, err := s.AcquireLease(ctx, "l", "a", 200*time.Millisecond); !ok || err != nil {
		t.Fatalf("a: %v %v", ok, err)
	}
	if ok, _ := s.AcquireLease(ctx, "l", "b", 200*time.Millisecond); ok {
		t.Fatal("b took a live lease")
	}
	if ok, _ := s.AcquireLease(ctx, "l", "a", 200*time.Millisecond); !ok {
		t.Fatal("a could not renew")
	}
	time.Sleep(300 * time.Millisecond)
	if ok, _ := s.AcquireLease(ctx, "l", "b", 200*time.Millisecond); !ok {
		t.Fatal("b could not take an expired lease")
	}
}
