package tasks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
)

// A worker that dies (kill -9, a crashed node) cannot give its tasks back,
// and asynq v0.26 recovers them only after its 30 s lease and a recoverer
// that runs once a minute: 60-130 s. So every worker heartbeats, with the
// asynq tasks it runs, and a watchdog (internal/api's Watchdog, on every
// API replica) that sees a worker's heartbeat stop re-drives its tasks
// within seconds: it enqueues a fresh copy of each under a new task ID
// (RedriveTask). The copy and the original, when asynq recovers it, run
// the same items; the store's scripts end and count each item once, so the
// later one finds it ended and does nothing (RELIABILITY.md, issue 13).

// HeldTask is one asynq task a worker runs, by what an asynq Inspector
// finds it by.
type HeldTask struct {
	Queue string `json:"q"`
	ID    string `json:"id"`
}

// WorkerBeat is a worker's last heartbeat as the store has it.
type WorkerBeat struct {
	// Worker is the worker's ID (NewWorkerID).
	Worker string
	// At is the time the worker wrote with its last beat, by its clock.
	// The watchdog compares it only with earlier values of itself, never
	// with its own clock, so clock skew between hosts does not matter.
	At int64
}

// BeatStore is what a Heartbeat needs of the store; *store.Store
// satisfies it.
type BeatStore interface {
	// Beat records that worker is alive as of at (Unix ms), rewrites the
	// tasks it runs (run token -> task) and removes the run tokens that
	// ended. The worker's record of tasks expires ttl after its last
	// write.
	Beat(ctx context.Context, worker string, at int64, running map[string]HeldTask, ended []string, ttl time.Duration) error
	// Hold records one task the worker has just started under run.
	Hold(ctx context.Context, worker, run string, t HeldTask, ttl time.Duration) error
	// Leave removes the worker's heartbeat and tasks: it stopped cleanly,
	// and asynq gave back what it did not finish.
	Leave(ctx context.Context, worker string) error
}

// HeldTTL is how long a worker's record of its tasks outlives its last
// write. Past it, asynq's own recovery (at most about 130 s after the
// worker died) has requeued them, so a re-drive would only run them
// twice; until then, a watchdog that starts late still finds them.
const HeldTTL = 3 * time.Minute

// Heartbeat keeps a worker's heartbeat and its record of running tasks.
// Its Middleware records each task as it starts (one Redis write, so a
// worker killed a moment later has still told the watchdog), and Run
// beats every interval; a beat also rewrites every running task, so a
// worker that was frozen, declared dead and reaped, and then came back is
// whole again after one beat. Ended tasks are removed by the next beat,
// not one by one: a watchdog that reads a dead worker's record finds such
// a task gone from asynq and skips it.
type Heartbeat struct {
	store    BeatStore
	id       string
	interval time.Duration
	log      *slog.Logger

	cutOff   time.Duration // StopAfter; 0: never
	stopped  atomic.Int64  // tasks stopped because the beats failed
	lastGood atomic.Int64  // Unix ns of the last beat that reached the store

	mu      sync.Mutex
	next    uint64
	running map[string]HeldTask                // run token -> task
	stops   map[string]context.CancelCauseFunc // run token -> its context's cancel
	ended   []string                           // run tokens to remove with the next beat
}

// ErrCutOff is the cause of a task context that its worker stopped
// because its heartbeats had failed for StopAfter: the watchdog has taken
// the worker for dead and re-driven the task elsewhere.
var ErrCutOff = errors.New("tasks: worker cut off from Redis; its tasks were re-driven elsewhere")

// StopAfter makes Run stop every running task (cancel its context with
// ErrCutOff) once the beats have failed for d: a worker cut off from
// Redis that long has been taken for dead and its tasks re-driven, so
// solving on is wasted work whose result the store would drop. 0, the
// zero value, never stops. Call it before Run.
func (h *Heartbeat) StopAfter(d time.Duration) { h.cutOff = d }

