package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/tasks"
)

// A worker that dies (kill -9, a crashed node) cannot give its tasks back,
// and asynq v0.26 recovers them only after its 30 s lease and a recoverer
// that runs once a minute: 60-130 s. So every worker heartbeats, with the
// asynq tasks it runs, and a watchdog (internal/recovery's Watchdog, on every
// API replica) that sees a worker's heartbeat stop re-drives its tasks
// within seconds: it enqueues a fresh copy of each under a new task ID
// (tasks.RedriveTask). The copy and the original, when asynq recovers it, run
// the same items; the store's scripts end and count each item once, so the
// later one finds it ended and does nothing (docs/guarantees.md).

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

// Presence is what a worker's last beat said of it, for GET /v1/status:
// its solver slots, when it started, and the tasks it ran on the solver
// queues at that moment, by type. It is written with every beat, so it
// is at most a heartbeat interval old; a worker that stops beating drops
// out of it after presenceBeats intervals, or sooner when it leaves or
// the watchdog reaps it.
type Presence struct {
	// ID is the worker's ID (NewWorkerID); the store fills it in.
	ID string `json:"-"`
	// Slots is the worker's solver slots (its asynq concurrency on the
	// solver queues).
	Slots int `json:"slots"`
	// Started is when the worker started, Unix ms by its clock.
	Started int64 `json:"started"`
	// Running counts the tasks it runs on the solver queues by type.
	Running map[string]int `json:"running,omitempty"`
	// Draining is set once the worker stopped taking tasks to shut down:
	// it finishes what it runs, then leaves.
	Draining bool `json:"draining,omitempty"`
}

// Busy is how many tasks the worker runs on its solver slots.
func (p Presence) Busy() int {
	n := 0
	for _, c := range p.Running {
		n += c
	}
	return n
}

// BeatStore is what a Heartbeat needs of the store; *store.Store
// satisfies it.
type BeatStore interface {
	// Beat records that worker is alive as of at (Unix ms), rewrites the
	// tasks it runs (run token -> task) and removes the run tokens that
	// ended. The worker's record of tasks expires ttl after its last
	// write; its presence, presenceTTL after it.
	Beat(ctx context.Context, worker string, at int64, running map[string]HeldTask, ended []string, ttl time.Duration, p Presence, presenceTTL time.Duration) error
	// Hold records tasks the worker has started (run token -> task) in
	// one round trip, without touching its beat; the record expires ttl
	// after this write.
	Hold(ctx context.Context, worker string, started map[string]HeldTask, ttl time.Duration) error
	// Leave removes the worker's heartbeat, tasks and solver slots
	// (SlotRegistry): it stopped cleanly, and asynq gave back what it did
	// not finish.
	Leave(ctx context.Context, worker string) error
}

// SlotRegistry is where a worker records its solver slots, which the keys
// with expensive work share (see Gate); *store.Store satisfies it.
type SlotRegistry interface {
	// RegisterSlots records that worker runs slots solver slots for ttl
	// unless written again, and returns the cluster's solver slots with
	// them. Leave (BeatStore) removes the entry.
	RegisterSlots(ctx context.Context, worker string, slots int, ttl time.Duration) (int, error)
}

// slotsBeats is how many heartbeat intervals a worker's solver slots
// outlive its last beat. A worker killed without leaving counts that long
// (the watchdog's reap removes it sooner), which costs only the split of
// slots between keys; a worker whose beats are slow a moment must not
// drop out, which would park runs beside its idle slots.
const slotsBeats = 6

// presenceBeats is how many heartbeat intervals a worker's Presence
// outlives its last beat: as long as its solver slots count, so that a
// worker whose slots are shared is also shown.
const presenceBeats = slotsBeats

// HeldTTL is how long a worker's record of its tasks outlives its last
// write. Past it, asynq's own recovery (at most about 130 s after the
// worker died) has requeued them, so a re-drive would only run them
// twice; until then, a watchdog that starts late still finds them.
const HeldTTL = 3 * time.Minute

// holdDelay is how long a started task waits in memory before the
// Heartbeat's flusher writes it, with every other task started meanwhile
// and not yet written, in one round trip (one HSET of many fields and
// one PEXPIRE). Nothing else waits for that write: the task runs at once.
//
// 5 ms because it is long against what it saves and short against what it
// risks. Long against a single 8-puzzle's solve (a table lookup: the
// handler, with its finish script, is done in well under a millisecond
// at idle and in a few at this machine's load), so most single tasks end
// before it and are never written, and against a loopback round trip (50-
// 500 us), so a worker writes at most 200 holds a second whatever its
// task rate. Short against what the record is for: the watchdog declares
// a worker dead after WORKER_DEAD_AFTER (2 s) and re-drives what it held,
// so 5 ms more before the record exists changes nothing for any task long
// enough to be worth re-driving, and it is 1% of a HEARTBEAT_INTERVAL
// (500 ms), after which the next beat would write the task anyway.
const holdDelay = 5 * time.Millisecond

