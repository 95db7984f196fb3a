package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// failingSink fails its first calls, then keeps what it is given, and
// the names of the flushes it was sent.
type failingSink struct {
	mu    sync.Mutex
	fails int
	names []string
	got   []HistoryDelta
}

func (f *failingSink) AddHistory(_ context.Context, name string, ds []HistoryDelta) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.names = append(f.names, name)
	if f.fails > 0 {
		f.fails--
		return errors.New("redis is down")
	}
	f.got = append(f.got, ds...)
	return nil
}

// TestHistoryKeepsCountsUntilWritten counts tasks into a History whose
// sink fails twice: the failed flush is sent again under its own name
// (so the store can tell a repeat and add it once), nothing is lost,
// counts of one minute and owner add up, and latencies land in their
// buckets; what was counted meanwhile goes in the next flush.
func TestHistoryKeepsCountsUntilWritten(t *testing.T) {
	sink := &failingSink{fails: 2}
	r := NewHistory(sink, time.Hour, "w1", nil)
	at := time.Date(2026, 12, 7, 14, 0, 30, 0, time.UTC)
	r.now = func() time.Time { return at }
	r.Ended("alice", true, 3, 0)
	r.Ended("alice", false, 1, at.Add(-3*time.Millisecond).UnixMilli())
	r.Ended("bob", true, 0, 0) // nothing
	r.flush(context.Background())
	r.Ended("alice", true, 2, at.Add(-40*time.Millisecond).UnixMilli())
	r.flush(context.Background())
	if len(sink.got) != 0 {
		t.Fatalf("the sink kept %v while failing", sink.got)
	}
	r.flush(context.Background())
	if len(sink.got) != 1 || len(sink.names) != 3 || sink.names[0] != sink.names[1] || sink.names[1] != sink.names[2] {
		t.Fatalf("written %+v as %v; want one delta, sent three times under one name", sink.got, sink.names)
	}
	d := sink.got[0]
	if d.Owner != "alice" || d.Minute != at.Unix()/60 || d.Completed != 3 || d.Failed != 1 ||
		d.Latency[LatencyBucket(3*time.Millisecond)] != 1 {
		t.Errorf("written %+v", d)
	}
	r.flush(context.Background())
	if len(sink.got) != 2 || len(sink.names) != 4 || sink.names[3] == sink.names[0] {
		t.Fatalf("written %+v as %v; want the counts made meanwhile in a flush of a new name", sink.got, sink.names)
	}
	if d := sink.got[1]; d.Completed != 2 || d.Latency[LatencyBucket(40*time.Millisecond)] != 2 {
		t.Errorf("the second flush: %+v", d)
	}
	r.flush(context.Background())
	if len(sink.names) != 4 {
		t.Errorf("a flush with nothing counted was sent: %v", sink.names[4:])
	}
}

// TestHistoryDropsAFlushNeverTaken: a flush the sink refuses for longer
// than maxFlushAge is dropped, never sent after the store's mark of it
// could have expired.
func TestHistoryDropsAFlushNeverTaken(t *testing.T) {
	sink := &failingSink{fails: 1 << 30}
	r := NewHistory(sink, time.Hour, "w1", nil)
	at := time.Unix(1_800_000_000, 0)
	r.now = func() time.Time { return at }
	r.Ended("k", true, 1, 0)
	r.flush(context.Background())
	at = at.Add(maxFlushAge + time.Second)
	r.flush(context.Background())
	if r.pending != nil || len(sink.names) != 1 {
		t.Errorf("a flush older than %s is still held (%v), sent %d times", maxFlushAge, r.pending, len(sink.names))
	}
}

// TestHistoryBoundedWhileSinkFails: while the sink refuses a flush, new
// counts wait beside it, but no more than maxHistoryEntries minutes ×
// owners of them: past that a new owner's count is dropped, and the
// owners already held keep counting.
func TestHistoryBoundedWhileSinkFails(t *testing.T) {
	r := NewHistory(&failingSink{fails: 1 << 30}, time.Hour, "w1", nil)
	at := time.Unix(1_800_000_000, 0)
	r.now = func() time.Time { return at }
	r.Ended("first", true, 1, 0)
	r.flush(context.Background()) // refused: held as pending, never aged out
	for i := range maxHistoryEntries + 50 {
		r.Ended(fmt.Sprint("k", i), true, 1, 0)
	}
	r.Ended("k0", true, 1, 0)
	if n := len(r.acc); n != maxHistoryEntries {
		t.Errorf("holds %d entries; want the bound, %d", n, maxHistoryEntries)
	}
	if d := r.acc[historyKey{at.Unix() / 60, "k0"}]; d == nil || d.Completed != 2 {
		t.Errorf("an owner held before the bound: %+v; want it still counting (2)", d)
	}
	if r.pending == nil || len(r.pending.ds) != 1 {
		t.Errorf("the refused flush: %+v; want it held for the next flush", r.pending)
	}
}

// TestLatencyBucket puts durations at and around the bounds in their
// buckets.
func TestLatencyBucket(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{0, 0}, {time.Millisecond, 0}, {time.Millisecond + 1, 1}, {3 * time.Millisecond, 2},
		{time.Second, 9}, {time.Minute, len(LatencyBounds) - 1}, {time.Hour, len(LatencyBounds)},
	} {
		if got := LatencyBucket(c.d); got != c.want {
			t.Errorf("LatencyBucket(%s) = %d, want %d", c.d, got, c.want)
		}
	}
}
