package store_test

import (
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/store"
)

// TestHistory adds what two workers ended to a real Redis, samples the
// owners' pending counts, and reads it back per owner and for all: counts
// add up across deltas of one minute, owners never see each other's (an
// owner name with ':' in it included), every minute of the span is
// there, and each written minute expires.
func TestHistory(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	now := time.Now()
	m := now.Unix() / 60
	lat := func(i int, n int64) []int64 {
		l := make([]int64, len(store.LatencyBounds)+1)
		l[i] = n
		return l
	}
	deltas := []store.HistoryDelta{
		{Minute: m, Owner: "alice", Completed: 5, Failed: 1, Latency: lat(2, 4)},
		{Minute: m, Owner: "alice", Completed: 2},
		{Minute: m, Owner: "bob:x", Completed: 7, Latency: lat(len(store.LatencyBounds), 1)},
		{Minute: m - 2, Owner: "alice", Failed: 3},
	}
	if err := s.AddHistory(ctx, "w1:1", deltas); err != nil {
		t.Fatal(err)
	}
	// The same flush sent again (a retry after a lost answer) adds
	// nothing; another flush of the same minute adds.
	if err := s.AddHistory(ctx, "w1:1", deltas); err != nil {
		t.Fatal(err)
	}
	if err := s.AddHistory(ctx, "w2:1", []store.HistoryDelta{{Minute: m, Owner: "alice", Failed: 1}}); err != nil {
		t.Fatal(err)
	}
	// alice has one task not ended; bob:x none.
	if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: "a1", Kind: "fill", Owner: "alice"}, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.SampleHistoryPending(ctx, now, []string{"alice", "bob:x"}); err != nil {
		t.Fatal(err)
	}

	read := func(owner string, all bool) []store.HistoryMinute {
		t.Helper()
		h, err := s.History(ctx, owner, all, m-3, m)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) != 4 || h[0].Minute != m-3 || h[3].Minute != m {
			t.Fatalf("history of %q: %d minutes, from %d: want the 4 of the span", owner, len(h), h[0].Minute)
		}
		return h
	}
	a := read("alice", false)
	if a[3].Completed != 7 || a[3].Failed != 2 || a[3].Latency[2] != 4 || a[3].Pending != 1 || a[1].Failed != 3 {
		t.Errorf("alice's history: %+v", a)
	}
	if a[0].Completed+a[0].Failed != 0 || a[0].Pending != -1 {
		t.Errorf("alice's empty minute: %+v; want zeros and no sample", a[0])
	}
	b := read("bob:x", false)
	if b[3].Completed != 7 || b[3].Failed != 0 || b[3].Latency[len(store.LatencyBounds)] != 1 || b[3].Pending != 0 || b[1].Failed != 0 {
		t.Errorf("bob:x's history: %+v", b)
	}
	if x := read("x", false); x[3].Completed != 0 || x[3].Latency[len(store.LatencyBounds)] != 0 {
		t.Errorf(`owner "x" reads bob:x's fields: %+v`, x[3])
	}
	all := read("", true)
	if all[3].Completed != 14 || all[3].Failed != 2 || all[3].Latency[2] != 4 || all[3].Latency[len(store.LatencyBounds)] != 1 ||
		all[3].Pending != 1 || all[1].Failed != 3 {
		t.Errorf("everyone's history: %+v", all)
	}
	if _, err := s.History(ctx, "alice", false, m-store.HistoryMaxMinutes, m); err == nil {
		t.Error("a read of more than HistoryMaxMinutes was not refused")
	}
	keys := s.KeysForTest(ctx, "history:{*}")
	if len(keys) != 2 {
		t.Errorf("history keys %v; want the two minutes written", keys)
	}
	for _, k := range keys {
		if ttl := s.TTLForTest(ctx, k); ttl <= 0 || ttl > store.HistoryTTL {
			t.Errorf("%s: TTL %s; want it to expire within %s", k, ttl, store.HistoryTTL)
		}
	}
}
