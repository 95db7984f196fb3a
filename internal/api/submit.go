package api

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/tasks"
)

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
