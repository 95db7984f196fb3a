package worker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// failingSink fails its first calls, then keeps what it is given.
type failingSink struct {
	mu    sync.Mutex
	fails int
	got   []HistoryDelta
}

func (f *failingSink) AddHistory(_ context.Context, ds []HistoryDelta) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fails > 0 {
		f.fails--
		return errors.New("redis is down")
	}
	f.got = append(f.got, ds...)
	return nil
}

// TestHistoryKeepsCountsUntilWritten counts tasks into a History whose
// sink fails twice: nothing is lost, counts of one minute and owner add
// up, and latencies land in their buckets.
func TestHistoryKeepsCountsUntilWritten(t *testing.T) {
	sink := &failingSink{fails: 2}
	r := NewHistory(sink, time.Hour, nil)
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
	if len(sink.got) != 1 {
		t.Fatalf("written %+v; want one delta: alice's minute", sink.got)
	}
	d := sink.got[0]
	if d.Owner != "alice" || d.Minute != at.Unix()/60 || d.Completed != 5 || d.Failed != 1 ||
		d.Latency[LatencyBucket(3*time.Millisecond)] != 1 || d.Latency[LatencyBucket(40*time.Millisecond)] != 2 {
		t.Errorf("written %+v", d)
	}
	r.flush(context.Background())
	if len(sink.got) != 1 {
		t.Errorf("a flush with nothing counted wrote %+v", sink.got[1:])
	}
}

// TestHistoryBoundedWhileSinkFails: a sink that never recovers does not
// make a History grow past maxHistoryEntries.
func TestHistoryBoundedWhileSinkFails(t *testing.T) {
	r := NewHistory(&failingSink{fails: 1 << 30}, time.Hour, nil)
	for i := range maxHistoryEntries + 50 {
		r.now = func() time.Time { return time.Unix(int64(i)*60, 0) }
		r.Ended("k", true, 1, 0)
		if i%100 == 0 {
			r.flush(context.Background())
		}
	}
	r.flush(context.Background())
	if n := len(r.acc); n > maxHistoryEntries {
		t.Errorf("holds %d entries; want at most %d", n, maxHistoryEntries)
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
