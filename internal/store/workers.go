package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// Workers' heartbeats and the tasks they hold, for fast recovery of a dead
// worker's tasks (worker.Heartbeat, internal/api's Watchdog).

// Beat records worker's heartbeat at at (Unix ms) in one round trip: the
// score in the workers set, its presence, every running task (run token
// -> task) and the removal of the run tokens that ended. The held hash
// expires ttl after this write, the presence presenceTTL after it.
func (s *Store) Beat(ctx context.Context, workerID string, at int64, running map[string]worker.HeldTask, ended []string, ttl time.Duration,
	presence worker.Presence, presenceTTL time.Duration) error {
	held := s.k.workerHeld(workerID)
	pb, err := json.Marshal(presence)
	if err != nil {
		return fmt.Errorf("store: heartbeat of %s: %w", workerID, err)
	}
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, s.k.workers(), redis.Z{Score: float64(at), Member: workerID})
		p.Set(ctx, s.k.workerPresence(workerID), pb, presenceTTL)
		if len(ended) > 0 {
			p.HDel(ctx, held, ended...)
		}
		if len(running) > 0 {
			f := make([]any, 0, 2*len(running))
			for run, t := range running {
				b, _ := json.Marshal(t)
				f = append(f, run, b)
			}
			p.HSet(ctx, held, f...)
			p.PExpire(ctx, held, ttl)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: heartbeat of %s: %w", workerID, err)
	}
	return nil
}

// Hold records tasks worker has started (run token -> task) in one round
// trip: one HSET of them all and the held hash's PEXPIRE, without the
// beat (worker.Heartbeat's flusher writes them behind the tasks, many at
// once).
func (s *Store) Hold(ctx context.Context, workerID string, started map[string]worker.HeldTask, ttl time.Duration) error {
	if len(started) == 0 {
		return nil
	}
	held := s.k.workerHeld(workerID)
	f := make([]any, 0, 2*len(started))
	for run, t := range started {
		b, _ := json.Marshal(t)
		f = append(f, run, b)
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, held, f...)
		p.PExpire(ctx, held, ttl)
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: hold %d tasks on %s: %w", len(started), workerID, err)
	}
	return nil
}

// Leave removes worker's heartbeat, its presence, its held tasks and its
// solver slots (RegisterSlots).
func (s *Store) Leave(ctx context.Context, workerID string) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, s.k.workers(), workerID)
		p.Del(ctx, s.k.workerPresence(workerID))
		p.Del(ctx, s.k.workerHeld(workerID))
		p.HDel(ctx, s.k.gateSlots(), workerID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: leave %s: %w", workerID, err)
	}
	return nil
}

// Workers returns every worker's last heartbeat.
func (s *Store) Workers(ctx context.Context) ([]worker.WorkerBeat, error) {
	zs, err := s.rdb.ZRangeWithScores(ctx, s.k.workers(), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("store: workers: %w", err)
	}
	out := make([]worker.WorkerBeat, len(zs))
	for i, z := range zs {
		m, _ := z.Member.(string)
		out[i] = worker.WorkerBeat{Worker: m, At: int64(z.Score)}
	}
	return out, nil
}