// Stopped returns how many tasks Run stopped because the beats failed.
func (h *Heartbeat) Stopped() int64 { return h.stopped.Load() }

// NewWorkerID returns a worker ID that names the host and process, for
// operators, and is unique across restarts of the same pod.
func NewWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// NewHeartbeat returns the heartbeat of worker id, beating every interval
// (HEARTBEAT_INTERVAL). It panics on a non-positive interval: a wiring
// bug, never a state to run in.
func NewHeartbeat(st BeatStore, id string, interval time.Duration, log *slog.Logger) *Heartbeat {
	if interval <= 0 {
		panic(fmt.Sprintf("tasks: heartbeat interval must be positive, got %s", interval))
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Heartbeat{store: st, id: id, interval: interval, log: log,
		running: map[string]HeldTask{}, stops: map[string]context.CancelCauseFunc{}}
}

// ID is the worker's ID.
func (h *Heartbeat) ID() string { return h.id }

// Running returns how many tasks the worker runs, for tests.
func (h *Heartbeat) Running() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.running)
}

// Middleware records every task the worker runs for as long as it runs.
// The first write is bounded by the heartbeat interval: when Redis is
// slow the task starts anyway, and the next beat records it.
func (h *Heartbeat) Middleware() asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			q, _ := asynq.GetQueueName(ctx)
			ht := HeldTask{Queue: q, ID: id}
			parent := ctx
			ctx, stop := context.WithCancelCause(ctx)
			defer stop(nil)
			h.mu.Lock()
			h.next++
			run := strconv.FormatUint(h.next, 36)
			h.running[run] = ht
			h.stops[run] = stop
			h.mu.Unlock()
			defer func() {
				h.mu.Lock()
				delete(h.running, run)
				delete(h.stops, run)
				h.ended = append(h.ended, run)
				h.mu.Unlock()
			}()
			hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.interval)
			if err := h.store.Hold(hctx, h.id, run, ht, HeldTTL); err != nil {
				h.log.Warn("heartbeat: record a started task", "task_id", id, "queue", q, "err", err)
			}
			cancel()
			err := next.ProcessTask(ctx, t)
			if errors.Is(context.Cause(ctx), ErrCutOff) {
				return h.afterCutOff(parent, err)
			}
			return err
		})
	}
}

// Beat writes one heartbeat with the running tasks. A beat that fails
// keeps its ended tokens for the next one.
func (h *Heartbeat) Beat(ctx context.Context) error {
	h.mu.Lock()
	running := make(map[string]HeldTask, len(h.running))
	for k, v := range h.running {
		running[k] = v
	}
	ended := h.ended
	h.ended = nil
	h.mu.Unlock()
	bctx, cancel := context.WithTimeout(ctx, h.interval)
	defer cancel()
	err := h.store.Beat(bctx, h.id, time.Now().UnixMilli(), running, ended, HeldTTL)
	if err != nil {
		h.mu.Lock()
		h.ended = append(ended, h.ended...)
		h.mu.Unlock()
		return fmt.Errorf("tasks: heartbeat of %s: %w", h.id, err)
	}
	return nil
}

