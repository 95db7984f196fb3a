package recovery

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for the loop's goroutine and the
// test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A run of failed passes (a Redis refusing writes fails every one) logs
// its first failure and its end, not a line a pass.
func TestEveryLogsARunOfFailuresOnce(t *testing.T) {
	var buf lockedBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	passes := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		every(ctx, time.Millisecond, log, "pass failed", func(context.Context) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			passes++
			switch {
			case passes <= 50:
				return 0, errors.New("OOM command not allowed")
			case passes == 60:
				cancel()
			}
			return 0, nil
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not end with its context")
	}
	out := buf.String()
	if n := strings.Count(out, "level=WARN"); n != 1 {
		t.Errorf("50 failed passes logged %d warnings, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "failed_passes=1") || !strings.Contains(out, "passes succeed again") || !strings.Contains(out, "failed_passes=50") {
		t.Errorf("want the first failure and the end of the run with its count:\n%s", out)
	}
	if n := strings.Count(out, "\n"); n != 2 {
		t.Errorf("%d lines, want 2:\n%s", n, out)
	}
}