// Heartbeat keeps a worker's heartbeat and its record of running tasks.
// Its Middleware records each task as it starts in memory and wakes a
// flusher, one per Heartbeat and only while there is something to write,
// which waits holdDelay and writes every running task not yet written in
// one pipelined round trip; a task that ended before it was written is
// never written, and so needs no removal either. Run beats every
// interval; a beat also rewrites every running task, so a worker that was
// frozen, declared dead and reaped, and then came back is whole again
// after one beat, and a task whose flush failed is written by the next
// flush or beat. Ended tasks that may have been written are removed by
// the next beat, not one by one: a watchdog that reads a dead worker's
// record finds such a task gone from asynq and skips it.
//
// What that promises: a task is in the worker's record once the first
// flush or beat after its start has reached Redis: holdDelay after the
// start, plus that write's round trip, plus a write already in flight (a
// beat, or the previous flush; each bounded by the heartbeat interval).
// A worker killed inside that window leaves the task to asynq's own
// recovery (60-130 s) instead of the watchdog (seconds); before the
// write-behind the same window was the synchronous write's round trip,
// before the handler ran. Either way nothing acknowledged is lost: asynq
// still lists the task as active and recovers it after its lease. A run
// that takes something other runs wait for (an expensive run's slot or
// lead) closes the window for itself with HoldNow.
type Heartbeat struct {
	store    BeatStore
	id       string
	interval time.Duration
	log      *slog.Logger
	started  time.Time

	draining atomic.Bool   // Drain was called
	wake     chan struct{} // makes Run beat now
	cutOff   time.Duration // StopAfter; 0: never
	stopped  atomic.Int64  // tasks stopped because the beats failed
	lastGood atomic.Int64  // Unix ns of the last beat that reached the store

	// writeMu orders the flusher's writes and the beats: a task that ends
	// while a write with it is in flight is removed by a later beat, whose
	// HDEL must not overtake that HSET.
	writeMu sync.Mutex

	mu      sync.Mutex
	next    uint64
	running map[string]heldRunEntry            // run token -> task
	stops   map[string]context.CancelCauseFunc // run token -> its context's cancel
	ended   []string                           // run tokens to remove with the next beat
	// unwritten is each running task no write has stored yet: holdNew
	// for one no write has carried (never in Redis: when it ends, nothing
	// is left to remove), holdRetry for one whose write failed (it may
	// have landed, so its end is removed by a beat).
	unwritten map[string]holdState
	flushing  bool // a flusher goroutine runs (or is about to)
	closed    bool // Run's ctx ended or Leave was called: no more flushers

	life     context.Context // ends with closeFlusher, and with it a flush in flight
	kill     context.CancelFunc
	flushers sync.WaitGroup
	failing  atomic.Bool // the last flush failed; logged once per outage

	// SetSlots' registry, the worker's solver slots and the callback that
	// is told the cluster's; nil registry: none recorded.
	slotReg     SlotRegistry
	slots       int
	onSlots     func(int)
	slotFailing atomic.Bool // the last registration failed; logged once per outage
}

// heldRunEntry is one run a Heartbeat's Middleware tracks: its asynq task,
// and its task type when it runs on a solver queue ("" otherwise), which
// the worker's Presence counts.
type heldRunEntry struct {
	task       HeldTask
	solverType string
}

// holdState is how far a running task's record in Redis has got.
type holdState uint8

const (
	holdNew   holdState = iota // no write has carried it
	holdRetry                  // a write carried it and failed
)

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

// SetSlots makes every beat (Beat, so also the first, before the worker
// fetches any task) record the worker's solver slots in reg, and tell
// seen the cluster's solver slots that reg answers. Leave removes them.
// Call it before Run.
func (h *Heartbeat) SetSlots(reg SlotRegistry, slots int, seen func(total int)) {
	h.slotReg, h.slots, h.onSlots = reg, slots, seen
}

// Stopped returns how many tasks Run stopped because the beats failed.
func (h *Heartbeat) Stopped() int64 { return h.stopped.Load() }

