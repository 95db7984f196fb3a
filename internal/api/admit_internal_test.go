package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/internal/store"
)

// Requests that each take their bytes bit by bit from a pool smaller
// than their sum all finish: the oldest holder may always take more, so
// holding part of the pool while waiting for the rest never deadlocks. A
// plain weighted semaphore stops here with every request holding a share.
func TestPoolNeverDeadlocks(t *testing.T) {
	const capacity, requests, body, piece = 1000, 16, 600, 50
	p := newPool(capacity, capacity)
	var wg sync.WaitGroup
	var peak int64
	var mu sync.Mutex
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk := p.ticket("")
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
	p := newPool(100, 100)
	first := p.ticket("")
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
	third := p.ticket("")
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
	p := newPool(100, 100)
	ctx := context.Background()
	gone := p.ticket("")
	if err := gone.take(ctx, 10); err != nil {
		t.Fatal(err)
	}
	gone.put(10)
	gone.release()
	again := p.ticket("") // took, gave back, took again: one entry
	for range 2 {
		if err := again.take(ctx, 5); err != nil {
			t.Fatal(err)
		}
		again.put(5)
	}
	again.release()
	alone, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tk := p.ticket("")
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
		{"a's second waits on its share, b goes on", 40, 20, 50, 50, false, true},
		{"a's two fit in its share", 30, 20, 50, 50, true, true},
		{"no share (as large as the pool): a fills the pool, b waits", 40, 50, 20, 100, true, false},
		{"a's oldest may go past its share", 70, 0, 20, 50, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPool(100, tc.keyCap)
			a1, a2, b := p.ticket("a"), p.ticket("a"), p.ticket("b")
			defer a1.release()
			defer a2.release()
			defer b.release()
			if err := a1.take(ctx, tc.aFirst); err != nil {
				t.Fatalf("a's first request: %v", err)
			}
			err := a2.takeUntil(short(t), time.Now().Add(30*time.Millisecond), tc.aSecond)
			if tc.secondOK != (err == nil) {
				t.Fatalf("a's second request took %d: %v, want ok=%v", tc.aSecond, err, tc.secondOK)
			}
			if err != nil && !errors.Is(err, errKeyShareFull) {
				t.Errorf("a's second request: %v, want errKeyShareFull (its own key was in the way)", err)
			}
			err = b.takeUntil(short(t), time.Now().Add(30*time.Millisecond), tc.b)
			if tc.bOK != (err == nil) {
				t.Fatalf("b took %d: %v, want ok=%v", tc.b, err, tc.bOK)
			}
			if err != nil && errors.Is(err, errKeyShareFull) {
				t.Errorf("b: %v: b holds nothing of its own share, the pool was in the way", err)
			}
		})
	}

	t.Run("no owner: the pool alone", func(t *testing.T) {
		p := newPool(100, 10)
		x, y := p.ticket(""), p.ticket("")
		defer x.release()
		defer y.release()
		if err := x.take(ctx, 60); err != nil {
			t.Fatal(err)
		}
		if err := y.takeUntil(short(t), time.Time{}, 40); err != nil {
			t.Fatalf("a second request without an owner waited on a share: %v", err)
		}
	})

	t.Run("a waiting request goes on when its key gives back", func(t *testing.T) {
		p := newPool(100, 50)
		a1, a2 := p.ticket("a"), p.ticket("a")
		defer a2.release()
		if err := a1.take(ctx, 50); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- a2.take(ctx, 30) }()
		time.Sleep(20 * time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("a's second request did not wait on its share: %v", err)
		default:
		}
		a1.release()
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
		p := newPool(100, 50)
		a := p.ticket("a")
		if err := a.take(ctx, 10); err != nil {
			t.Fatal(err)
		}
		a.put(10)
		w := p.ticket("w")
		if err := w.takeUntil(short(t), time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		a.release()
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
	p := newPool(capacity, keyCap)
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
				tk := p.ticket(owner)
				defer tk.release()
				for got := 0; got < body; got += piece {
					if err := tk.take(ctx, piece); err != nil {
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
	if p.inUse() != 0 || len(p.keys) != 0 {
		t.Errorf("%d bytes and %d shares still held after every request ended", p.inUse(), len(p.keys))
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

// TestPanickingHandlerGivesBackItsBytes: a handler that panics after
// reading its body (the recoverer answers 500) still gives its bytes back
// to the pool. Without it they were lost for good, and the ticket stayed
// its key's oldest holder.
func TestPanickingHandlerGivesBackItsBytes(t *testing.T) {
	s := &Server{admit: newPool(1<<20, 1<<20), metrics: newMetrics(prometheus.NewRegistry()),
		log: slog.New(slog.DiscardHandler), opts: Options{BodyReadTimeout: 5 * time.Second, BodyMinRate: 1}}
	e := gin.New()
	e.Use(s.recoverer(), s.admitted())
	e.POST("/boom", func(c *gin.Context) {
		if _, err := s.readBody(c, 1<<20); err != nil {
			t.Errorf("read: %v", err)
		}
		panic("boom")
	})
	w := httptest.NewRecorder()
	e.ServeHTTP(w, httptest.NewRequest("POST", "/boom", strings.NewReader(strings.Repeat("x", 100<<10))))
	if w.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", w.Code)
	}
	if n := s.admit.inUse(); n != 0 {
		t.Fatalf("the pool holds %d bytes after the panic", n)
	}
}

// TestPageBytes: a page of a batch's results needs at most half of what
// it may take from, the key's share or (without keys, or with a share as
// large as the pool) the pool, and never more than pageResultBytes.
func TestPageBytes(t *testing.T) {
	for _, tc := range []struct {
		capacity, share int64
		owner           string
		want            int64
	}{
		{32 << 20, 16 << 20, "", pageResultBytes},
		{32 << 20, 16 << 20, "alice", 4 << 20},
		{1 << 20, 1 << 20, "", 256 << 10},
		{1 << 20, 1 << 20, "alice", 256 << 10},
		{64 << 20, 64 << 20, "alice", pageResultBytes},
		{2, 2, "alice", 1},
	} {
		if got := newPool(tc.capacity, tc.share).pageBytes(tc.owner); got != tc.want {
			t.Errorf("pool %d, share %d, owner %q: %d, want %d", tc.capacity, tc.share, tc.owner, got, tc.want)
		}
	}
}
