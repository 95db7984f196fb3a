package worker

import (
	"context"
	"encoding/json"
	"time"

	"github.com/puzzleq/puzzleq/puzzle"
)

// SolveFnOf returns h's solve function for the external tests, which
// replace it to provoke panics, errors and slow solves. They are external
// (package tasks_test) because they drive the handler on the real
// internal/store, which imports this package.
//
// A replaced solve may be slow whatever the puzzle, so no request is
// treated as a table lookup (see instant) on h from then on.
func SolveFnOf(h *Handler) *func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
	h.instant = func(*puzzle.Parsed) bool { return false }
	return &h.solveFn
}

// SetFlushEvery sets how long h lets finished items wait before it writes
// them; 0 writes each item as it ends.
func SetFlushEvery(h *Handler, d time.Duration) { h.flushEvery = d }

// PauseWrites holds h's flusher and beats off Redis until resume is
// called: tasks that start and end meanwhile are only in memory, so a
// test decides what one flush finds, whatever the machine's load.
func PauseWrites(h *Heartbeat) (resume func()) {
	h.writeMu.Lock()
	return h.writeMu.Unlock
}

// Flushing reports whether h's flusher goroutine runs.
func Flushing(h *Heartbeat) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.flushing
}

// Unwritten returns how many of h's running tasks no write has stored.
func Unwritten(h *Heartbeat) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.unwritten)
}

// SetRerunClock makes r read the time from now.
func SetRerunClock(r *Rerun, now func() time.Time) { r.now = now }
