package cli

import (
	"strings"
	"testing"
	"time"
)

// TestRateFromTheFirstSecondAndAfterAResume: the rate is this run's own
// pace, measured from the first second, and a resumed run's earlier work
// (the baseline) does not count as done in an instant.
func TestRateFromTheFirstSecondAndAfterAResume(t *testing.T) {
	t0 := time.Now()
	p := &progress{total: 10000, wait: true, start: t0}
	if got := p.rateText(t0.Add(300 * time.Millisecond)); got != "measuring the rate" {
		t.Fatalf("at 0.3 s: %q", got)
	}
	p.completed.Store(100)
	if got := p.rateText(t0.Add(time.Second)); got != "100 tasks/s, ETA 1m39s" {
		t.Fatalf("100 tasks in the first second: %q", got)
	}

	// Resumed: 6,000 of 10,000 had ended before; 50 more in 2 s.
	r := &progress{total: 10000, wait: true, start: t0}
	r.addBaseline(6000)
	r.completed.Store(6000)
	r.rateText(t0.Add(500 * time.Millisecond))
	r.completed.Store(6050)
	got := r.rateText(t0.Add(2 * time.Second))
	if !strings.HasPrefix(got, "25.0 tasks/s") || !strings.Contains(got, "ETA 2m38s") {
		t.Fatalf("a resumed run: %q, want 25 tasks/s and 3,950 left at that pace", got)
	}
	// Past the window, the rate follows the recent pace.
	for i := 3; i <= 30; i++ {
		r.completed.Add(10)
		got = r.rateText(t0.Add(time.Duration(i) * time.Second))
	}
	if !strings.HasPrefix(got, "10.0 tasks/s") {
		t.Fatalf("after 30 s at 10 tasks/s: %q", got)
	}
	// Stalled: no ETA rather than 0 s.
	s := &progress{total: 10, wait: true, start: t0}
	if got := s.rateText(t0.Add(2 * time.Second)); got != "0 tasks/s, ETA unknown" {
		t.Fatalf("nothing done: %q", got)
	}
}
