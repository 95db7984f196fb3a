package recovery

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

	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// WatchdogStore is what the Watchdog needs of the record store: the
// workers' heartbeats and the tasks they hold (worker.Heartbeat writes
// them); *store.Store satisfies it.
type WatchdogStore interface {
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)
	// Workers returns every worker's last heartbeat.
	Workers(ctx context.Context) ([]worker.WorkerBeat, error)
	// Held returns the tasks a worker holds.
	Held(ctx context.Context, worker string) ([]worker.HeldTask, error)
	// Reap removes a worker last seen beating at at, unless it beat since.
	Reap(ctx context.Context, worker string, at int64) (bool, error)
	// HeldByAll returns every task any of workers holds, each once.
	HeldByAll(ctx context.Context, workers []string) ([]worker.HeldTask, error)
	// Active returns the tasks asynq lists as running on queues, with
	// their leases.
	Active(ctx context.Context, queues []string) ([]asynqdata.ActiveTask, error)
	// MarkRedriven records that a copy of each of ts was queued at at;
	// marks older than keep may be forgotten.
	MarkRedriven(ctx context.Context, ts []worker.HeldTask, at time.Time, keep time.Duration) error
	// Redriven reports which of ts were marked at or after since.
	Redriven(ctx context.Context, ts []worker.HeldTask, since time.Time) ([]bool, error)
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
	// at most 500ms: an idle pass is two reads, and the interval is the
	// part of a dead worker's (or an orphan's) recovery time that the
	// watchdog adds to DeadAfter.
	Interval time.Duration
	// Queues are the asynq queues whose running tasks the watchdog
	// watches for orphans: those that workers run under a Heartbeat's
	// Middleware, and only those, since a task no record names is taken
	// for one that nobody runs. Default tasks.Queues and
	// tasks.QueueWebhooks.
	Queues []string
	// Registerer, when set, gets the watchdog's counters:
	// puzzleq_dead_workers_total, puzzleq_redriven_tasks_total and
	// puzzleq_orphaned_tasks_total.
	Registerer prometheus.Registerer
}

// orphanTag stands for the worker in RedriveID of an orphan's copy: no
// worker held it, and no worker ID (NewWorkerID) is this word.
const orphanTag = "orphan"

// watchdogLease names the lease that lets one API replica at a time
// re-drive dead workers' tasks.
const watchdogLease = "watchdog"

// Watchdog re-drives the tasks of dead workers within seconds, where
// asynq v0.26 takes 60-130 s (docs/guarantees.md). Every API
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
// record behind each task (worker.Heartbeat): a task the worker was killed
// within about 5 ms of starting (holdDelay, plus the write's round trip)
// is not in it yet; the orphan watch below re-drives it.
//
// Orphans. A task can also be running in asynq's eyes with no worker
// running it: when Redis stalls longer than a worker's read timeout (3 s)
// right after an enqueue, the worker gives up on its dequeue script, and
// Redis runs it when it wakes; the task moves to the active list with a
// 30 s lease that nobody holds or extends, and waits 60-120 s for asynq's
// recoverer. So each pass also reads asynq's active lists with their
// leases (asynqdata.Active), and a task that this watchdog's uninterrupted
// view has listed as active for DeadAfter is an orphan when no present
// worker's record names it (the records are read after the lists, and a
// live worker writes a task into its record within holdDelay of its
// start and again with every beat, so DeadAfter never races a worker that
// just dequeued), or when its lease has ended by this watchdog's clock (a
// worker still names it, but asynq's server gave it up: a handler that
// outlived its lease). An orphan is re-driven as a dead worker's task is:
// a copy under tasks.RedriveID(id, orphanTag), counted once by the store
// whichever of the copy and the original runs later.
//
// Every original the watchdog copies, a dead worker's or an orphan, is
// marked in Redis (MarkRedriven) for worker.HeldTTL, by which time asynq
// has recovered it: a dead worker's task is an orphan too once its worker
// is reaped, and an orphan stays listed until asynq recovers it, and the
// mark keeps either from being copied twice, by this replica or another.
// A gap in the view (see above) starts every task's count again, so a
// task dequeued during a Redis stall is re-driven DeadAfter after the
// first pass that reads Redis again (about 2.5 s with the defaults).
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
	// active is each task asynq lists as running, as this view saw it.
	active map[worker.HeldTask]*activeSighting

	deadWorkers, redriven, orphaned prometheus.Counter
}

