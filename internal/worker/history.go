package worker

import (
	"context"
	"log/slog"
	"strconv"
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

// HistorySink keeps the history: store.Store.AddHistory, which adds a
// flush named flush once however often it is sent.
type HistorySink interface {
	AddHistory(ctx context.Context, flush string, ds []HistoryDelta) error
}

// maxHistoryEntries bounds what a History holds while its sink fails:
// minutes × owners. Past it, new counts are dropped, and the chart misses
// them rather than the worker growing without end.
const maxHistoryEntries = 10000

// maxFlushAge is how long a flush that the sink refused is sent again
// before it is dropped: well within the store's mark of a flush (10
// minutes), so that a flush that did land but whose answer was lost is
// never added twice.
const maxFlushAge = 2 * time.Minute

// History adds up what a process ended, per minute and owner, and hands
// it to its sink every flush interval: the history costs a script call
// per minute written per interval, not a write per task. Each flush has a
// name of its own and is sent again under that name until the sink takes
// it (for at most maxFlushAge), so a timeout never counts a task twice.
// What it holds when the process dies (at most an interval's counts) is
// lost to the chart, never to the tasks, whose records are written before
// they are counted here.
type History struct {
	sink  HistorySink
	every time.Duration
	log   *slog.Logger
	now   func() time.Time
	id    string // names this History's flushes

	mu      sync.Mutex
	acc     map[historyKey]*HistoryDelta
	seq     int
	pending *historyFlush // a flush the sink has not taken yet
}

type historyKey struct {
	minute int64
	owner  string
}

// historyFlush is one flush: its name, what it adds and when it was made.
type historyFlush struct {
	name string
	ds   []HistoryDelta
	at   time.Time
}

// NewHistory returns a History that flushes to sink every interval, its
// flushes named after id, which no other process uses (NewWorkerID).
func NewHistory(sink HistorySink, every time.Duration, id string, log *slog.Logger) *History {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &History{sink: sink, every: every, log: log, now: time.Now, id: id, acc: map[historyKey]*HistoryDelta{}}
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
		if len(r.acc) >= maxHistoryEntries {
			return
		}
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
			// A flush not yet taken, then what was counted since.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 500*time.Millisecond)
			r.flush(fctx)
			r.flush(fctx)
			cancel()
			return
		}
	}
}

// flush sends the flush the sink has not taken yet, or else what was
// counted since the last one, under a new name.
func (r *History) flush(ctx context.Context) {
	r.mu.Lock()
	if r.pending != nil && r.now().Sub(r.pending.at) > maxFlushAge {
		r.log.Warn("history not written; its counts are dropped", "entries", len(r.pending.ds))
		r.pending = nil
	}
	if r.pending == nil && len(r.acc) > 0 {
		r.seq++
		f := &historyFlush{name: r.id + ":" + strconv.Itoa(r.seq), at: r.now()}
		for _, d := range r.acc {
			f.ds = append(f.ds, *d)
		}
		r.acc = map[historyKey]*HistoryDelta{}
		r.pending = f
	}
	f := r.pending
	r.mu.Unlock()
	if f == nil {
		return
	}
	err := r.sink.AddHistory(ctx, f.name, f.ds)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.log.Debug("history not written; sent again at the next flush", "entries", len(f.ds), "err", err)
		return
	}
	if r.pending == f {
		r.pending = nil
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
