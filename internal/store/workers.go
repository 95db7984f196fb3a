package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/tasks"
)

// Workers' heartbeats and the tasks they hold, for fast recovery of a dead
// worker's tasks (tasks.Heartbeat, internal/api's Watchdog).

// Beat records worker's heartbeat at at (Unix ms) in one round trip: the
// score in the workers set, every running task (run token -> task) and
// the removal of the run tokens that ended. The held hash expires ttl
// after this write.
func (s *Store) Beat(ctx context.Context, worker string, at int64, running map[string]tasks.HeldTask, ended []string, ttl time.Duration) error {
	held := s.k.workerHeld(worker)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, s.k.workers(), redis.Z{Score: float64(at), Member: worker})
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
		return fmt.Errorf("store: heartbeat of %s: %w", worker, err)
	}
	return nil
}

// Hold records tasks worker has started (run token -> task) in one round
// trip: one HSET of them all and the held hash's PEXPIRE, without the
// beat (tasks.Heartbeat's flusher writes them behind the tasks, many at
// once).
func (s *Store) Hold(ctx context.Context, worker string, started map[string]tasks.HeldTask, ttl time.Duration) error {
	if len(started) == 0 {
		return nil
	}
	held := s.k.workerHeld(worker)
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
		return fmt.Errorf("store: hold %d tasks on %s: %w", len(started), worker, err)
	}
	return nil
}

// Leave removes worker's heartbeat and its held tasks.
func (s *Store) Leave(ctx context.Context, worker string) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, s.k.workers(), worker)
		p.Del(ctx, s.k.workerHeld(worker))
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: leave %s: %w", worker, err)
	}
	return nil
}

// Workers returns every worker's last heartbeat.
func (s *Store) Workers(ctx context.Context) ([]tasks.WorkerBeat, error) {
	zs, err := s.rdb.ZRangeWithScores(ctx, s.k.workers(), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("store: workers: %w", err)
	}
	out := make([]tasks.WorkerBeat, len(zs))
	for i, z := range zs {
		m, _ := z.Member.(string)
		out[i] = tasks.WorkerBeat{Worker: m, At: int64(z.Score)}
	}
	return out, nil
}

// Held returns the tasks worker holds, each once. A field that does not
// decode is skipped: it names nothing a watchdog could re-drive.
func (s *Store) Held(ctx context.Context, worker string) ([]tasks.HeldTask, error) {
	m, err := s.rdb.HGetAll(ctx, s.k.workerHeld(worker)).Result()
	if err != nil {
		return nil, fmt.Errorf("store: tasks held by %s: %w", worker, err)
	}
	seen := make(map[tasks.HeldTask]bool, len(m))
	out := make([]tasks.HeldTask, 0, len(m))
	for _, v := range m {
		var t tasks.HeldTask
		if json.Unmarshal([]byte(v), &t) != nil || t.ID == "" || t.Queue == "" || seen[t] {
			continue
		}
		seen[t] = true
		out = append(out, t)
	}
	return out, nil
}

// reapScript removes a dead worker's heartbeat and held tasks, unless it
// beat again since the watchdog saw it.
//
// KEYS[1] workers sorted set
// KEYS[2] the worker's held hash
// ARGV[1] worker ID
// ARGV[2] the beat time the watchdog saw (Unix ms)
//
// Returns 1 when it removed the worker, 0 when the worker beat since (it
// was only slow or frozen, and is back) or is gone already.
var reapScript = redis.NewScript(`
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not at or tonumber(at) ~= tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
`)

// Reap removes worker, seen last beating at at, once its tasks are
// re-driven. It reports false when the worker beat since: it is alive,
// and its next beat rewrote what it runs.
func (s *Store) Reap(ctx context.Context, worker string, at int64) (bool, error) {
	n, err := reapScript.Run(ctx, s.rdb, []string{s.k.workers(), s.k.workerHeld(worker)}, worker, strconv.FormatInt(at, 10)).Int()
	if err != nil {
		return false, fmt.Errorf("store: reap %s: %w", worker, err)
	}
	return n == 1, nil
}
