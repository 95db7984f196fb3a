package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/tasks"
)

// ErrRedisChanged is returned by a delivery that began on one Redis
// master and ended on another: a Sentinel failover, or a Redis restarted
// from a persisted copy older than its last writes. Writes it made to the
// first may be missing on the second, so it runs again, which counts as
// neither a retry nor a failure; its items that are ended on the second
// stay as they are.
var ErrRedisChanged = errors.New("redis master changed while the task ran")

// Enqueuer queues a task; *asynq.Client satisfies it.
type Enqueuer interface {
	EnqueueContext(ctx context.Context, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error)
}

// RerunOptions tune a Rerun.
type RerunOptions struct {
	// Window is how long before the last task finished on a master that
	// a finished task is run again when the master changes: the longest
	// replication lag (or, for a restart, the persistence lag: an
	// everysec fsync loses up to 2 s) whose loss is repaired. Default 3s.
	// What it keeps is live heap, which the worker's GC floor has to make
	// room for: at 3,400 8-puzzles a second it is about 10,000 solves.
	Window time.Duration
	// MaxBytes bounds the payload bytes of the finished tasks remembered;
	// past it the oldest are forgotten first. Default 8 MiB.
	MaxBytes int
	// MaxTasks bounds how many finished tasks are remembered. Default
	// 50,000: 3 s of a worker's 8-puzzles at over 15,000 a second.
	MaxTasks int
}

// Rerun runs again the solves a Redis master change may have taken back.
//
// Replication to a Redis replica is asynchronous (unless
// REDIS_ACK_REPLICAS asks for confirmations), and so is an append-only
// file's fsync. When the master dies, its last writes may be missing
// from the replica that takes over, or from the file a restart reloads.
// A submission acknowledged in that window is lost, as documented. A
// task's run is different: the worker wrote its results to the old
// master, and asynq's acknowledgement, which follows in a separate call,
// failed there and was retried until it reached the new one. The new
// master then holds the task as done, with the results missing: no
// recovery would ever run it again, and its batch would never end. The
// same happens to a run whose writes straddle the change.
//
// So its Middleware makes a delivery that ran across a change return
// ErrRedisChanged, and remembers, for Window, every solve it finished.
// When the connection hook reports a new master (Changed), every solve
// remembered (those that finished within Window of the last one on the
// old master) is queued again as a copy, under its own ID (tasks.RedriveID). A copy
// whose work is in the new master finds it ended and does nothing; one
// whose work was lost does it.
type Rerun struct {
	enq  Enqueuer
	log  *slog.Logger
	opts RerunOptions
	now  func() time.Time

	mu    sync.Mutex
	epoch uint64     // how many changes were reported
	done  []finished // all of the current epoch: Changed empties it
	head  int        // done[head:] are remembered
	bytes int
	wg    sync.WaitGroup
}

// finished is one solve a worker finished: enough to queue it again.
// It is kept small, since thousands are live at once: the queue and type
// are the package's constants (intern), not each delivery's copies.
type finished struct {
	at       int64 // Unix ns
	id       string
	queue    string
	typ      string
	payload  []byte
	timeout  time.Duration
	maxRetry int
}

// intern returns the constant among known equal to s, so that a
// remembered solve does not hold the delivery's own copy; s when none is.
func intern(s string, known ...string) string {
	for _, k := range known {
		if k == s {
			return k
		}
	}
	return s
}

// NewRerun returns a Rerun that queues copies through enq.
func NewRerun(enq Enqueuer, log *slog.Logger, o RerunOptions) *Rerun {
	if o.Window <= 0 {
		o.Window = 3 * time.Second
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = 8 << 20
	}
	if o.MaxTasks <= 0 {
		o.MaxTasks = 50_000
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Rerun{enq: enq, log: log, opts: o, now: time.Now}
}

// Middleware returns ErrRedisChanged for a delivery that succeeded across
// a change, and remembers every other that succeeded.
func (r *Rerun) Middleware() asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			r.mu.Lock()
			epoch := r.epoch
			r.mu.Unlock()
			start := r.now()
			if err := next.ProcessTask(ctx, t); err != nil {
				return err
			}
			q, id := delivery(ctx)
			f := finished{id: id, payload: t.Payload(),
				queue: intern(q, tasks.QueueInteractive, tasks.QueueBulk, tasks.QueueCheap, tasks.QueueCheapBulk),
				typ:   intern(t.Type(), tasks.TypeSliding, tasks.TypeSweep, tasks.TypeFill, tasks.TypeUnit)}
			f.maxRetry, _ = asynq.GetMaxRetry(ctx)
			if d, ok := ctx.Deadline(); ok {
				f.timeout = d.Sub(start).Round(time.Second)
			}
			// The check and the record are one step under mu, which
			// Changed also takes: a delivery either is remembered before
			// a change collects what to copy, or sees the change.
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.epoch != epoch {
				return fmt.Errorf("%w: %s", ErrRedisChanged, id)
			}
			f.at = r.now().UnixNano()
			r.remember(f)
			return nil
		})
	}
}

