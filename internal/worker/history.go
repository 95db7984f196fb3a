package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// HistoryDelta is what one worker ended in one minute for one owner.
type HistoryDelta struct {
	Minute    int64 // Unix minute: Unix seconds / 60
	Owner     string
	Completed int64
	Failed    int64
	// Latency counts single tasks per bucket of LatencyBounds (the last
	// index is longer than all); nil when none ended.
	Latency []int64
}

// LatencyBounds are the upper bounds of the latency buckets of single
// tasks, from acceptance by the API to the end of the task; a last bucket
// holds everything longer. The API's clock stamps the acceptance and the
// worker's the end, so their skew (milliseconds where hosts keep time)
// shifts the figures.
var LatencyBounds = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second,
	10 * time.Second, 30 * time.Second, time.Minute,
}

// LatencyBucket is the index of d's bucket in LatencyBounds
// (len(LatencyBounds) for longer).
func LatencyBucket(d time.Duration) int {
	for i, b := range LatencyBounds {
		if d <= b {
			return i
		}
	}
	return len(LatencyBounds)
}

// HistorySink keeps the history: store.Store.AddHistory.
type HistorySink interface {
	AddHistory(ctx context.Context, ds []HistoryDelta) error
}

// maxHistoryEntries bounds what a History holds while its sink fails:
// minutes × owners. Past it, a failed flush's counts are dropped, and
// the chart misses them rather than the worker growing without end.
const maxHistoryEntries = 10000

// History adds up what a worker ended, per minute and owner, and hands it
// to its sink every flush interval: the history costs one round trip per
// worker per interval, not one per task. What it holds when the process
// dies (at most one interval's counts) is lost to the chart, never to
// the tasks, whose records are written before they are counted here.
type History struct {
	sink  HistorySink
	every time.Duration
	log   *slog.Logger
	now   func() time.Time

	mu  sync.Mutex
	acc map[historyKey]*HistoryDelta
}

type historyKey struct {
	minute int64
	owner  string
}

// NewHistory returns a History that flushes to sink every interval.
func NewHistory(sink HistorySink, every time.Duration, log *slog.Logger) *History {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &History{sink: sink, every: every, log: log, now: time.Now, acc: map[historyKey]*HistoryDelta{}}
}

// Ended counts n tasks of owner that ended now, completed or failed; a
// single task with its acceptance time (acceptedAt, Unix ms, > 0) also
// counts its latency. A nil History counts nothing.
func (r *History) Ended(owner string, completed bool, n int, acceptedAt int64) {
	if r == nil || n <= 0 {
		return
	}
	now := r.now()
	k := historyKey{now.Unix() / 60, owner}
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.acc[k]
	if d == nil {
		d = &HistoryDelta{Minute: k.minute, Owner: owner}
		r.acc[k] = d
	}
	if completed {
		d.Completed += int64(n)
	} else {
		d.Failed += int64(n)
	}
	if acceptedAt > 0 {
		if d.Latency == nil {
			d.Latency = make([]int64, len(LatencyBounds)+1)
		}
		lat := now.Sub(time.UnixMilli(acceptedAt))
		d.Latency[LatencyBucket(max(lat, 0))] += int64(n)
	}
}

// Run flushes every interval until ctx ends, then once more.
func (r *History) Run(ctx context.Context) {
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			r.flush(ctx)
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 500*time.Millisecond)
			r.flush(fctx)
			cancel()
			return
		}
	}
}

// flush hands what was counted to the sink; on failure it keeps the
// counts for the next flush, up to maxHistoryEntries.
func (r *History) flush(ctx context.Context) {
	r.mu.Lock()
	acc := r.acc
	if len(acc) == 0 {
		r.mu.Unlock()
		return
	}
	r.acc = map[historyKey]*HistoryDelta{}
	r.mu.Unlock()
	ds := make([]HistoryDelta, 0, len(acc))
	for _, d := range acc {
		ds = append(ds, *d)
	}
	err := r.sink.AddHistory(ctx, ds)
	if err == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.acc)+len(acc) > maxHistoryEntries {
		r.log.Warn("history not written; its counts are dropped", "entries", len(acc), "err", err)
		return
	}
	r.log.Debug("history not written; kept for the next flush", "entries", len(acc), "err", err)
	for k, d := range acc {
		cur := r.acc[k]
		if cur == nil {
			r.acc[k] = d
			continue
		}
		cur.Completed += d.Completed
		cur.Failed += d.Failed
		if d.Latency != nil {
			if cur.Latency == nil {
				cur.Latency = make([]int64, len(LatencyBounds)+1)
			}
			for i, n := range d.Latency {
				cur.Latency[i] += n
			}
		}
	}
}

// acceptedAtKey carries a single task's acceptance time (Unix ms) in its
// handler's context, for the latency the history records.
type acceptedAtKey struct{}

func withAcceptedAt(ctx context.Context, at int64) context.Context {
	if at <= 0 {
		return ctx
	}
	return context.WithValue(ctx, acceptedAtKey{}, at)
}

func acceptedAt(ctx context.Context) int64 {
	at, _ := ctx.Value(acceptedAtKey{}).(int64)
	return at
}
