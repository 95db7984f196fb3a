// Package recovery holds the loops that every API replica runs beside
// request handling, so that no process's death loses work: the Watchdog
// re-drives a dead worker's tasks within seconds (tasks.RedriveTask), and the
// Reconciler finishes interrupted enqueues of batch units, keeps the bulk
// queue fed and enqueues due webhook deliveries. Each pass runs under a
// short Redis lease, so one replica does it at a time.
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

	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// FeedStore is what the Reconciler needs of the record store: the feed
// of units waiting to be enqueued and the set of units being enqueued
// (docs/batches.md); *store.Store satisfies it.
type FeedStore interface {
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)
	// StaleFed lists units taken from the feed before before and never
	// acknowledged.
	StaleFed(ctx context.Context, before time.Time, limit int) ([]tasks.UnitRef, error)
	worker.Feeder
}

// ReconcilerOptions tune a Reconciler.
type ReconcilerOptions struct {
	// Interval is how often the reconciler looks for interrupted
	// enqueues. Default 1s.
	Interval time.Duration
	// Grace is how long a unit may sit between being taken from the feed
	// and being acknowledged before the reconciler enqueues it again, so
	// it does not race the feeder that is still enqueueing it (which
	// would be harmless, only wasted work: the unit's fixed task ID makes
	// one task of both). Every feeder enqueues and acknowledges what it
	// took in one script per 256 units (worker.Feeder's EnqueueFed),
	// milliseconds after it took them, so a second is ample unless
	// FEED_DEPTH is in the tens of thousands. Default 1s.
	Grace time.Duration
	// FeedDepth is how many units the bulk queue may hold waiting
	// (FEED_DEPTH, whose default is stated there); the reconciler tops it
	// up to that. Required: NewReconciler panics without it.
	FeedDepth int
	// Webhooks, when set, is where the reconciler finds completion
	// webhooks whose task or batch has ended, to enqueue their delivery
	// (WebhookOptions shape it).
	Webhooks       WatchedWebhooks
	WebhookOptions tasks.WebhookOptions
}

// WatchedWebhooks is the store's set of watched webhooks (store/webhooks.go);
// *store.Store satisfies it.
type WatchedWebhooks interface {
	// DueWebhooks returns watched refs whose record has ended, looking at
	// up to limit from offset; next is where to look from next time.
	DueWebhooks(ctx context.Context, offset, limit int) (due []tasks.WebhookPayload, next int, err error)
	// AckWebhook unwatches webhooks whose delivery is enqueued, and
	// counts them in their key's delivery backlog.
	AckWebhook(ctx context.Context, due ...tasks.WebhookPayload) error
}

// webhookPage is how many watched webhooks one pass looks at; a larger
// set is looked at a page per pass, round the set.
const webhookPage = 1000

// reconcileLease names the lease that lets one API replica at a time
// re-enqueue stale units. The name is stored in Redis, where replicas of
// every release must agree on it during a rolling upgrade, so it keeps
// its value "outbox" though the loop is the Reconciler.
const reconcileLease = "outbox"

// staleBatch bounds the stale units one pass re-enqueues; more wait for
// the next pass, a second later.
const staleBatch = 500

// Reconciler keeps batches running whatever process dies: every API
// replica runs one. Each pass
//
//   - re-enqueues units that a feeder took from the feed and never
//     acknowledged more than Grace ago (it died between the two, its
//     enqueue failed, or the unit's task was still running), under a
//     short Redis lease so that one replica does it. Units have fixed
//     asynq task IDs, so a unit already queued is not queued twice;
//   - feeds the bulk queue from the feed up to FeedDepth, so a batch whose
//     API died right after its commit, before it fed anything, runs, and
//     a batch keeps being fed when no worker is finishing units.
//
// With the defaults an interrupted enqueue is finished within about
// Grace + Interval (2 s) while any replica runs.
type Reconciler struct {
	store  FeedStore
	enq    Enqueuer
	log    *slog.Logger
	opts   ReconcilerOptions
	holder string
	// whOffset is where the next pass looks into the watched webhooks.
	whOffset int
}

