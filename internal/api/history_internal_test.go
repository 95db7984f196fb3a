package api

import (
	"testing"
	"time"
)

// TestHistoryLimiter spends and refills a reader's budget of minutes on
// a clock the test moves: a full budget at first, nothing spent by a
// refused read, a refill at the budget per historyRefill, and readers
// apart.
func TestHistoryLimiter(t *testing.T) {
	at := time.Unix(1_800_000_000, 0)
	const budget = 2880
	l := historyLimiter{now: func() time.Time { return at }, budget: budget}
	if ok, _ := l.take("a", budget); !ok {
		t.Fatal("a full budget was refused")
	}
	ok, wait := l.take("a", 60)
	if ok || wait <= 0 || wait > historyRefill {
		t.Fatalf("an empty budget: %v, wait %s", ok, wait)
	}
	if ok, _ := l.take("b", 1440); !ok {
		t.Fatal("another reader shares a's budget")
	}
	at = at.Add(wait)
	if ok, _ := l.take("a", 60); !ok {
		t.Fatalf("after the wait it named (%s), 60 minutes were refused", wait)
	}
	at = at.Add(time.Hour)
	if ok, _ := l.take("a", budget); !ok || l.by["a"].tokens != 0 {
		t.Fatalf("a refill past the budget: %v, %v tokens left", ok, l.by["a"].tokens)
	}
}

// TestLatencyPercentile reads quantiles off bucket counts: the bound of
// the bucket the rank falls in, and the last bound for the bucket past
// it.
func TestLatencyPercentile(t *testing.T) {
	counts := make([]int64, 16) // LatencyBounds has 15
	counts[0], counts[3], counts[15] = 50, 49, 1
	for _, c := range []struct {
		q    float64
		want float64
	}{{0.5, 1}, {0.51, 10}, {0.99, 10}, {0.999, 60000}, {1, 60000}} {
		if got := *latencyPercentile(counts, 100, c.q); got != c.want {
			t.Errorf("q %v: %v ms, want %v", c.q, got, c.want)
		}
	}
}