// remember appends f and forgets what is past the window or the bounds.
// r.mu is held.
func (r *Rerun) remember(f finished) {
	r.done = append(r.done, f)
	r.bytes += len(f.payload)
	for r.head < len(r.done) {
		o := r.done[r.head]
		if time.Duration(f.at-o.at) <= r.opts.Window && r.bytes <= r.opts.MaxBytes && len(r.done)-r.head <= r.opts.MaxTasks {
			break
		}
		r.bytes -= len(o.payload)
		r.done[r.head] = finished{}
		r.head++
	}
	if r.head > len(r.done)/2 && r.head > 1024 {
		r.done = append(r.done[:0], r.done[r.head:]...)
		r.head = 0
	}
}

// Changed reports that the Redis master's run ID went from oldID to
// newID: another server. It never blocks on Redis, since it runs in a
// connection's setup: the copies are queued by a goroutine of their own,
// which Wait waits for.
func (r *Rerun) Changed(oldID, newID string) {
	r.mu.Lock()
	r.epoch++
	var copies []finished
	now := r.now().UnixNano()
	for _, f := range r.done[r.head:] {
		if time.Duration(now-f.at) <= r.opts.Window+rerunNotice {
			copies = append(copies, f)
		}
	}
	r.done, r.head, r.bytes = nil, 0, 0
	r.mu.Unlock()
	tag := "rerun-" + short(newID)
	r.log.Warn("redis master changed: the solves finished just before run again", "old_run_id", short(oldID), "new_run_id", short(newID), "tasks", len(copies))
	if len(copies) == 0 {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.enqueue(copies, tag)
	}()
}

// rerunNotice bounds how long after its master's death a change is
// noticed: Sentinel's down-after (30 s by default) and its election, and
// the worker's next connection. Solves remembered from before that (a
// worker idle since) were replicated long before the master died.
const rerunNotice = 2 * time.Minute

// rerunAttempts and rerunPause bound how long a copy is retried while
// the new master still refuses: a minute.
const (
	rerunAttempts = 30
	rerunPause    = 2 * time.Second
)

// enqueue queues a copy of each of fs (tasks.RedriveTask, under
// tasks.RedriveID(id, tag)). A copy already queued for this change counts
// as queued.
func (r *Rerun) enqueue(fs []finished, tag string) {
	queued, left := 0, fs
	for attempt := 0; attempt < rerunAttempts && len(left) > 0; attempt++ {
		if attempt > 0 {
			time.Sleep(rerunPause)
		}
		var failed []finished
		var lastErr error
		for _, f := range left {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := r.enq.EnqueueContext(ctx, tasks.RedriveTask(&asynq.TaskInfo{ID: f.id, Queue: f.queue, Type: f.typ,
				Payload: f.payload, MaxRetry: f.maxRetry, Timeout: f.timeout}, tag))
			cancel()
			switch {
			case err == nil, errors.Is(err, asynq.ErrTaskIDConflict):
				queued++
			default:
				failed = append(failed, f)
				lastErr = err
			}
		}
		if len(failed) > 0 {
			r.log.Warn("redis master changed: queueing the solves to run again failed; trying again", "failed", len(failed), "err", lastErr)
		}
		left = failed
	}
	if len(left) > 0 {
		ids := make([]string, 0, min(len(left), 20))
		for _, f := range left[:cap(ids)] {
			ids = append(ids, f.id)
		}
		r.log.Error("redis master changed: some solves finished just before could not be queued to run again",
			"not_queued", len(left), "first_task_ids", ids)
	}
	r.log.Info("redis master changed: solves queued to run again", "queued", queued)
}

// Wait waits for the copies Changed is queueing.
func (r *Rerun) Wait() { r.wg.Wait() }

// short is a run ID's first 12 characters, enough to tell masters apart
// in a log.
func short(runID string) string {
	if len(runID) > 12 {
		return runID[:12]
	}
	return runID
}
