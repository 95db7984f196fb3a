package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/tracing"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// batchStore is what POST /v1/batches needs of the store beyond the
// idempotency claims: staging, committing and feeding (docs/batches.md).
type batchStore interface {
	NewBatchWriter(id string, stride int) *store.BatchWriter
	CommitBatch(ctx context.Context, w *store.BatchWriter, cb store.CommitBatch) error
	AbandonCommit(ctx context.Context, w *store.BatchWriter, cb store.CommitBatch) (int, error)
	worker.Feeder
}

// createBatch accepts a batch: it stages the body's items as they arrive
// (ingest), claims the Idempotency-Key once the body's hash is known,
// commits the batch in one script and feeds the bulk queue. Once the
// commit succeeded every unit is in the feed, so the 202 holds whatever
// dies next: what this request does not enqueue, the workers and the
// reconciler feed.
//
// The claim comes after the body, not before: its hash needs the whole
// body, and a claim taken on the key alone would have to be released by
// every failed upload anyway. So a replay answers only for a batch that
// is complete, or committing right now (replayBatch waits for that).
func (s *Server) createBatch(c *gin.Context) {
	ctx, owner := c.Request.Context(), ownerOf(c)
	key := c.GetHeader("Idempotency-Key")
	if len(key) > 200 || strings.ContainsAny(key, " \t\r\n") {
		fail(c, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "Idempotency-Key", "Idempotency-Key must be at most 200 characters without spaces"))
		return
	}
	hook, err := s.queryWebhook(c)
	if err != nil {
		fail(c, err)
		return
	}
	batchID := newID()
	w := s.store.NewBatchWriter(batchID, s.opts.ChunkSize)
	// Every failure below leaves nothing: the staged chunks go (they
	// would expire anyway), and so does the claim unless it may be the
	// batch's now.
	committed, claimed, hash := false, false, ""
	unwatch := func(context.Context) {}
	defer func() {
		if committed {
			return
		}
		claimed := claimed
		s.undo(ctx, func(dctx context.Context) {
			unwatch(dctx)
			if err := w.Discard(dctx); err != nil {
				s.log.Warn("discard staged batch", "batch_id", batchID, "err", err)
			}
			if claimed {
				_ = s.store.ReleaseIdempotency(dctx, owner, key, batchID, hash)
			}
		})
	}()
	ictx, span := tracing.Start(ctx, s.opts.Tracer, "batch.ingest")
	if span.IsRecording() {
		// The staging's Redis calls take the request's context.
		c.Request = c.Request.WithContext(ictx)
	}
	in, err := s.ingest(c, w, key != "")
	if span.IsRecording() {
		c.Request = c.Request.WithContext(ctx)
	}
	tracing.Fail(span, err)
	if err == nil && span.IsRecording() {
		span.SetAttributes(attribute.Int("puzzleq.batch.items", w.Total()))
	}
	span.End()
	if err != nil {
		fail(c, err)
		return
	}
	if in.Webhook != nil {
		if hook != "" {
			fail(c, errTwoWebhooks)
			return
		}
		if err := s.checkWebhook(ctx, *in.Webhook); err != nil {
			fail(c, err)
			return
		}
		hook = *in.Webhook
	} else if hook != "" && in.Hash != "" {
		// The query's webhook is part of the request an Idempotency-Key
		// names, as the body's is: a retry with another one is another
		// request.
		sum := sha256.Sum256([]byte(in.Hash + "\nwebhook " + hook))
		in.Hash = hex.EncodeToString(sum[:])
	}
	if key != "" {
		hash = in.Hash
		ok, prevID, prevHash, err := s.store.ClaimIdempotency(ctx, owner, key, batchID, in.Hash)
		if err != nil {
			fail(c, err)
			return
		}
		if !ok {
			if prevHash != in.Hash {
				fail(c, newError(http.StatusUnprocessableEntity, apitype.CodeIdempotencyKeyReused, "Idempotency-Key",
					"this Idempotency-Key was used for a different request body"))
				return
			}
			s.replayBatch(c, prevID)
			return
		}
		claimed = true
	}
	// The webhook is recorded before the batch, so that it is there
	// whenever the batch ends; a commit that fails forgets it.
	if unwatch, err = s.watchWebhook(ctx, store.WebhookRef(true, batchID), hook); err != nil {
		unwatch = func(context.Context) {}
		fail(c, err)
		return
	}
	cb := store.CommitBatch{ID: batchID, Owner: owner, Format: in.Format, BodyHash: in.Hash, Quota: s.quotaFor(c)}
	if claimed {
		cb.IdempotencyKey = key
	}
	cctx, commit := tracing.StartKind(ctx, s.opts.Tracer, "batch.commit", trace.SpanKindProducer)
	traced := commit.IsRecording()
	err = s.store.CommitBatch(cctx, w, cb)
	tracing.Fail(commit, err)
	commit.End()
	switch {
	case err == nil:
	case errors.Is(err, store.ErrNotReplicated):
		// Committed on the master, not confirmed by its replicas in
		// time: the batch stays (workers and the reconciler feed it),
		// and the 503 asks for a retry, which the Idempotency-Key
		// answers with this batch once a replica confirms it.
		committed = true
		fail(c, err)
		return
	case errors.Is(err, store.ErrQuota):
		fail(c, s.quotaError(c))
		return
	case errors.Is(err, store.ErrClaimLost):
		// This request outlived its claim, which may be another
		// request's now: it is not ours to release. The retry will
		// replay or claim.
		claimed = false
		c.Header("Retry-After", "1")
		fail(c, newError(http.StatusConflict, apitype.CodeInProgress, "Idempotency-Key",
			"this request took longer than its Idempotency-Key claim; retry shortly"))
		return
	case errors.Is(err, store.ErrStagedGone):
		// Nothing committed: the staged items expired or a chunk's
		// write was lost. The client may send the batch again.
		fail(c, err)
		return
	default:
		// The script may have run and only its reply been lost. Undo it
		// (record, feed, quota, claim) unless a unit has been fed (a
		// worker or the reconciler fed it): then the batch runs, and it
		// is accepted.
		undone, aerr := s.store.AbandonCommit(context.WithoutCancel(ctx), w, cb)
		switch {
		case aerr != nil:
			// Unknown still: keep everything, so that a batch that did
			// commit is whole. The staged keys and an uncommitted claim
			// expire on their own.
			committed = true
			s.log.Warn("batch commit outcome unknown", "batch_id", batchID, "err", err, "abandon_err", aerr)
			fail(c, err)
			return
		case undone != store.BatchKept:
			fail(c, err)
			return
		}
		if err := s.store.Confirm(ctx); err != nil {
			committed = true
			fail(c, err)
			return
		}
		s.log.Info("batch commit reply lost, but the batch is being fed: accepted", "batch_id", batchID, "err", err)
	}
	committed = true
	if traced {
		// The units run later, each in a trace of its own: they link to
		// the commit's span (a unit fed before this write lands has no
		// link, which only tracing loses).
		tp, ts := tracing.Inject(cctx)
		if err := s.store.SetBatchTrace(ctx, batchID, tp, ts); err != nil {
			s.log.Debug("tracing: the batch's trace context was not recorded", "batch_id", batchID, "err", err)
		}
	}
	for k, n := range in.Kinds {
		s.metrics.submitted.WithLabelValues(string(k)).Add(float64(n))
	}
	s.feedAfterCommit(ctx, batchID)
	c.Header("Location", "/v1/batches/"+batchID)
	c.JSON(http.StatusAccepted, batchCreated(batchID, w.Total()))
}

