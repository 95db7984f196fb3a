package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/internal/worker"
)

// BenchmarkRerunMiddleware is the cost Rerun adds to each delivery that
// succeeds, with the window full as at a worker's peak rate.
func BenchmarkRerunMiddleware(b *testing.B) {
	rr := worker.NewRerun(&recordingEnqueuer{}, nil, worker.RerunOptions{Window: time.Hour, MaxTasks: 20_000})
	h := rr.Middleware()(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	t := asynq.NewTask("solve:sliding", make([]byte, 150))
	b.ReportAllocs()
	for b.Loop() {
		if err := h.ProcessTask(ctx, t); err != nil {
			b.Fatal(err)
		}
	}
}
