package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/worker"
)

// The history is what ended in each minute (completed and failed tasks,
// batch items included), the latency of the single tasks that ended in
// it, and how many tasks had not ended, per API key and for all keys
// together. It lives in one hash per minute (keys.historyMinute) kept for
// HistoryTTL, so the dashboard and GET /v1/history chart the last day
// without Prometheus, at a cost of one pipelined round trip per worker
// every few seconds (the workers add up their counts first) and one per
// API replica per sample of the pending counts.
//
// A minute's fields:
//
//	completed, failed            every key's tasks that ended
//	completed:<owner>, failed:<owner>
//	lat:<i>, lat:<i>:<owner>     single tasks that ended with a latency in bucket i of LatencyBounds
//	pending, pending:<owner>     tasks not ended, at the minute's last sample
//
// The owner comes last in a field, so an owner name with ':' in it cannot
// be read as another field.

// HistoryTTL is how long a minute of history is kept: a day, and the
// minute that is being written.
const HistoryTTL = 24*time.Hour + 2*time.Minute

// HistoryMaxMinutes is the longest history one read returns.
const HistoryMaxMinutes = 24 * 60

// HistoryDelta is what one worker ended in one minute for one owner.
type HistoryDelta = worker.HistoryDelta

// LatencyBounds are the latency buckets of single tasks (the workers'
// worker.LatencyBounds).
var LatencyBounds = worker.LatencyBounds

// AddHistory adds the deltas to their minutes' hashes, in one pipelined
// round trip.
func (s *Store) AddHistory(ctx context.Context, ds []HistoryDelta) error {
	if len(ds) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	expire := map[int64]bool{}
	for _, d := range ds {
		k := s.k.historyMinute(d.Minute)
		add := func(field string, n int64) {
			if n != 0 {
				pipe.HIncrBy(ctx, k, field, n)
				pipe.HIncrBy(ctx, k, field+":"+d.Owner, n)
			}
		}
		add("completed", d.Completed)
		add("failed", d.Failed)
		for i, n := range d.Latency {
			add("lat:"+strconv.Itoa(i), n)
		}
		if !expire[d.Minute] {
			expire[d.Minute] = true
			pipe.Expire(ctx, k, HistoryTTL)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("store: add history: %w", err)
	}
	return nil
}

// SampleHistoryPending records, in the history of the minute at now, how
// many tasks of each owner have not ended (their quota counters) and
// their sum. An owner's count includes units whose records expired since
// it was last pruned; a chart does not need more.
func (s *Store) SampleHistoryPending(ctx context.Context, now time.Time, owners []string) error {
	pipe := s.rdb.Pipeline()
	gets := make([]*redis.StringCmd, len(owners))
	for i, o := range owners {
		gets[i] = pipe.Get(ctx, s.k.ownerPending(o))
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return fmt.Errorf("store: sample pending: %w", err)
	}
	k := s.k.historyMinute(now.Unix() / 60)
	fields := []any{}
	var sum int64
	for i, g := range gets {
		n, _ := g.Int64() // a missing counter is 0
		n = max(n, 0)
		sum += n
		fields = append(fields, "pending:"+owners[i], n)
	}
	fields = append(fields, "pending", sum)
	pipe = s.rdb.Pipeline()
	pipe.HSet(ctx, k, fields...)
	pipe.Expire(ctx, k, HistoryTTL)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("store: sample pending: %w", err)
	}
	return nil
}

// HistoryMinute is one minute of history, for one owner or for all.
type HistoryMinute struct {
	Minute    int64
	Completed int64
	Failed    int64
	// Latency counts single tasks per bucket of LatencyBounds.
	Latency []int64
	// Pending is the last sample of tasks not ended; -1 when none was
	// taken in the minute.
	Pending int64
}

// History reads the minutes from first to last (Unix minutes, both
// included, at most HistoryMaxMinutes) for owner, or for every owner
// when all is set, in one pipelined round trip.
func (s *Store) History(ctx context.Context, owner string, all bool, first, last int64) ([]HistoryMinute, error) {
	if last < first || last-first >= HistoryMaxMinutes {
		return nil, fmt.Errorf("store: history of %d minutes: at most %d", last-first+1, HistoryMaxMinutes)
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, 0, last-first+1)
	for m := first; m <= last; m++ {
		cmds = append(cmds, pipe.HGetAll(ctx, s.k.historyMinute(m)))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("store: read history: %w", err)
	}
	suffix := ":" + owner
	out := make([]HistoryMinute, len(cmds))
	for i, c := range cmds {
		h := HistoryMinute{Minute: first + int64(i), Latency: make([]int64, len(LatencyBounds)+1), Pending: -1}
		for f, v := range c.Val() {
			if !all {
				var ok bool
				if f, ok = strings.CutSuffix(f, suffix); !ok || strings.Count(f, ":") > 1 {
					continue
				}
			} else if strings.Count(f, ":") > 1 || (strings.Contains(f, ":") && !strings.HasPrefix(f, "lat:")) {
				continue // an owner's field
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue
			}
			switch {
			case f == "completed":
				h.Completed = n
			case f == "failed":
				h.Failed = n
			case f == "pending":
				h.Pending = n
			case strings.HasPrefix(f, "lat:"):
				if b, err := strconv.Atoi(f[len("lat:"):]); err == nil && b >= 0 && b < len(h.Latency) {
					h.Latency[b] = n
				}
			}
		}
		out[i] = h
	}
	return out, nil
}
