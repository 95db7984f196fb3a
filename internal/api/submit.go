package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/gin-gonic/gin"
	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// submitBatch accepts a decoded batch. It builds the queued tasks (cheap
// items grouped into chunks, expensive ones one task each, all on the bulk
// queue), writes the batch's records and those tasks (its outbox) in one
// step, and then enqueues them. Once that write succeeded the batch is
// accepted whatever happens next: a unit this request fails to enqueue,
// because Redis hiccupped or the process died, is enqueued by a
// reconciler (see Reconciler), so the 202 is never a lie.
//
// idemKey, when set, is the Idempotency-Key this request claimed for
// batchID with bodyHash. The claim is released when nothing was written,
// so a retry can try again at once, and kept when the write's outcome is
// unknown: it then either became the batch's or it expires within a
// minute.
func (s *Server) submitBatch(c *gin.Context, batchID, format string, reqs []*puzzle.Parsed, idemKey, bodyHash string) ([]string, error) {
	ctx, owner := c.Request.Context(), ownerOf(c)
	written := false
	defer func() {
		if idemKey != "" && !written {
			_ = s.store.ReleaseIdempotency(context.WithoutCancel(ctx), owner, idemKey, batchID, bodyHash)
		}
	}()
	keys := make([]string, len(reqs))
	for i, p := range reqs {
		keys[i] = p.Key()
	}
	hits, err := s.store.CachedResults(ctx, keys)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(reqs))
	items := make([]store.NewTask, len(reqs))
	for i, p := range reqs {
		ids[i] = newID()
		items[i] = store.NewTask{ID: ids[i], Kind: string(p.Kind()), Owner: owner, CacheKey: keys[i], Result: hits[i]}
	}
	units, err := s.batchUnits(batchID, owner, reqs, ids, hits)
	if err != nil {
		return nil, err
	}
	// One script records the batch, counts it against the quota and
	// writes its outbox.
	nb := store.NewBatch{ID: batchID, Owner: owner, Format: format, Units: units, IdempotencyKey: idemKey,
		BodyHash: bodyHash, Quota: s.quotaFor(c)}
	if err := s.store.CreateBatch(ctx, nb, items); err != nil {
		switch {
		case errors.Is(err, store.ErrQuota):
			return nil, s.quotaError(c)
		case errors.Is(err, store.ErrClaimLost):
			// Nothing written: this request outlived its claim, which may
			// be another request's now. The retry will replay or claim.
			written = true
			c.Header("Retry-After", "1")
			return nil, newError(http.StatusConflict, apitype.CodeInProgress, "Idempotency-Key",
				"this request took longer than its Idempotency-Key claim; retry shortly")
		}
		// The script may have run and only its reply been lost. Undo it
		// (records, outbox, quota and claim), so a failed request leaves
		// nothing behind, unless its enqueue has begun (a reconciler found
		// it): then it will run, and a retry with the same key replays it.
		if undone, aerr := s.store.AbandonBatch(context.WithoutCancel(ctx), nb, items); aerr != nil || undone == store.BatchKept {
			written = true // the claim, if the batch was written, is its
		}
		return nil, err
	}
	written = true
	for i, p := range reqs {
		if hits[i] != nil {
			s.metrics.cacheHits.Inc()
		}
		s.metrics.submitted.WithLabelValues(string(p.Kind())).Inc()
	}

	// The client leaving does not stop the enqueue: the batch is accepted.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.RequestTimeout)
	defer cancel()
	idx := make([]int, len(units))
	for i := range idx {
		idx[i] = i
	}
	if n, err := enqueueUnits(ectx, s.enq, s.store.AckOutbox, batchID, idx, units, s.opts.EnqueueParallelism); err != nil {
		s.log.Warn("batch enqueue interrupted; the outbox reconciler will finish it",
			"batch_id", batchID, "units", len(units), "enqueued", n, "err", err)
	}
	return ids, nil
}

// batchUnits builds the queued tasks of a batch: the items answered from
// the cache need none, cheap ones share chunks of ChunkSize, and each
// expensive one gets its own so that they spread over workers.
func (s *Server) batchUnits(batchID, owner string, reqs []*puzzle.Parsed, ids []string, hits []json.RawMessage) ([]tasks.Unit, error) {
	var (
		units     []tasks.Unit
		chunkIDs  []string
		chunkReqs []*puzzle.Parsed
		chunks    int
	)
	flushChunk := func() error {
		if len(chunkIDs) == 0 {
			return nil
		}
		u, err := tasks.NewChunkUnit(batchID, owner, chunks, chunkIDs, chunkReqs, tasks.QueueBulk, s.opts.Limits)
		if err != nil {
			return err
		}
		units = append(units, u)
		chunks++
		chunkIDs, chunkReqs = nil, nil
		return nil
	}
	for i, p := range reqs {
		if hits[i] != nil {
			continue
		}
		if !p.Cheap() {
			u, err := tasks.NewSolveUnit(ids[i], batchID, owner, p, tasks.QueueBulk, s.opts.Limits)
			if err != nil {
				return nil, err
			}
			units = append(units, u)
			continue
		}
		chunkIDs = append(chunkIDs, ids[i])
		chunkReqs = append(chunkReqs, p)
		if len(chunkIDs) == s.opts.ChunkSize {
			if err := flushChunk(); err != nil {
				return nil, err
			}
		}
	}
	if err := flushChunk(); err != nil {
		return nil, err
	}
	return units, nil
}

// ackFunc removes enqueued units from a batch's outbox; Store.AckOutbox.
type ackFunc func(ctx context.Context, batchID string, idx []int) (int, error)

// ackEvery is how many enqueued units are acknowledged in one call: a
// crash re-enqueues at most this many per enqueuer, harmlessly, for one
// Redis call per that many units.
const ackEvery = 32

// enqueueUnits puts units (at outbox positions idx) on the queue, par at a
// time (asynq v0.26 has no bulk enqueue), and acknowledges them in the
// outbox as they land. A unit that is already queued (asynq answers
// ErrTaskIDConflict for its fixed task ID) has landed. It stops at the
// first error and returns how many units it acknowledged; the rest stay
// in the outbox.
func enqueueUnits(ctx context.Context, enq Enqueuer, ack ackFunc, batchID string, idx []int, units []tasks.Unit, par int) (int, error) {
	if len(units) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		landed   []int
		acked    int
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	flush := func(force bool) {
		mu.Lock()
		if len(landed) == 0 || (!force && len(landed) < ackEvery) {
			mu.Unlock()
			return
		}
		part := landed
		landed = nil
		mu.Unlock()
		if _, err := ack(context.WithoutCancel(ctx), batchID, part); err != nil {
			fail(fmt.Errorf("acknowledge enqueued units: %w", err))
			return
		}
		mu.Lock()
		acked += len(part)
		mu.Unlock()
	}
	work := make(chan int)
	for range min(max(par, 1), len(units)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				_, err := enq.EnqueueContext(ctx, units[j].Task())
				if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
					fail(fmt.Errorf("enqueue %s: %w", units[j].TaskID, err))
					continue
				}
				mu.Lock()
				landed = append(landed, idx[j])
				mu.Unlock()
				flush(false)
			}
		}()
	}
loop:
	for j := range units {
		select {
		case work <- j:
		case <-ctx.Done():
			break loop
		}
	}
	close(work)
	wg.Wait()
	flush(true)
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return acked, firstErr
}
