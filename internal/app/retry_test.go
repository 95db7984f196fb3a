package app

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	task := asynq.NewTask("solve:sweep", nil)
	refused := fmt.Errorf("tasks: start 1 items: store: start: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
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
		{"other", errors.New("boom"), 15 * time.Second, time.Hour},
	} {
		d := retryDelay(1, tc.err, task)
		if d < tc.min || d > tc.max {
			t.Errorf("%s: %v, want within [%v, %v]", tc.name, d, tc.min, tc.max)
		}
	}
}
