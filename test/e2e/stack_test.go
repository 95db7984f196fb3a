package e2e_test

import (
	"testing"

	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// stack is a real deployment in miniature (internal/stacktest): a
// redis-server process, the API and workers, wired by the same code as
// the binaries.
type stack struct {
	*stacktest.Stack
	t *testing.T
}

// startStack starts redis, the API and n workers. env overrides settings
// of both binaries.
func startStack(t *testing.T, workers int, env map[string]string) *stack {
	t.Helper()
	return &stack{stacktest.Start(t, stacktest.Options{Workers: workers, Env: env}), t}
}

func decode[T any](t *testing.T, b []byte) T { return stacktest.Decode[T](t, b) }
