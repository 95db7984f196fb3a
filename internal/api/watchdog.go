package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/tasks"
)

// WatchdogStore is what the Watchdog needs of the record store: the
// workers' heartbeats and the tasks they hold (tasks.Heartbeat writes
// them); *store.Store satisfies it.
type WatchdogStore interface {
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)
	// Workers returns every worker's last heartbeat.
	Workers(ctx context.Context) ([]tasks.WorkerBeat, error)
	// Held returns the tasks a worker holds.
	Held(ctx context.Context, worker string) ([]tasks.HeldTask, error)
	// Reap removes a worker last seen beating at at, unless it beat since.
	Reap(ctx context.Context, worker string, at int64) (bool, error)
}

// TaskInspector looks a task up in asynq; *asynq.Inspector satisfies it.
type TaskInspector interface {
	GetTaskInfo(queue, id string) (*asynq.TaskInfo, error)
}

// WatchdogOptions tune a Watchdog.
type WatchdogOptions struct {
	// DeadAfter is how long a worker's heartbeat must stay unchanged,
	// while this watchdog reads Redis without a gap, before its tasks are
	// re-driven (WORKER_DEAD_AFTER, whose default is stated there).
	// Required: NewWatchdog panics without it.
	DeadAfter time.Duration
	// Interval is how often the heartbeats are read. Default DeadAfter/6,
	// at most 500ms: a pass is one read, and the interval is the part of
	// a dead worker's recovery time that the watchdog adds to DeadAfter.
	Interval time.Duration
	// Registerer, when set, gets the watchdog's counters:
	// puzzleq_dead_workers_total and puzzleq_redriven_tasks_total.
	Registerer prometheus.Registerer
}

// watchdogLease names the lease that lets one API replica at a time
// re-drive dead workers' tasks.
const watchdogLease = "watchdog"

// Watchdog re-drives the tasks of dead workers within seconds, where
// asynq v0.26 takes 60-130 s (RELIABILITY.md, issue 13). Every API
// replica runs one; each pass reads the workers' heartbeats, and a worker
// whose heartbeat has not changed for DeadAfter is dead. Then, under a
// short Redis lease so that one replica does it, each task the worker
// held that asynq still lists as active (it is not finished, and asynq
// has not recovered it) gets a fresh copy on the queue under a new task
// ID (tasks.RedriveTask), and the worker's heartbeat is removed. The
// copy runs the same items as the original; the store ends and counts
// each item once, so whichever runs later, the copy or the original once
// asynq recovers it, finds the item ended and changes nothing.
//
// A worker is judged by what this watchdog saw change, never by comparing
// its clock with the worker's: a beat is "unchanged" from the pass that
// first saw its value. Any gap in the watchdog's own view (a failed read,
// or passes further apart than DeadAfter/2, as when this process was
// frozen or a Redis command stalled for everyone) starts every worker's
// count again, so an outage of Redis or of the watchdog is never taken
// for the death of every worker.
//
// It re-drives what the worker's record held, and the worker writes that
// record behind each task (tasks.Heartbeat): a task the worker was killed
// within about 5 ms of starting (holdDelay, plus the write's round trip)
// is not in it yet, and is left to asynq's own recovery after its lease;
// nothing acknowledged is lost.
type Watchdog struct {
	store  WatchdogStore
	insp   TaskInspector
	enq    Enqueuer
	log    *slog.Logger
	opts   WatchdogOptions
	holder string

	// seen is each worker's last beat value and when this watchdog first
	// saw it; lastPass is the last pass that read the heartbeats.
	seen     map[string]sighting
	lastPass time.Time
	now      func() time.Time

	deadWorkers, redriven prometheus.Counter
}

type sighting struct {
	at    int64
	since time.Time
}

// NewWatchdog returns a Watchdog; Run runs it.
func NewWatchdog(st WatchdogStore, insp TaskInspector, enq Enqueuer, log *slog.Logger, o WatchdogOptions) *Watchdog {
	if o.DeadAfter <= 0 {
		panic(fmt.Sprintf("api: WatchdogOptions.DeadAfter must be positive, got %s", o.DeadAfter))
	}
	if o.Interval <= 0 {
		o.Interval = min(o.DeadAfter/6, 500*time.Millisecond)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	w := &Watchdog{store: st, insp: insp, enq: enq, log: log.With("component", "watchdog"), opts: o,
		holder: hex.EncodeToString(b[:]), seen: map[string]sighting{}, now: time.Now,
		deadWorkers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "puzzleq_dead_workers_total", Help: "Workers whose heartbeat stopped and whose tasks this API replica re-drove.",
		}),
		redriven: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "puzzleq_redriven_tasks_total", Help: "Tasks of dead workers this API replica queued again under a new task ID.",
		}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(w.deadWorkers, w.redriven)
	}
	return w
}