// Run beats every interval until ctx ends. A failed beat is logged once
// per outage, not every interval.
func (h *Heartbeat) Run(ctx context.Context) {
	t := time.NewTicker(h.interval)
	defer t.Stop()
	failing := false
	h.lastGood.Store(time.Now().UnixNano())
	for {
		err := h.Beat(ctx)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			h.log.Warn("heartbeat failed", "worker_id", h.id, "err", err)
			failing = true
		case err == nil && failing:
			h.log.Info("heartbeat restored", "worker_id", h.id)
			failing = false
		}
		if err == nil {
			h.lastGood.Store(time.Now().UnixNano())
		} else if failed := time.Since(time.Unix(0, h.lastGood.Load())); ctx.Err() == nil && h.cutOff > 0 && failed >= h.cutOff {
			h.stopRunning(failed)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// stopRunning stops every running task: the beats have failed for
// failedFor, past StopAfter. A task started meanwhile is stopped by the
// next failed beat.
func (h *Heartbeat) stopRunning(failedFor time.Duration) {
	h.mu.Lock()
	stops := make([]context.CancelCauseFunc, 0, len(h.stops))
	for run, stop := range h.stops {
		stops = append(stops, stop)
		delete(h.stops, run)
	}
	h.mu.Unlock()
	if len(stops) == 0 {
		return
	}
	for _, stop := range stops {
		stop(ErrCutOff)
	}
	h.stopped.Add(int64(len(stops)))
	h.log.Warn("heartbeat: cut off from Redis; stopping the running tasks, which the watchdog re-drives elsewhere",
		"worker_id", h.id, "tasks", len(stops), "failed_for", failedFor.Round(time.Millisecond).String())
}

// afterCutOff holds a task that stopRunning stopped until a beat reaches
// the store again (or asynq's context ends: shutdown, a lost lease), then
// returns err marked ErrCutOff. Returned at once, asynq's own write of the
// failure would be lost in the same partition and the task would sit
// active until asynq's recoverer (60-130 s); returned after the heal, it
// is retried within seconds (the worker's retry delay) and finds its items
// ended by the copy the watchdog ran.
func (h *Heartbeat) afterCutOff(parent context.Context, err error) error {
	stoppedAt := time.Now().UnixNano()
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for h.lastGood.Load() < stoppedAt {
		select {
		case <-parent.Done():
			return fmt.Errorf("%w: %w", ErrCutOff, err)
		case <-t.C:
		}
	}
	return fmt.Errorf("%w: %w", ErrCutOff, err)
}

// Leave removes the worker's heartbeat once it has stopped cleanly.
func (h *Heartbeat) Leave(ctx context.Context) error {
	if err := h.store.Leave(ctx, h.id); err != nil {
		return fmt.Errorf("tasks: leave %s: %w", h.id, err)
	}
	return nil
}

// RedriveQueue returns the queue a dead worker's task from queue is
// re-driven on. A batch unit goes to the interactive queue, because it
// has waited its turn once already: on the bulk queue it would wait
// behind up to FEED_DEPTH units again, and interactive is served first
// (QUEUE_WEIGHTS); a crash re-drives at most one worker's concurrency of
// tasks. Any other task keeps its queue (webhook deliveries stay apart
// from the solves).
func RedriveQueue(queue string) string {
	if queue == QueueBulk {
		return QueueInteractive
	}
	return queue
}

// RedriveID is the task ID of the copy of task id re-driven after worker
// died. It differs from id, which asynq still holds as active until it
// recovers it, and is the same on every try, so a watchdog that re-drives
// the same dead worker twice (a pass interrupted before it reaped the
// worker) makes one copy while the first is queued.
func RedriveID(id, worker string) string { return id + "~" + worker }

// RedriveTask builds the copy of a dead worker's task ti: the same type,
// payload, retries, timeout and retention, under RedriveID on
// RedriveQueue. Units
// have fixed task IDs (UnitRef.TaskID) for the feed's deduplication; the
// copy's ID is its own, and the handler reads the unit from the payload.
func RedriveTask(ti *asynq.TaskInfo, worker string) *asynq.Task {
	opts := []asynq.Option{asynq.TaskID(RedriveID(ti.ID, worker)), asynq.Queue(RedriveQueue(ti.Queue)), asynq.MaxRetry(ti.MaxRetry)}
	if ti.Retention > 0 {
		opts = append(opts, asynq.Retention(ti.Retention))
	}
	switch {
	case ti.Timeout > 0:
		opts = append(opts, asynq.Timeout(ti.Timeout))
	case !ti.Deadline.IsZero():
		opts = append(opts, asynq.Deadline(ti.Deadline))
	}
	return asynq.NewTask(ti.Type, ti.Payload, opts...)
}
