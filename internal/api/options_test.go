package api

import (
	"time"

	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

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
		ChunkSize: 64, FeedDepth: 64, EnqueueParallelism: 8, MaxConcurrentDecodes: 2,
		MaxBytesInFlight: 32 << 20, BodyReadTimeout: 30 * time.Second, BodyMinRate: 64 << 10, RequestTimeout: 10 * time.Second,
		Limits: l, RatePerSecond: 1000, RateBurst: 1000, MaxPendingPerKey: 1000,
		SessionTTL:            time.Hour,
		OperatorRatePerSecond: 1000, OperatorBurst: 1000, AuthFailuresPerMinute: 1000,
		MaxStreamsPerKey: 1000,
	}
}
