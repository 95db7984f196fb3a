package tasks

import (
	"context"
	"encoding/json"

	"github.com/puzzleq/puzzleq/puzzle"
)

// SolveFnOf returns h's solve function for the external tests, which
// replace it to provoke panics, errors and slow solves. They are external
// (package tasks_test) because they drive the handler on the real
// internal/store, which imports this package.
func SolveFnOf(h *Handler) *func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) {
	return &h.solveFn
}