// Presences returns the presence of every worker that has one (its last
// beat is recent: worker.Presence), sorted by ID, in two round trips:
// the workers set, then a GET of each one's presence, pipelined (one key
// each, so that it holds on a Redis Cluster too).
func (s *Store) Presences(ctx context.Context) ([]worker.Presence, error) {
	ids, err := s.rdb.ZRange(ctx, s.k.workers(), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("store: workers: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.StringCmd, len(ids))
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.Get(ctx, s.k.workerPresence(id))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("store: presence of %d workers: %w", len(ids), err)
	}
	out := make([]worker.Presence, 0, len(ids))
	for i, c := range cmds {
		var p worker.Presence
		b, err := c.Bytes()
		if err != nil || json.Unmarshal(b, &p) != nil {
			continue // gone since the ZRANGE, or not a presence
		}
		p.ID = ids[i]
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b worker.Presence) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Held returns the tasks worker holds, each once. A field that does not
// decode is skipped: it names nothing a watchdog could re-drive.
func (s *Store) Held(ctx context.Context, workerID string) ([]worker.HeldTask, error) {
	m, err := s.rdb.HGetAll(ctx, s.k.workerHeld(workerID)).Result()
	if err != nil {
		return nil, fmt.Errorf("store: tasks held by %s: %w", workerID, err)
	}
	seen := make(map[worker.HeldTask]bool, len(m))
	out := make([]worker.HeldTask, 0, len(m))
	for _, v := range m {
		var t worker.HeldTask
		if json.Unmarshal([]byte(v), &t) != nil || t.ID == "" || t.Queue == "" || seen[t] {
			continue
		}
		seen[t] = true
		out = append(out, t)
	}
	return out, nil
}

// reapScript removes a dead worker's heartbeat, presence, held tasks and
// solver slots, unless it beat again since the watchdog saw it: its slots
// leave S at once rather than when their entry expires.
//
// KEYS[1] workers sorted set
// KEYS[2] the worker's held hash
// KEYS[3] the workers' solver slots (keys.gateSlots)
// KEYS[4] the worker's presence (keys.workerPresence)
// ARGV[1] worker ID
// ARGV[2] the beat time the watchdog saw (Unix ms)
//
// Returns 1 when it removed the worker, 0 when the worker beat since (it
// was only slow or frozen, and is back) or is gone already.
var reapScript = redis.NewScript(`
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not at or tonumber(at) ~= tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2], KEYS[4])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
`)

// Reap removes workerID, seen last beating at at, once its tasks are
// re-driven. It reports false when the worker beat since: it is alive,
// and its next beat rewrote what it runs.
func (s *Store) Reap(ctx context.Context, workerID string, at int64) (bool, error) {
	n, err := reapScript.Run(ctx, s.rdb, []string{s.k.workers(), s.k.workerHeld(workerID), s.k.gateSlots(), s.k.workerPresence(workerID)}, workerID, strconv.FormatInt(at, 10)).Int()
	if err != nil {
		return false, fmt.Errorf("store: reap %s: %w", workerID, err)
	}
	return n == 1, nil
}

// HeldByAll returns every task that any of workers holds, each once, in
// one pipelined round trip (an HGETALL per worker).
func (s *Store) HeldByAll(ctx context.Context, workerIDs []string) ([]worker.HeldTask, error) {
	cmds := make([]*redis.MapStringStringCmd, len(workerIDs))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range workerIDs {
			cmds[i] = p.HGetAll(ctx, s.k.workerHeld(id))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: tasks held by %d workers: %w", len(workerIDs), err)
	}
	seen := map[worker.HeldTask]bool{}
	var out []worker.HeldTask
	for _, c := range cmds {
		for _, v := range c.Val() {
			var t worker.HeldTask
			if json.Unmarshal([]byte(v), &t) != nil || t.ID == "" || t.Queue == "" || seen[t] {
				continue
			}
			seen[t] = true
			out = append(out, t)
		}
	}
	return out, nil
}

// Active returns the tasks asynq lists as running on queues, with their
// leases (asynqdata.Active).
func (s *Store) Active(ctx context.Context, queues []string) ([]asynqdata.ActiveTask, error) {
	ts, err := asynqdata.Active(ctx, s.rdb, queues...)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return ts, nil
}

// MarkRedriven records that a copy of each of ts was queued at at, and
// forgets the marks older than keep, in one round trip.
func (s *Store) MarkRedriven(ctx context.Context, ts []worker.HeldTask, at time.Time, keep time.Duration) error {
	if len(ts) == 0 {
		return nil
	}
	zs := make([]redis.Z, 0, len(ts))
	for _, t := range ts {
		if m := parkedMember(t.Queue, t.ID); m != "" {
			zs = append(zs, redis.Z{Score: float64(at.UnixMilli()), Member: m})
		}
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, s.k.redriven(), zs...)
		p.ZRemRangeByScore(ctx, s.k.redriven(), "-inf", "("+strconv.FormatInt(at.Add(-keep).UnixMilli(), 10))
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: mark %d re-driven tasks: %w", len(ts), err)
	}
	return nil
}

// Redriven reports, for each of ts, whether MarkRedriven marked it at or
// after since.
func (s *Store) Redriven(ctx context.Context, ts []worker.HeldTask, since time.Time) ([]bool, error) {
	out := make([]bool, len(ts))
	if len(ts) == 0 {
		return out, nil
	}
	ms := make([]string, len(ts))
	for i, t := range ts {
		ms[i] = parkedMember(t.Queue, t.ID)
	}
	scores, err := s.rdb.ZMScore(ctx, s.k.redriven(), ms...).Result()
	if err != nil {
		return nil, fmt.Errorf("store: read the re-driven marks of %d tasks: %w", len(ts), err)
	}
	for i, sc := range scores {
		out[i] = sc != 0 && int64(sc) >= since.UnixMilli()
	}
	return out, nil
}
