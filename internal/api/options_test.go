package api

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// EnqueueFedThrough is store.Store's EnqueueFed for tests whose enqueuer
// fails part way: it sends refs through enq one at a time, as asynq's
// client does (a task ID conflict has landed), and only those that
// landed go on through st, which acknowledges them (and queues those enq
// did not really queue). The others stay in the feeding set, as a bulk
// enqueue cut off would leave them. Like OptionsForTest, both test
// packages see it.
func EnqueueFedThrough(ctx context.Context, enq Enqueuer, st *store.Store, queue string, refs []tasks.UnitRef) (int, error) {
	var (
		landed   []tasks.UnitRef
		firstErr error
	)
	for _, r := range refs {
		t, err := tasks.NewUnitTask(r, queue)
		if err == nil {
			_, err = enq.EnqueueContext(ctx, t)
		}
		if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		landed = append(landed, r)
	}
	if len(landed) == 0 {
		return 0, firstErr
	}
	n, err := st.EnqueueFed(ctx, queue, landed)
	return n, errors.Join(firstErr, err)
}

// OptionsForTest returns Options with every limit set, generous enough
// not to be in a test's way, for the tests that build a Server without
// the binary's Config: each sets only the fields it is about. New panics
// on a missing limit, so a limit added to Options is added here once.
// It is in a _test.go file, so only tests (of both test packages) see it.
func OptionsForTest() Options {
	l := tasks.Limits{Deadline: map[puzzle.Kind]time.Duration{}}
	for _, k := range puzzle.Kinds {
		l.Deadline[k] = time.Minute
	}
	return Options{
		MaxBodyBytes: 1 << 20, MaxBatchBodyBytes: 1 << 20, MaxBatchItems: 1000, MaxWait: time.Minute,
		ChunkSize: 64, FeedDepth: 64, MaxConcurrentDecodes: 2,
		MaxBytesInFlight: 32 << 20, MaxKeyBytesInFlight: 16 << 20, BodyReadTimeout: 30 * time.Second, BodyMinRate: 64 << 10, RequestTimeout: 10 * time.Second,
		Limits: l, RatePerSecond: 1000, RateBurst: 1000, MaxPendingPerKey: 1000,
		SessionTTL: time.Hour, SessionsPerKey: 1000, SignInsPerKeyPerMinute: 1000, SignInsPerAddrPerMinute: 1000,
		OperatorRatePerSecond: 1000, OperatorBurst: 1000, AuthFailuresPerMinute: 1000,
		MaxStreamsPerKey: 1000, HistoryReadMinutes: 2880,
	}
}
