package e2e_test

import (
	"testing"

	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// decode unmarshals an API answer into a T, failing t if it cannot.
func decode[T any](t *testing.T, b []byte) T { return stacktest.Decode[T](t, b) }
