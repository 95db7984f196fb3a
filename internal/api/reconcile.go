package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"time"

	"github.com/puzzleq/puzzleq/tasks"
)

// OutboxStore is what the Reconciler needs of the record store;
// *store.Store satisfies it.
type OutboxStore interface {
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)
	OutboxBatches(ctx context.Context, before time.Time, limit int) ([]string, error)
	OutboxUnits(ctx context.Context, batchID string) (idx []int, units []tasks.Unit, bad []int, err error)
	AckOutbox(ctx context.Context, batchID string, idx []int) (int, error)
}

// ReconcilerOptions tune a Reconciler.
type ReconcilerOptions struct {
	// Interval is how often the reconciler looks for interrupted
	// enqueues. Default 1s.
	Interval time.Duration
	// Grace is how old a batch's outbox must be before the reconciler
	// touches it, so it does not race the API that is still enqueueing
	// the batch (which would be harmless, only wasted work). Default 2s.
	Grace time.Duration
	// Parallelism bounds concurrent enqueues. Default 8.
	Parallelism int
}

// reconcileLease names the lease that lets one API replica at a time
// reconcile.
const reconcileLease = "outbox"

// Reconciler finishes batch enqueues that an API process did not: every
// API replica runs one, and the one holding a short Redis lease enqueues
// whatever the outbox of a batch older than Grace still holds. Units have
// fixed asynq task IDs, so a unit the dead process did enqueue is not
// queued twice. With the defaults a batch whose API died is fully queued
// within about Grace + Interval (3 s), while any replica runs.
type Reconciler struct {
	store  OutboxStore
	enq    Enqueuer
	log    *slog.Logger
	opts   ReconcilerOptions
	holder string
}

// NewReconciler returns a Reconciler; Run runs it.
func NewReconciler(st OutboxStore, enq Enqueuer, log *slog.Logger, o ReconcilerOptions) *Reconciler {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Grace <= 0 {
		o.Grace = 2 * time.Second
	}
	if o.Parallelism <= 0 {
		o.Parallelism = 8
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Reconciler{store: st, enq: enq, log: log.With("component", "outbox_reconciler"), opts: o, holder: hex.EncodeToString(b[:])}
}

// Run reconciles every Interval until ctx ends. A pass still running when
// ctx ends stops between enqueues; what it did not finish stays in the
// outbox for the next holder.
func (r *Reconciler) Run(ctx context.Context) {
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	for {
		if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("reconcile pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunOnce makes one pass, if this replica holds (or can take) the lease,
// and returns how many units it enqueued.
func (r *Reconciler) RunOnce(ctx context.Context) (int, error) {
	// Look before taking the lease: an idle pass is one read, and writes
	// nothing that the AOF would have to keep.
	batches, err := r.store.OutboxBatches(ctx, time.Now().Add(-r.opts.Grace), 100)
	if err != nil || len(batches) == 0 {
		return 0, err
	}
	// The lease outlives a few passes, so a holder that died is replaced
	// within 3 intervals, and a live one keeps it by renewing.
	ok, err := r.store.AcquireLease(ctx, reconcileLease, r.holder, 3*r.opts.Interval)
	if err != nil || !ok {
		return 0, err
	}
	total := 0
	for _, id := range batches {
		idx, units, bad, err := r.store.OutboxUnits(ctx, id)
		if err != nil {
			return total, err
		}
		if len(bad) > 0 {
			// Written by this code, so never expected; retrying cannot help.
			r.log.Error("dropping undecodable outbox units", "batch_id", id, "units", len(bad))
		}
		if len(units) == 0 {
			if _, err := r.store.AckOutbox(ctx, id, bad); err != nil {
				return total, err
			}
			continue
		}
		n, err := enqueueUnits(ctx, r.enq, r.store.AckOutbox, id, idx, units, r.opts.Parallelism)
		total += n
		if len(bad) > 0 {
			if _, aerr := r.store.AckOutbox(ctx, id, bad); aerr != nil && err == nil {
				err = aerr
			}
		}
		if err != nil {
			return total, err
		}
		r.log.Info("finished an interrupted batch enqueue", "batch_id", id, "units", n)
	}
	return total, nil
}