// NewReconciler returns a Reconciler; Run runs it.
func NewReconciler(st FeedStore, enq Enqueuer, log *slog.Logger, o ReconcilerOptions) *Reconciler {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Grace <= 0 {
		o.Grace = time.Second
	}
	if o.FeedDepth <= 0 {
		panic(fmt.Sprintf("recovery: ReconcilerOptions.FeedDepth must be positive, got %d", o.FeedDepth))
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Reconciler{store: st, enq: enq, log: log.With("component", "feed_reconciler"), opts: o, holder: hex.EncodeToString(b[:])}
}

// Run reconciles every Interval until ctx ends. A pass still running when
// ctx ends stops between enqueues; what it took and did not acknowledge
// is stale for the next holder.
func (r *Reconciler) Run(ctx context.Context) {
	every(ctx, r.opts.Interval, r.log, "reconcile pass failed", r.RunOnce)
}

// Enqueuer puts a task on its queue; *asynq.Client satisfies it. The
// reconciler enqueues webhook deliveries and stale units with it, the
// watchdog re-drives with it.
type Enqueuer interface {
	EnqueueContext(ctx context.Context, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error)
}

// failureLogEvery is how often a run of failed passes is logged again: a
// Redis that refuses writes for minutes fails every pass, and one line a
// pass would bury the log.
const failureLogEvery = time.Minute

// every runs pass at once and then every interval until ctx ends, logging
// a failed pass (one that ctx's end did not cause) as msg: the loop of
// each replica's background passes (the Reconciler, the Watchdog). A run
// of failures logs its first pass, then once per failureLogEvery with the
// count of failed passes, and its end.
func every(ctx context.Context, interval time.Duration, log *slog.Logger, msg string, pass func(context.Context) (int, error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var failed int
	var logged time.Time
	for {
		_, err := pass(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			failed++
			if failed == 1 || time.Since(logged) >= failureLogEvery {
				log.Warn(msg, "err", err, "failed_passes", failed)
				logged = time.Now()
			}
		case err == nil && failed > 0:
			log.Info(msg+": passes succeed again", "failed_passes", failed)
			failed = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunOnce makes one pass and returns how many units it enqueued.
//
// An idle pass costs two reads and writes nothing the AOF would keep: the
// stale units' range read, and the feed script, which writes only when it
// takes a unit. The lease is taken only when there are stale units: two
// replicas re-enqueueing the same units would be harmless but doubled
// work. Feeding needs no lease: the feed script moves each unit once,
// atomically, so replicas feeding at once take different units, as the
// API and the workers already do.
func (r *Reconciler) RunOnce(ctx context.Context) (int, error) {
	if r.opts.Webhooks != nil {
		if err := r.webhooks(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("webhook pass failed", "err", err)
		}
	}
	total := 0
	// Stale units page by page, so that a feeder that died holding
	// thousands (a batch fed whole with a deep FEED_DEPTH) is finished in
	// this pass, not one page a second.
	for {
		stale, err := r.store.StaleFed(ctx, time.Now().Add(-r.opts.Grace), staleBatch)
		if err != nil || len(stale) == 0 {
			if err != nil {
				return total, err
			}
			break
		}
		// The lease outlives a few passes, so a holder that died is
		// replaced within 3 intervals, and a live one keeps it by
		// renewing.
		ok, err := r.store.AcquireLease(ctx, reconcileLease, r.holder, 3*r.opts.Interval)
		if err != nil || !ok {
			return total, err
		}
		n, err := r.enqueueStale(ctx, stale)
		total += n
		if err != nil {
			return total, err
		}
		r.log.Info("re-enqueued units whose feeder died", "units", n)
		if len(stale) < staleBatch || n < len(stale) {
			// The rest (or units still running, which the store does
			// not acknowledge yet) wait for the next pass.
			break
		}
	}
	// Then top the queues up, the cheap lane's and the solvers'. Feed
	// stops by itself once a queue holds FeedDepth units; the bound keeps
	// a pass finite while workers drain the queue as fast as it is fed.
	for _, q := range []string{tasks.QueueCheapBulk, tasks.QueueBulk} {
		for fed := 0; fed < r.opts.FeedDepth; {
			n, err := worker.FeedQueue(ctx, r.store, q, r.opts.FeedDepth, r.opts.FeedDepth)
			total += n
			if err != nil {
				return total, err
			}
			if n == 0 {
				break
			}
			fed += n
		}
	}
	return total, nil
}

// enqueueStale enqueues units whose feeder died, each on its lane's bulk
// queue (tasks.UnitQueue), and returns how many it acknowledged.
func (r *Reconciler) enqueueStale(ctx context.Context, stale []tasks.UnitRef) (int, error) {
	byQueue := map[string][]tasks.UnitRef{}
	for _, u := range stale {
		q := tasks.UnitQueue(u.Unit)
		byQueue[q] = append(byQueue[q], u)
	}
	total := 0
	for _, q := range []string{tasks.QueueCheapBulk, tasks.QueueBulk} {
		if len(byQueue[q]) == 0 {
			continue
		}
		n, err := r.store.EnqueueFed(ctx, q, byQueue[q])
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// webhooks enqueues the delivery of every watched webhook whose task or
// batch has ended, then unwatches it: a crash between the two leaves it
// watched, and the next pass (of any replica) enqueues it again, which the
// fixed task ID makes a no-op when it had landed. No lease is needed for
// the same reason.
func (r *Reconciler) webhooks(ctx context.Context) error {
	due, next, err := r.opts.Webhooks.DueWebhooks(ctx, r.whOffset, webhookPage)
	if err != nil {
		return err
	}
	r.whOffset = next
	var landed []tasks.WebhookPayload
	var firstErr error
	for _, d := range due {
		t, err := tasks.NewWebhookTask(d, r.opts.WebhookOptions)
		if err == nil {
			_, err = r.enq.EnqueueContext(ctx, t)
		}
		if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
			if firstErr == nil {
				firstErr = fmt.Errorf("enqueue webhook %s: %w", d.Ref, err)
			}
			continue
		}
		landed = append(landed, d)
	}
	if err := r.opts.Webhooks.AckWebhook(context.WithoutCancel(ctx), landed...); err != nil {
		return errors.Join(firstErr, err)
	}
	if len(landed) > 0 {
		r.log.Debug("webhook deliveries enqueued", "webhooks", len(landed))
	}
	return firstErr
}
