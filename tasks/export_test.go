package tasks

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