type sighting struct {
	at    int64
	since time.Time
}

// activeSighting is a running task as this watchdog saw it.
type activeSighting struct {
	since time.Time // the first pass of this uninterrupted view that listed it
	// checked is the last look that cleared it: the records named it, or
	// a copy of it was queued (by this look or an earlier one).
	checked time.Time
	lease   time.Time // its lease, as last read
}

// NewWatchdog returns a Watchdog; Run runs it.
func NewWatchdog(st WatchdogStore, insp TaskInspector, enq Enqueuer, log *slog.Logger, o WatchdogOptions) *Watchdog {
	if o.DeadAfter <= 0 {
		panic(fmt.Sprintf("recovery: WatchdogOptions.DeadAfter must be positive, got %s", o.DeadAfter))
	}
	if o.Interval <= 0 {
		o.Interval = min(o.DeadAfter/6, 500*time.Millisecond)
	}
	if o.Queues == nil {
		o.Queues = append(append(append([]string{}, tasks.Queues...), tasks.CheapQueues...), tasks.QueueWebhooks)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	w := &Watchdog{store: st, insp: insp, enq: enq, log: log.With("component", "watchdog"), opts: o,
		holder: hex.EncodeToString(b[:]), seen: map[string]sighting{}, now: time.Now,
		active: map[worker.HeldTask]*activeSighting{},
		deadWorkers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "puzzleq_dead_workers_total", Help: "Workers whose heartbeat stopped and whose tasks this API replica re-drove.",
		}),
		redriven: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "puzzleq_redriven_tasks_total", Help: "Tasks of dead workers this API replica queued again under a new task ID.",
		}),
		orphaned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "puzzleq_orphaned_tasks_total", Help: "Tasks asynq listed as running that no worker ran, which this API replica queued again under a new task ID.",
		}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(w.deadWorkers, w.redriven, w.orphaned)
	}
	return w
}

// Run watches every Interval until ctx ends.
func (w *Watchdog) Run(ctx context.Context) {
	every(ctx, w.opts.Interval, w.log, "watchdog pass failed", w.RunOnce)
}

