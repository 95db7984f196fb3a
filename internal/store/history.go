package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/worker"
)

// The history is what ended in each minute (completed and failed tasks,
// batch items included), the latency of the single tasks that ended in
// it, and how many tasks had not ended, per API key and for all keys
// together. It lives in one hash per minute (keys.historyMinute) kept for
// HistoryTTL, so the dashboard and GET /v1/history chart the last day
// without Prometheus, at a cost of one script call per minute written
// per worker every few seconds (the workers add up their counts first)
// and one pipelined round trip per API replica per sample of the pending
// counts.
//
// A minute's fields:
//
//	completed, failed            every key's tasks that ended
//	completed:<owner>, failed:<owner>
//	lat:<i>, lat:<i>:<owner>     single tasks that ended with a latency in bucket i of LatencyBounds
//	pending                      tasks not ended, at the minute's last sample
//	pending:<owner>              the owner's, when not 0 at that sample
//
// The owner comes last in a field, so an owner name with ':' in it cannot
// be read as another field, and a read asks for the fields it needs by
// name (HMGET), whatever else the hash holds.

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

// addHistoryScript adds one flush's counts to one minute's hash, once:
// a flush that is sent again (a retry after a timeout, by go-redis or by
// the worker) finds its mark and adds nothing, so no count is doubled.
//
// KEYS[1] the minute's hash (keys.historyMinute)
// KEYS[2] the flush's mark in that minute (keys.historyFlush)
// ARGV[1] the hash's TTL, seconds
// ARGV[2] the mark's TTL, seconds
// ARGV[3..] field, increment pairs
//
// Returns 1 when added, 0 when the flush had been added before.
var addHistoryScript = redis.NewScript(`
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[2]) then return 0 end
for i = 3, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
`)

// historyFlushTTL is how long a flush's mark stays: longer than any
// retry of that flush.
const historyFlushTTL = 10 * time.Minute

// AddHistory adds the deltas of one flush, named flush (unique to the
// writer and the flush, the same when the flush is sent again), to their
// minutes' hashes: one script call per minute.
func (s *Store) AddHistory(ctx context.Context, flush string, ds []HistoryDelta) error {
	byMinute := map[int64][]any{}
	var minutes []int64
	for _, d := range ds {
		args, ok := byMinute[d.Minute]
		if !ok {
			minutes = append(minutes, d.Minute)
			args = []any{int64(HistoryTTL / time.Second), int64(historyFlushTTL / time.Second)}
		}
		add := func(field string, n int64) {
			if n != 0 {
				args = append(args, field, n, field+":"+d.Owner, n)
			}
		}
		add("completed", d.Completed)
		add("failed", d.Failed)
		for i, n := range d.Latency {
			add("lat:"+strconv.Itoa(i), n)
		}
		byMinute[d.Minute] = args
	}
	for _, m := range minutes {
		args := byMinute[m]
		if len(args) == 2 {
			continue
		}
		keys := []string{s.k.historyMinute(m), s.k.historyFlush(m, flush)}
		if err := addHistoryScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
			return fmt.Errorf("store: add history: %w", err)
		}
	}
	return nil
}

// SampleHistoryPending records, in the history of the minute at now, how
// many tasks have not ended (the owners' quota counters): their sum, and
// each owner's that is not 0, so that a thousand idle keys add no fields.
// An owner's count includes units whose records expired since it was last
// pruned; a chart does not need more.
func (s *Store) SampleHistoryPending(ctx context.Context, now time.Time, owners []string) error {
	pipe := s.rdb.Pipeline()
	gets := make([]*redis.StringCmd, len(owners))
	for i, o := range owners {
		gets[i] = pipe.Get(ctx, s.k.ownerPending(o))
	}
	_, _ = pipe.Exec(ctx) // each GET's own error is read below
	k := s.k.historyMinute(now.Unix() / 60)
	set, zero := []any{}, []string{}
	var sum int64
	for i, g := range gets {
		n, err := g.Int64()
		if err != nil && !errors.Is(err, redis.Nil) { // a missing counter is 0
			return fmt.Errorf("store: sample pending: %w", err)
		}
		if n <= 0 {
			zero = append(zero, "pending:"+owners[i])
			continue
		}
		sum += n
		set = append(set, "pending:"+owners[i], n)
	}
	set = append(set, "pending", sum)
	pipe = s.rdb.Pipeline()
	pipe.HSet(ctx, k, set...)
	if len(zero) > 0 {
		pipe.HDel(ctx, k, zero...)
	}
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

// historyFields are the fields a read of one owner (suffix ":<owner>")
// or of all (suffix "") asks for, in the order History decodes them: the
// global pending comes first, since it says whether a sample was taken.
func historyFields(suffix string) []string {
	f := []string{"pending", "pending" + suffix, "completed" + suffix, "failed" + suffix}
	for i := range len(LatencyBounds) + 1 {
		f = append(f, "lat:"+strconv.Itoa(i)+suffix)
	}
	return f
}

// History reads the minutes from first to last (Unix minutes, both
// included, at most HistoryMaxMinutes) for owner, or for every owner
// when all is set, in one pipelined round trip of HMGETs.
func (s *Store) History(ctx context.Context, owner string, all bool, first, last int64) ([]HistoryMinute, error) {
	if last < first || last-first >= HistoryMaxMinutes {
		return nil, fmt.Errorf("store: history of %d minutes: at most %d", last-first+1, HistoryMaxMinutes)
	}
	suffix := ":" + owner
	if all {
		suffix = ""
	}
	fields := historyFields(suffix)
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, 0, last-first+1)
	for m := first; m <= last; m++ {
		cmds = append(cmds, pipe.HMGet(ctx, s.k.historyMinute(m), fields...))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("store: read history: %w", err)
	}
	num := func(v any) int64 {
		str, _ := v.(string)
		n, _ := strconv.ParseInt(str, 10, 64)
		return n
	}
	out := make([]HistoryMinute, len(cmds))
	for i, c := range cmds {
		v := c.Val()
		h := HistoryMinute{Minute: first + int64(i), Latency: make([]int64, len(LatencyBounds)+1), Pending: -1}
		if len(v) == len(fields) {
			if v[0] != nil {
				// A sample was taken; an owner without its field had
				// nothing pending. (For all, v[1] is the sum again.)
				h.Pending = num(v[1])
			}
			h.Completed, h.Failed = num(v[2]), num(v[3])
			for b := range h.Latency {
				h.Latency[b] = num(v[4+b])
			}
		}
		out[i] = h
	}
	return out, nil
}
