package tasks_test

import (
	"errors"
	"testing"

	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestTaskTypesAreStable pins the type strings: they are stored in Redis
// with every queued task, so a rename would strand tasks queued by the
// previous release.
func TestTaskTypesAreStable(t *testing.T) {
	t.Parallel()
	for k, want := range map[puzzle.Kind]string{
		puzzle.KindSliding: "solve:sliding",
		puzzle.KindSweep:   "solve:sweep",
		puzzle.KindFill:    "solve:fill",
	} {
		if got, err := tasks.TypeFor(k); err != nil || got != want {
			t.Errorf("TypeFor(%s) = %q, %v; want %q", k, got, err, want)
		}
	}
	if tasks.TypeUnit != "solve:unit" {
		t.Errorf("TypeUnit = %q", tasks.TypeUnit)
	}
	for _, k := range []puzzle.Kind{"", "tetris", "SLIDING"} {
		if got, err := tasks.TypeFor(k); !errors.Is(err, puzzle.ErrUnknownKind) || got != "" {
			t.Errorf("TypeFor(%q) = %q, %v; want an error, not a default", k, got, err)
		}
	}
}