// RunOnce makes one pass and returns how many tasks it re-drove. An idle
// pass is two reads: the heartbeats, and asynq's active lists with their
// leases (one pipelined round trip); the workers' records are read only
// when a task listed for DeadAfter has not been looked at for as long.
func (w *Watchdog) RunOnce(ctx context.Context) (int, error) {
	beats, err := w.store.Workers(ctx)
	var active []asynqdata.ActiveTask
	if err == nil {
		active, err = w.store.Active(ctx, w.opts.Queues)
	}
	now := w.now()
	if err != nil {
		w.lastPass = time.Time{}
		return 0, err
	}
	// A pass is late when Redis stalled (the reads above took long) or
	// this process did: either way the beats it missed are no evidence.
	fresh := w.lastPass.IsZero() || now.Sub(w.lastPass) > w.opts.DeadAfter/2
	w.lastPass = now
	present := make(map[string]bool, len(beats))
	var dead []worker.WorkerBeat
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
	due := w.track(active, now, fresh)
	if len(dead) == 0 && len(due) == 0 {
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
	if len(due) > 0 {
		// After the dead workers' re-drive: the records read here lack
		// the workers just reaped, whose tasks are marked.
		n, err := w.orphans(ctx, beats, due, now)
		total += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return total, errors.Join(errs...)
}

// track updates the view of asynq's running tasks with this pass's read
// and returns the tasks due a look: listed for DeadAfter, and not cleared
// by a look for DeadAfter.
func (w *Watchdog) track(active []asynqdata.ActiveTask, now time.Time, fresh bool) []worker.HeldTask {
	if fresh {
		clear(w.active)
	}
	listed := make(map[worker.HeldTask]bool, len(active))
	var due []worker.HeldTask
	for _, a := range active {
		t := worker.HeldTask{Queue: a.Queue, ID: a.ID}
		listed[t] = true
		s, ok := w.active[t]
		if !ok {
			s = &activeSighting{since: now}
			w.active[t] = s
		}
		s.lease = a.Lease
		if now.Sub(s.since) >= w.opts.DeadAfter && now.Sub(s.checked) >= w.opts.DeadAfter {
			due = append(due, t)
		}
	}
	for t := range w.active {
		if !listed[t] {
			delete(w.active, t)
		}
	}
	return due
}

// expired reports whether a running task's lease has ended by this
// watchdog's clock: asynq's server has given the task up (it extends the
// lease of what it runs every 5 s, to 30 s ahead). Hosts' clocks over
// 25 s apart would make a live task look expired, which costs a copy
// that the store makes harmless.
func (w *Watchdog) expired(s *activeSighting, now time.Time) bool {
	return !s.lease.IsZero() && now.After(s.lease)
}

// orphans re-drives the due tasks that no worker's record names, and
// those past their lease, unless a copy of them was queued already.
func (w *Watchdog) orphans(ctx context.Context, beats []worker.WorkerBeat, due []worker.HeldTask, now time.Time) (int, error) {
	ids := make([]string, len(beats))
	for i, b := range beats {
		ids[i] = b.Worker
	}
	held, err := w.store.HeldByAll(ctx, ids)
	if err != nil {
		return 0, err
	}
	named := make(map[worker.HeldTask]bool, len(held))
	for _, t := range held {
		named[t] = true
	}
	var cand []worker.HeldTask
	var why []string
	for _, t := range due {
		s := w.active[t]
		switch {
		case w.expired(s, now):
			cand, why = append(cand, t), append(why, "lease_ended")
		case named[t]:
			s.checked = now
		default:
			cand, why = append(cand, t), append(why, "unnamed")
		}
	}
	if len(cand) == 0 {
		return 0, nil
	}
	marked, err := w.store.Redriven(ctx, cand, now.Add(-worker.HeldTTL))
	if err != nil {
		return 0, err
	}
	var (
		n       int
		errs    []error
		copied  []worker.HeldTask
		reasons []string
	)
	for i, t := range cand {
		w.active[t].checked = now
		if marked[i] {
			continue // copied already; asynq recovers the original
		}
		ti, err := w.insp.GetTaskInfo(t.Queue, t.ID)
		switch {
		case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
			continue // it ended since the read
		case err != nil:
			errs = append(errs, fmt.Errorf("look up orphaned task %s: %w", t.ID, err))
			continue
		case ti.State != asynq.TaskStateActive:
			continue
		}
		_, err = w.enq.EnqueueContext(ctx, tasks.RedriveTask(ti, orphanTag))
		if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
			errs = append(errs, fmt.Errorf("re-drive orphaned task %s: %w", t.ID, err))
			continue
		}
		n++
		copied = append(copied, t)
		reasons = append(reasons, t.Queue+"/"+t.ID+":"+why[i])
	}
	if err := w.store.MarkRedriven(ctx, copied, now, worker.HeldTTL); err != nil {
		errs = append(errs, err)
	}
	if n > 0 {
		w.orphaned.Add(float64(n))
		w.log.Info("re-drove orphaned tasks", "redriven", n, "tasks", reasons)
	}
	return n, errors.Join(errs...)
}

// redrive enqueues a copy of every task dead worker b held that asynq
// still lists as active, then removes the worker. A copy that is queued
// already (the same RedriveID) counts as done. When an enqueue fails the
// worker stays, and the next pass tries again.
func (w *Watchdog) redrive(ctx context.Context, b worker.WorkerBeat, silent time.Duration) (int, error) {
	held, err := w.store.Held(ctx, b.Worker)
	if err != nil {
		return 0, err
	}
	var (
		n      int
		errs   []error
		ids    []string
		copied []worker.HeldTask
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
		copied = append(copied, ht)
	}
	// The originals stay listed as active with no worker naming them
	// once the worker is reaped: the mark keeps the orphan watch off them.
	if err := w.store.MarkRedriven(ctx, copied, w.now(), worker.HeldTTL); err != nil {
		errs = append(errs, err)
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