// NewWorkerID returns a process's name: "w-" and 12 random hex digits,
// new with every start. It is the one name the worker goes by: in its
// logs (every line's worker_id), in the store, and to tenants on GET
// /v1/status and the dashboard. It holds neither host nor pid, which are
// the operator's: the worker logs them beside it when it starts, and
// asynqmon (/monitoring/) lists its servers by them.
func NewWorkerID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "w-" + hex.EncodeToString(b[:])
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
	life, kill := context.WithCancel(context.Background())
	return &Heartbeat{store: st, id: id, interval: interval, log: log, started: time.Now(),
		running: map[string]heldRunEntry{}, stops: map[string]context.CancelCauseFunc{},
		unwritten: map[string]holdState{}, life: life, kill: kill, wake: make(chan struct{}, 1)}
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
// The record is written behind the task, never before it: the task starts
// at once, and the flusher writes it holdDelay later if it still runs
// (see Heartbeat for the window this leaves). That write is bounded by
// the heartbeat interval, and one that fails is retried by the next flush
// or beat; no task waits for Redis here.
func (h *Heartbeat) Middleware() asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			q, id := delivery(ctx)
			ht := HeldTask{Queue: q, ID: id}
			parent := ctx
			ctx, stop := context.WithCancelCause(ctx)
			defer stop(nil)
			h.mu.Lock()
			h.next++
			run := strconv.FormatUint(h.next, 36)
			e := heldRunEntry{task: ht}
			if slices.Contains(tasks.Queues, q) {
				e.solverType = t.Type()
			}
			h.running[run] = e
			h.stops[run] = stop
			h.unwritten[run] = holdNew
			if !h.flushing && !h.closed {
				h.flushing = true
				h.flushers.Add(1)
				go h.flusher()
			}
			h.mu.Unlock()
			ctx = context.WithValue(ctx, heldKey{}, heldRun{h, run})
			defer func() {
				h.mu.Lock()
				delete(h.running, run)
				delete(h.stops, run)
				if st, ok := h.unwritten[run]; !ok || st == holdRetry {
					h.ended = append(h.ended, run) // it may be in Redis
				}
				delete(h.unwritten, run)
				h.mu.Unlock()
			}()
			err := next.ProcessTask(ctx, t)
			if errors.Is(context.Cause(ctx), ErrCutOff) {
				return h.afterCutOff(parent, err)
			}
			return err
		})
	}
}

// flusher writes the unwritten running tasks holdDelay after it was
// woken, and again holdDelay after each write while tasks started during
// it wait; then it exits, and the next task to start wakes another. After
// a failed write it exits too, leaving the tasks unwritten: the next
// flush (woken by the next task to start) or the next beat writes them,
// so a Redis that is down costs at most one failing write per wake, not
// one every holdDelay.
func (h *Heartbeat) flusher() {
	defer h.flushers.Done()
	t := time.NewTimer(holdDelay)
	defer t.Stop()
	for {
		select {
		case <-h.life.Done():
			h.mu.Lock()
			h.flushing = false
			h.mu.Unlock()
			return
		case <-t.C:
		}
		n, err := h.flush()
		switch {
		case err != nil && h.life.Err() == nil && !h.failing.Swap(true):
			h.log.Warn("heartbeat: record started tasks; the next flush or beat retries", "worker_id", h.id, "tasks", n, "err", err)
		case err == nil && n > 0:
			h.failing.Store(false)
		}
		h.mu.Lock()
		if err != nil || len(h.unwritten) == 0 || h.closed {
			h.flushing = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		t.Reset(holdDelay)
	}
}

// heldKey is the context key under which Middleware leaves the run it
// started, for HoldNow.
type heldKey struct{}

// heldRun is one task run by a Heartbeat's Middleware.
type heldRun struct {
	h   *Heartbeat
	run string
}

// HoldNow makes sure the task that ctx runs is in its worker's record
// before it returns: it writes it now, with every other task not yet
// written, unless a write has already carried it. Outside a Heartbeat's
// Middleware it does nothing.
//
// A run calls it before it takes something other runs wait for (a slot
// of its key's expensive work, the lead of a solve): a worker killed in
// the write-behind window (see Heartbeat) leaves its task to asynq's
// recovery, a minute or two, and a slot or lead would stall its key's
// other work that long instead of the watchdog's seconds. Such a run
// lasts seconds, so the round trip costs it nothing that matters; the
// cheap tasks that make up the task rate never call it.
//
// An error means the write failed; the task stays unwritten, and the
// next flush or beat writes it.
func HoldNow(ctx context.Context) error {
	hr, ok := ctx.Value(heldKey{}).(heldRun)
	if !ok {
		return nil
	}
	h := hr.h
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	// A write that carried it has ended (writeMu orders them): it is
	// unwritten only if none did, or the one that did failed.
	h.mu.Lock()
	_, unwritten := h.unwritten[hr.run]
	h.mu.Unlock()
	if !unwritten {
		return nil
	}
	_, err := h.flushLocked()
	return err
}

// flush writes every unwritten running task in one round trip, bounded by
// the heartbeat interval, and returns how many it wrote (or tried to).
func (h *Heartbeat) flush() (int, error) {
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	return h.flushLocked()
}

// flushLocked is flush with writeMu held.
func (h *Heartbeat) flushLocked() (int, error) {
	h.mu.Lock()
	if len(h.unwritten) == 0 || h.closed {
		h.mu.Unlock()
		return 0, nil
	}
	batch := make(map[string]HeldTask, len(h.unwritten))
	for run := range h.unwritten {
		batch[run] = h.running[run].task
	}
	clear(h.unwritten) // from here, a task that ends goes to ended
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(h.life, h.interval)
	err := h.store.Hold(ctx, h.id, batch, HeldTTL)
	cancel()
	if err != nil {
		h.retry(batch)
		return len(batch), fmt.Errorf("tasks: record %d started tasks of %s: %w", len(batch), h.id, err)
	}
	return len(batch), nil
}

// retry marks the tasks of a failed write that still run as unwritten,
// for the next flush or beat.
func (h *Heartbeat) retry(runs map[string]HeldTask) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for run := range runs {
		if _, ok := h.running[run]; ok {
			h.unwritten[run] = holdRetry
		}
	}
}

