package app

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/worker"
)

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	task := asynq.NewTask("solve:sweep", nil)
	refused := fmt.Errorf("tasks: start 1 items: store: start: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	// A real Redis at maxmemory (noeviction) refusing a write, as a
	// handler's store call sees it.
	rdb := redistest.Start(t).Client(t)
	if err := rdb.ConfigSet(t.Context(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	oomErr := rdb.Set(t.Context(), "k", "v", 0).Err()
	if oomErr == nil {
		t.Fatal("a write to a Redis at maxmemory succeeded")
	}
	oom := fmt.Errorf("tasks: finish 3 items: store: finish: %w", oomErr)
	for _, tc := range []struct {
		name     string
		err      error
		min, max time.Duration
	}{
		// Long enough that a late retry by a second recoverer finds the
		// task still waiting (asynq#717), short next to the 60-125 s
		// that crash recovery takes anyway.
		{"lease expired", asynq.ErrLeaseExpired, 3 * time.Second, 10 * time.Second},
		{"redis refused", refused, time.Second, 2 * time.Second},
		// Redis answers and refuses writes: retried as soon, so the work
		// resumes seconds after it takes writes again.
		{"redis at maxmemory", oom, time.Second, 2 * time.Second},
		{"other", errors.New("boom"), 15 * time.Second, time.Hour},
		// A task over its key's cap runs again after the wait it asked for.
		{"waits for a slot", fmt.Errorf("wrapped: %w", &worker.WaitError{In: 2500 * time.Millisecond}), 2500 * time.Millisecond, 2500 * time.Millisecond},
	} {
		d := retryDelay(1, tc.err, task)
		if d < tc.min || d > tc.max {
			t.Errorf("%s: %v, want within [%v, %v]", tc.name, d, tc.min, tc.max)
		}
	}
}
