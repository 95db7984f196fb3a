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

// ErrNotReplicated is returned by a write that fewer replicas than
// Options.AckReplicas confirmed within Options.AckTimeout. The write
// took on the master; only its survival of the master's loss is not
// promised, so the API answers 503 (a retry with the same idempotency key
// is safe) and a worker does not ack the task, which asynq redelivers.
var ErrNotReplicated = worker.ErrNotReplicated

// acksOn reports whether writes are confirmed by replicas.
func (s *Store) acksOn() bool { return s.ackReplicas > 0 }

// queueConfirm appends the confirmation to p, after the writes it
// carries: an INCR of the barrier key, then WAIT. WAIT waits for the
// replication offset of its connection's last write; the INCR makes that
// offset at least the master's at this point, so the WAIT covers this
// pipeline's writes and every earlier write a script of it only observed
// (a task another delivery ended, a batch the first of two requests with
// one idempotency key committed). It returns nil when acks are off.
func (s *Store) queueConfirm(ctx context.Context, p redis.Pipeliner) *redis.IntCmd {
	if !s.acksOn() {
		return nil
	}
	p.Incr(ctx, s.k.ackBarrier())
	// WAIT's timeout 0 would block for ever: at least a millisecond.
	w := redis.NewIntCmd(ctx, "wait", s.ackReplicas, max(1, s.ackTimeout.Milliseconds()))
	_ = p.Process(ctx, w)
	return w
}

// confirmed checks a WAIT queued by queueConfirm.
func (s *Store) confirmed(w *redis.IntCmd) error {
	if w == nil {
		return nil
	}
	n, err := w.Result()
	if err != nil {
		return fmt.Errorf("store: wait for replicas: %w", err)
	}
	if n < int64(s.ackReplicas) {
		return fmt.Errorf("store: %d of %d replicas confirmed within %s: %w", n, s.ackReplicas, s.ackTimeout, ErrNotReplicated)
	}
	return nil
}

// Confirm returns once AckReplicas replicas hold every write the master
// took so far, or ErrNotReplicated after AckTimeout: one round trip of
// two commands (queueConfirm). It is nil at once when acks are off. A
// caller confirms after its last write and before it answers a 2xx or
// acks a task.
func (s *Store) Confirm(ctx context.Context) error {
	if !s.acksOn() {
		return nil
	}
	var w *redis.IntCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		w = s.queueConfirm(ctx, p)
		return nil
	}); err != nil {
		return fmt.Errorf("store: confirm: %w", err)
	}
	return s.confirmed(w)
}

// runConfirmed runs sc like Script.Run, followed in the same pipeline by
// the confirmation when acks are on: one round trip covers the write and
// its replication. On NOSCRIPT it loads sc and runs the pipeline again
// (pipelineScripts). An unconfirmed write returns ErrNotReplicated
// whatever the script answered.
func (s *Store) runConfirmed(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	c, err := s.runThenConfirm(ctx, sc, keys, args...)
	if err != nil && c.Err() == nil {
		c.SetErr(err)
	}
	return c
}

// runThenConfirm is runConfirmed with the confirmation's error apart from
// the script's reply, for a caller that acts on what the script did
// (Finish counts the tasks it ended) whether or not it was confirmed.
func (s *Store) runThenConfirm(ctx context.Context, sc *redis.Script, keys []string, args ...any) (*redis.Cmd, error) {
	if !s.acksOn() {
		return sc.Run(ctx, s.rdb, keys, args...), nil
	}
	var (
		c *redis.Cmd
		w *redis.IntCmd
	)
	err := s.pipelineScripts(ctx, func(p redis.Pipeliner) {
		c = sc.EvalSha(ctx, p, keys, args...)
		w = s.queueConfirm(ctx, p)
	}, sc)
	if err == nil && c.Err() == nil {
		err = s.confirmed(w)
	}
	return c, err
}

// ConnectedReplicas counts the master's replicas that are online and
// acknowledged its stream within the last ackLagLimit seconds, from INFO
// replication: what /readyz compares with AckReplicas. A replica that is
// frozen keeps its connection for repl-timeout (60 s by default), so the
// count leaves it out by its lag, not by connected_slaves.
func (s *Store) ConnectedReplicas(ctx context.Context) (int, error) {
	info, err := s.rdb.Info(ctx, "replication").Result()
	if err != nil {
		return 0, fmt.Errorf("store: info replication: %w", err)
	}
	return countReplicas(info, s.ackLagLimit()), nil
}

// AckTimeout is Options.AckTimeout.
func (s *Store) AckTimeout() time.Duration { return s.ackTimeout }

// AckReplicas is the number of replicas a write needs to be confirmed by
// (0: acks are off).
func (s *Store) AckReplicas() int { return s.ackReplicas }

// ackLagLimit is the largest lag, in whole seconds, of a replica that
// counts as able to confirm: the ack timeout rounded up, plus one.
// Replicas acknowledge every second, so a healthy one caught between two
// acknowledgements shows a lag of 1, and one on a busy machine whose
// acknowledgement is late by a fraction of a second shows 2; a lag past
// the limit is a replica that could not confirm a write in time.
func (s *Store) ackLagLimit() int {
	return int((s.ackTimeout+time.Second-1)/time.Second) + 1
}

// countReplicas parses INFO replication's slaveN lines
// ("ip=...,port=...,state=online,offset=...,lag=0").
func countReplicas(info string, maxLag int) int {
	n := 0
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "slave") {
			continue
		}
		_, v, ok := strings.Cut(line, ":")
		if !ok || !strings.Contains(v, "state=online") {
			continue
		}
		lag := -1
		for _, f := range strings.Split(v, ",") {
			if s, ok := strings.CutPrefix(f, "lag="); ok {
				lag, _ = strconv.Atoi(s)
			}
		}
		if lag >= 0 && lag <= maxLag {
			n++
		}
	}
	return n
}
