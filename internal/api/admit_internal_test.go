package api

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/store"
)

// Requests that each take their bytes bit by bit from a pool smaller
// than their sum all finish: the oldest holder may always take more, so
// holding part of the pool while waiting for the rest never deadlocks. A
// plain weighted semaphore stops here with every request holding a share.
func TestPoolNeverDeadlocks(t *testing.T) {
	const capacity, requests, body, piece = 1000, 16, 600, 50
	p := newPool(capacity)
	var wg sync.WaitGroup
	var peak int64
	var mu sync.Mutex
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk := p.ticket()
			defer tk.release()
			for got := 0; got < body; got += piece {
				if err := tk.take(ctx, piece); err != nil {
					t.Errorf("take: %v", err)
					return
				}
				mu.Lock()
				peak = max(peak, p.inUse())
				mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if p.inUse() != 0 {
		t.Errorf("%d bytes still held after every request ended", p.inUse())
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
	p := newPool(100)
	first := p.ticket()
	ctx := context.Background()
	if err := first.take(ctx, 100); err != nil {
		t.Fatal(err)
	}
	// The oldest may go beyond the capacity.
	if err := first.take(ctx, 1); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	third := p.ticket()
	if err := third.take(short, 10); err == nil {
		t.Fatalf("took 10 from a full pool")
	}
	done := make(chan error, 1)
	go func() { done <- third.take(ctx, 10) }()
	time.Sleep(20 * time.Millisecond)
	first.release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("take after release: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("take still waits after the pool emptied")
	}
	if got := p.inUse(); got != 10 {
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
	p := newPool(100)
	ctx := context.Background()
	gone := p.ticket()
	if err := gone.take(ctx, 10); err != nil {
		t.Fatal(err)
	}
	gone.put(10)
	gone.release()
	again := p.ticket() // took, gave back, took again: one entry
	for range 2 {
		if err := again.take(ctx, 5); err != nil {
			t.Fatal(err)
		}
		again.put(5)
	}
	again.release()
	alone, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tk := p.ticket()
	defer tk.release()
	if err := tk.take(alone, 150); err != nil {
		t.Fatalf("the only holder could not overdraw the pool: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.holders) != 1 {
		t.Errorf("%d holders, want the one that holds", len(p.holders))
	}
}

// bodyTime: the grace, plus the bytes at the rate, never past
// maxBodyTime.
func TestBodyTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		grace time.Duration
		rate  int64
		n     int64
		want  time.Duration
	}{
		{30 * time.Second, 64 << 10, 0, 30 * time.Second},
		{30 * time.Second, 64 << 10, 640 << 10, 40 * time.Second},
		{time.Second, 1000, 1500, 2500 * time.Millisecond},
		{30 * time.Second, 64 << 10, 256 << 20, maxBodyTime}, // 4,126 s at the rate
		{time.Hour, 64 << 10, 0, maxBodyTime},
	} {
		if got := bodyTime(tc.grace, tc.rate, tc.n); got != tc.want {
			t.Errorf("bodyTime(%s, %d B/s, %d B) = %s, want %s", tc.grace, tc.rate, tc.n, got, tc.want)
		}
	}
	if maxBodyTime >= store.StagingTTL {
		t.Errorf("maxBodyTime %s: a batch's staged items (StagingTTL %s) would expire before its body is in", maxBodyTime, store.StagingTTL)
	}
}