// closeFlusher stops the flusher and waits for it: a write it has not
// begun is dropped, one in flight ends with its ctx (or its bound, the
// heartbeat interval). Tasks that start afterwards are only kept in
// memory. It is idempotent.
func (h *Heartbeat) closeFlusher() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.kill()
	h.flushers.Wait()
}

// Beat writes one heartbeat with the running tasks, and then the
// worker's solver slots (SetSlots). A beat that fails keeps its ended
// tokens for the next one, and leaves the tasks it was the first write of
// unwritten.
func (h *Heartbeat) Beat(ctx context.Context) error {
	if err := h.beat(ctx); err != nil {
		return err
	}
	// Outside writeMu: a run's HoldNow need not wait for it.
	rctx, cancel := context.WithTimeout(ctx, h.interval)
	defer cancel()
	h.registerSlots(rctx)
	return nil
}

// beat is Beat's heartbeat.
func (h *Heartbeat) beat(ctx context.Context) error {
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	h.mu.Lock()
	running := make(map[string]HeldTask, len(h.running))
	p := Presence{Slots: h.slots, Started: h.started.UnixMilli(), Running: map[string]int{}, Draining: h.draining.Load()}
	for k, v := range h.running {
		running[k] = v.task
		if v.solverType != "" {
			p.Running[v.solverType]++
		}
	}
	ended := h.ended
	h.ended = nil
	var first map[string]HeldTask
	if len(h.unwritten) > 0 {
		first = make(map[string]HeldTask, len(h.unwritten))
		for run := range h.unwritten {
			first[run] = running[run]
		}
		clear(h.unwritten)
	}
	h.mu.Unlock()
	bctx, cancel := context.WithTimeout(ctx, h.interval)
	defer cancel()
	err := h.store.Beat(bctx, h.id, time.Now().UnixMilli(), running, ended, HeldTTL, p, presenceBeats*h.interval)
	if err != nil {
		h.mu.Lock()
		h.ended = append(ended, h.ended...)
		h.mu.Unlock()
		h.retry(first)
		return fmt.Errorf("tasks: heartbeat of %s: %w", h.id, err)
	}
	h.failing.Store(false) // it wrote what a failed flush left
	return nil
}

// registerSlots records the worker's solver slots (SetSlots). A failure
// is logged once per outage and does not fail the beat: the entry lives
// slotsBeats intervals, so the next beats renew it in time.
func (h *Heartbeat) registerSlots(ctx context.Context) {
	if h.slotReg == nil {
		return
	}
	total, err := h.slotReg.RegisterSlots(ctx, h.id, h.slots, slotsBeats*h.interval)
	if err != nil {
		if ctx.Err() == nil && !h.slotFailing.Swap(true) {
			h.log.Warn("heartbeat: record the worker's solver slots; the next beat retries", "worker_id", h.id, "err", err)
		}
		return
	}
	h.slotFailing.Store(false)
	if h.onSlots != nil {
		h.onSlots(total)
	}
}

// Run beats every interval until ctx ends, and then stops the flusher
// (and waits for it). A failed beat is logged once per outage, not every
// interval.
func (h *Heartbeat) Run(ctx context.Context) {
	defer h.closeFlusher()
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
		case <-h.wake:
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

// Drain marks the worker as shutting down: the beats say so in its
// Presence while it finishes what it runs, from one that Run makes at
// once, since a worker whose tasks end soon leaves within a beat.
func (h *Heartbeat) Drain() {
	h.draining.Store(true)
	select {
	case h.wake <- struct{}{}:
	default: // a beat is due already
	}
}

// Leave stops the flusher (and waits for it, so that no write of it
// lands after this one) and removes the worker's heartbeat, and its
// solver slots (SetSlots), once it has stopped cleanly.
func (h *Heartbeat) Leave(ctx context.Context) error {
	h.closeFlusher()
	if err := h.store.Leave(ctx, h.id); err != nil {
		return fmt.Errorf("tasks: leave %s: %w", h.id, err)
	}
	return nil
}
