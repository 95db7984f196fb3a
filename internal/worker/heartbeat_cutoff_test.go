package worker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// failingBeats is a BeatStore whose writes fail while down is set: a
// worker cut off from Redis. (The partition itself is proven on real
// processes by test/fault's TestWorkerPartition; this is the fast unit.)
type failingBeats struct{ down atomic.Bool }

var errUnreachable = errors.New("redis: i/o timeout")

func (b *failingBeats) Beat(context.Context, string, int64, map[string]worker.HeldTask, []string, time.Duration, worker.Presence, time.Duration) error {
	if b.down.Load() {
		return errUnreachable
	}
	return nil
}

func (b *failingBeats) Hold(context.Context, string, map[string]worker.HeldTask, time.Duration) error {
	return b.Beat(context.Background(), "", 0, nil, nil, 0, worker.Presence{}, 0)
}

func (b *failingBeats) Leave(context.Context, string) error { return nil }

// A worker whose beats fail for StopAfter stops its running tasks with
// ErrCutOff; one whose beats succeed, or that never stops (0), does not.
func TestHeartbeatStopsTasksWhenCutOff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		down     bool
		stopAft  time.Duration
		wantStop bool
	}{
		{"cut off", true, 100 * time.Millisecond, true},
		{"beats succeed", false, 100 * time.Millisecond, false},
		{"never stops", true, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := &failingBeats{}
			st.down.Store(tc.down)
			hb := worker.NewHeartbeat(st, "w-cut", 20*time.Millisecond, nil)
			hb.StopAfter(tc.stopAft)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go hb.Run(ctx)

			cause := make(chan error, 1)
			h := hb.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
				select {
				case <-ctx.Done():
					cause <- context.Cause(ctx)
				case <-time.After(600 * time.Millisecond):
					cause <- nil
				}
				return nil
			}))
			done := make(chan error, 1)
			go func() { done <- h.ProcessTask(ctx, asynq.NewTask(tasks.TypeUnit, nil)) }()
			got := <-cause
			if tc.wantStop != errors.Is(got, worker.ErrCutOff) || (!tc.wantStop && got != nil) {
				t.Fatalf("task context ended with %v; want stopped=%v", got, tc.wantStop)
			}
			// A stopped task is held until Redis is back, so that asynq's
			// write of its failure is not lost in the same partition.
			select {
			case err := <-done:
				if tc.wantStop {
					t.Fatalf("a stopped task returned (%v) while the beats still failed", err)
				}
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(200 * time.Millisecond):
				if !tc.wantStop {
					t.Fatal("the task did not return")
				}
				st.down.Store(false)
				select {
				case err := <-done:
					if !errors.Is(err, worker.ErrCutOff) {
						t.Fatalf("a stopped task returned %v, want ErrCutOff", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("a stopped task was still held 5 s after the beats came back")
				}
			}
			if n := hb.Stopped(); (n == 1) != tc.wantStop {
				t.Fatalf("Stopped() = %d, want stopped=%v", n, tc.wantStop)
			}
		})
	}
}