// batchCreated is the 202 of a batch: the items' IDs are listed up to
// apitype.MaxListedIDs, derived (apitype.ItemID) beyond.
func batchCreated(id string, total int) apitype.BatchCreated {
	res := apitype.BatchCreated{ID: id, Total: total}
	if total <= apitype.MaxListedIDs {
		res.TaskIDs = make([]string, total)
		for i := range res.TaskIDs {
			res.TaskIDs[i] = apitype.ItemID(id, i)
		}
	}
	return res
}

// undoGrace is how long a failed request waits for its undo (see undo)
// before it answers.
const undoGrace = 100 * time.Millisecond

// undo runs fn, the cleanup of a request that failed, on a context the
// client leaving does not end, bounded by RequestTimeout. It waits for
// fn up to undoGrace: on a healthy Redis the cleanup takes milliseconds
// and is done before the answer, as a client retrying at once expects;
// on a hung one the 503 does not wait for it (a batch upload answered
// after 4 s instead of 2 s, the discard of its staged chunk being the
// second call to time out), and it ends on its own. What it fails to
// undo expires (staged keys, claims, quota units).
func (s *Server) undo(ctx context.Context, fn func(ctx context.Context)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.RequestTimeout)
		defer cancel()
		fn(uctx)
	}()
	t := time.NewTimer(undoGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// replayBatch answers a retried submission with the batch the first one
// created, so a client that lost the response does not double the work.
// The claim is taken only once a body is complete, so the first request
// is committing it; wait a little for that.
func (s *Server) replayBatch(c *gin.Context, id string) {
	ctx := c.Request.Context()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := s.store.GetBatch(ctx, id)
		if err == nil && b.Owner == ownerOf(c) {
			// The first request's commit may be on the master alone.
			if err := s.store.Confirm(ctx); err != nil {
				fail(c, err)
				return
			}
			c.Header("Location", "/v1/batches/"+id)
			c.Header("Idempotent-Replayed", "true")
			c.JSON(http.StatusAccepted, batchCreated(id, b.Total))
			return
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			fail(c, err)
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.Header("Retry-After", "1")
			fail(c, newError(http.StatusConflict, apitype.CodeInProgress, "Idempotency-Key",
				"a request with this Idempotency-Key is still being processed; retry shortly"))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// feedAfterCommit moves units from the feeds onto the bulk queues (the
// solvers' and the cheap lane's) right after a commit, so that a new
// batch starts without waiting for a worker or the reconciler. The
// client leaving does not stop it, and a failure is only logged: the
// batch is accepted, and the others feed it.
func (s *Server) feedAfterCommit(ctx context.Context, batchID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.RequestTimeout)
	defer cancel()
	for _, q := range []string{tasks.QueueCheapBulk, tasks.QueueBulk} {
		n, err := worker.FeedQueue(ctx, s.store, q, s.opts.FeedDepth, s.opts.FeedDepth)
		if err != nil {
			s.log.Warn("feeding a bulk queue after a commit was interrupted; workers and the reconciler feed the rest",
				"batch_id", batchID, "queue", q, "fed", n, "err", err)
		}
	}
}

func (s *Server) createTask(c *gin.Context) {
	wait, err := s.parseWait(c)
	if err != nil {
		fail(c, err)
		return
	}
	hook, err := s.queryWebhook(c)
	if err != nil {
		fail(c, err)
		return
	}
	_, admit := tracing.Start(c.Request.Context(), s.opts.Tracer, "task.admit")
	body, err := s.readBody(c, s.opts.MaxBodyBytes)
	tracing.Fail(admit, err)
	admit.End()
	if err != nil {
		fail(c, err)
		return
	}
	inBody, found, body, err := splitWebhook(body)
	if err != nil {
		fail(c, err)
		return
	}
	p, err := puzzle.Decode(body)
	if err != nil {
		fail(c, err)
		return
	}
	ctx := c.Request.Context()
	if found {
		if hook != "" {
			fail(c, errTwoWebhooks)
			return
		}
		if err := s.checkWebhook(ctx, inBody); err != nil {
			fail(c, err)
			return
		}
		hook = inBody
	}
	owner := ownerOf(c)
	id := newID()
	key := p.Key()
	if hook == "" && s.hits.has(key) {
		// Seen cached here before: the short hit path, which on a miss
		// writes nothing and leaves the submission to the full one.
		cctx, span := tracing.Start(ctx, s.opts.Tracer, "task.cached")
		hit, created, err := s.store.SubmitCached(cctx, store.NewTask{ID: id, Kind: string(p.Kind()), Owner: owner, CacheKey: key})
		tracing.Fail(span, err)
		span.End()
		if err != nil {
			fail(c, err)
			return
		}
		if hit != nil {
			s.answerHit(c, id, p.Kind(), hit, created, nil)
			return
		}
		s.hits.forget(key)
	}
	// The enqueue's span is the worker's parent: its context goes in the
	// payload.
	qctx, enqueue := tracing.StartKind(ctx, s.opts.Tracer, "task.enqueue", trace.SpanKindProducer)
	defer enqueue.End()
	tp, ts := "", ""
	if enqueue.IsRecording() {
		tp, ts = tracing.Inject(qctx)
		enqueue.SetAttributes(attribute.String("puzzleq.task.id", id), attribute.String("puzzleq.kind", string(p.Kind())),
			attribute.String("messaging.destination.name", tasks.SingleQueue(p)))
	}
	q, err := asynqdata.SolveTraced(id, owner, p, tasks.SingleQueue(p), s.opts.Limits, time.Now(), tp, ts)
	if err != nil {
		fail(c, err)
		return
	}
	unwatch, err := s.watchWebhook(ctx, store.WebhookRef(false, id), hook)
	if err != nil {
		fail(c, err)
		return
	}
	var (
		wake    *store.Wake
		release func()
	)
	if wait > 0 {
		// Subscribed before the task is queued, so it cannot end unseen;
		// the record is the one about to be written, so it need not be
		// read.
		wake, release = s.waiter.Subscribe(store.TaskEventKey(id))
	}
	// One round trip answers from the cache, or admits the task against
	// the owner's quota, records it and queues it, all or nothing: a
	// failure leaves nothing to undo.
	hit, created, err := s.store.SubmitTask(qctx, store.NewTask{ID: id, Kind: string(p.Kind()), Owner: owner, CacheKey: key, Enqueue: q}, s.quotaFor(c))
	tracing.Fail(enqueue, err)
	if hit != nil && enqueue.IsRecording() {
		enqueue.SetAttributes(attribute.Bool("puzzleq.cached", true))
	}
	enqueue.End()
	if (err != nil || hit != nil) && release != nil {
		release()
	}
	if errors.Is(err, store.ErrQuota) {
		err = s.quotaError(c)
	}
	if err != nil {
		if !errors.Is(err, store.ErrNotReplicated) {
			// An unconfirmed submission is on the master and runs:
			// its webhook stays.
			s.undo(ctx, unwatch)
		}
		fail(c, err)
		return
	}
	var wh *apitype.Webhook
	if hook != "" {
		wh = &apitype.Webhook{URL: hook}
	}
	if hit != nil {
		s.hits.add(key)
		s.answerHit(c, id, p.Kind(), hit, created, wh)
		return
	}
	s.metrics.submitted.WithLabelValues(string(p.Kind())).Inc()
	tr := apitype.Task{ID: id, Kind: string(p.Kind()), State: apitype.TaskStatePending, CreatedAt: &created, Webhook: wh}
	c.Header("Location", "/v1/tasks/"+id)
	if wait > 0 {
		// Submit and wait in one request: 200 with the ended task, or 202
		// with its state when the wait runs out first.
		cur := &store.Task{ID: id, Kind: tr.Kind, Owner: owner, State: apitype.TaskStatePending, CreatedAt: created, Webhook: tr.Webhook}
		wctx, span := tracing.Start(ctx, s.opts.Tracer, "task.wait")
		rec, err := s.waitTask(wctx, cur, wait, wake, release)
		endWait(span, rec, err)
		if err != nil {
			fail(c, err)
			return
		}
		status := http.StatusAccepted
		if rec.State.Terminal() {
			status = http.StatusOK
		}
		r := resource(rec)
		renderTask(c, status, &r)
		return
	}
	renderTask(c, http.StatusAccepted, &tr)
}

// answerHit answers a submission recorded completed from the cache.
func (s *Server) answerHit(c *gin.Context, id string, kind puzzle.Kind, hit json.RawMessage, created time.Time, wh *apitype.Webhook) {
	s.metrics.submitted.WithLabelValues(string(kind)).Inc()
	s.metrics.cacheHits.Inc()
	if s.opts.History != nil {
		s.opts.History.Ended(ownerOf(c), true, 1, created.UnixMilli())
	}
	renderTask(c, http.StatusOK, &apitype.Task{ID: id, Kind: string(kind), State: apitype.TaskStateCompleted,
		Result: hit, Cached: true, CreatedAt: &created, CompletedAt: &created, Webhook: wh})
}
