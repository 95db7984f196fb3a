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

// TestSolvesOn tells a worker's solver server from its webhook server by
// the queues it serves.
func TestSolvesOn(t *testing.T) {
	for _, tc := range []struct {
		queues map[string]int
		want   bool
	}{
		{map[string]int{tasks.QueueInteractive: 6, tasks.QueueBulk: 1}, true},
		{map[string]int{tasks.QueueBulk: 1}, true},
		{map[string]int{tasks.QueueWebhooks: 1}, false},
		{map[string]int{tasks.QueueInteractive: 6, tasks.QueueBulk: 1, tasks.QueueWebhooks: 1}, true}, // a worker of the previous release
		{nil, false},
	} {
		if got := tasks.SolvesOn(tc.queues); got != tc.want {
			t.Errorf("SolvesOn(%v) = %v, want %v", tc.queues, got, tc.want)
		}
	}
}
