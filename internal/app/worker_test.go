package app

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/redistest"
)

// A worker whose health server dies must not go on unprobed: Run returns
// the server's error, so the process exits non-zero.
func TestWorkerRunFailsWithItsHealthServer(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	env := map[string]string{"REDIS_URL": r.URL(), "HTTP_ADDR": "127.0.0.1:0", "PDB_PRELOAD": "false", "SHUTDOWN_TIMEOUT": "2s"}
	cfg, err := LoadWorkerConfig(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorker(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	for deadline := time.Now().Add(10 * time.Second); !w.ready.Load(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the worker never started")
		}
	}
	w.ln.Close() // the health server's Serve fails
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "health server") {
			t.Fatalf("Run returned %v, want the health server's error", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its health server stopped")
	}
}

// A worker runs with at least one P more than its solver slots, so that
// a full set of searches leaves one for the cheap lane; more Ps than that
// are kept.
func TestProcsFor(t *testing.T) {
	for _, tc := range []struct{ slots, procs, want int }{
		{2, 2, 3}, {1, 1, 2}, {4, 2, 5}, {2, 3, 3}, {2, 8, 8},
	} {
		if got := procsFor(tc.slots, tc.procs); got != tc.want {
			t.Errorf("procsFor(%d slots, GOMAXPROCS %d) = %d, want %d", tc.slots, tc.procs, got, tc.want)
		}
	}
}