// Run watches every Interval until ctx ends.
func (w *Watchdog) Run(ctx context.Context) {
	every(ctx, w.opts.Interval, w.log, "watchdog pass failed", w.RunOnce)
}

// RunOnce makes one pass and returns how many tasks it re-drove. An idle
// pass is one read of the heartbeats.
func (w *Watchdog) RunOnce(ctx context.Context) (int, error) {
	beats, err := w.store.Workers(ctx)
	now := w.now()
	if err != nil {
		w.lastPass = time.Time{}
		return 0, err
	}
	// A pass is late when Redis stalled (the read above took long) or this
	// process did: either way the beats it missed are no evidence.
	fresh := w.lastPass.IsZero() || now.Sub(w.lastPass) > w.opts.DeadAfter/2
	w.lastPass = now
	present := make(map[string]bool, len(beats))
	var dead []tasks.WorkerBeat
	for _, b := range beats {
		present[b.Worker] = true
		s, ok := w.seen[b.Worker]
		if !ok || fresh || s.at != b.At {
			w.seen[b.Worker] = sighting{at: b.At, since: now}
			continue
		}
		if now.Sub(s.since) >= w.opts.DeadAfter {
			dead = append(dead, b)
		}
	}
	for id := range w.seen {
		if !present[id] {
			delete(w.seen, id)
		}
	}
	if len(dead) == 0 {
		return 0, nil
	}
	// The lease outlives a few passes, so a holder that died is replaced
	// within 3 intervals, and a live one keeps it by renewing.
	ok, err := w.store.AcquireLease(ctx, watchdogLease, w.holder, 3*w.opts.Interval)
	if err != nil || !ok {
		return 0, err
	}
	total := 0
	var errs []error
	for _, b := range dead {
		n, err := w.redrive(ctx, b, now.Sub(w.seen[b.Worker].since))
		total += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return total, errors.Join(errs...)
}

// redrive enqueues a copy of every task dead worker b held that asynq
// still lists as active, then removes the worker. A copy that is queued
// already (the same RedriveID) counts as done. When an enqueue fails the
// worker stays, and the next pass tries again.
func (w *Watchdog) redrive(ctx context.Context, b tasks.WorkerBeat, silent time.Duration) (int, error) {
	held, err := w.store.Held(ctx, b.Worker)
	if err != nil {
		return 0, err
	}
	var (
		n    int
		errs []error
		ids  []string
	)
	for _, ht := range held {
		ti, err := w.insp.GetTaskInfo(ht.Queue, ht.ID)
		switch {
		case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
			continue // finished: asynq keeps no completed tasks
		case err != nil:
			errs = append(errs, fmt.Errorf("look up task %s of dead worker %s: %w", ht.ID, b.Worker, err))
			continue
		case ti.State != asynq.TaskStateActive:
			continue // asynq has it queued again (recovered, or retried) already
		}
		_, err = w.enq.EnqueueContext(ctx, tasks.RedriveTask(ti, b.Worker))
		if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
			errs = append(errs, fmt.Errorf("re-drive task %s of dead worker %s: %w", ht.ID, b.Worker, err))
			continue
		}
		n++
		ids = append(ids, ht.ID)
	}
	if len(errs) > 0 {
		return n, errors.Join(errs...)
	}
	reaped, err := w.store.Reap(ctx, b.Worker, b.At)
	if err != nil {
		return n, err
	}
	if reaped {
		w.deadWorkers.Inc()
	}
	w.redriven.Add(float64(n))
	w.log.Info("re-drove the tasks of a dead worker", "worker_id", b.Worker, "silent_ms", silent.Milliseconds(),
		"held", len(held), "redriven", n, "task_ids", ids, "reaped", reaped)
	delete(w.seen, b.Worker)
	return n, nil
}
