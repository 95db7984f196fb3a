package puzzle

import (
	"encoding/json"
	"testing"

	"github.com/puzzleq/puzzleq/solvers/sliding"
)

// TestSlidingResultIsJSON holds the hand encoding of a sliding result to
// encoding/json's, byte for byte: results solved by a worker and locally
// must not differ.
func TestSlidingResultIsJSON(t *testing.T) {
	for _, r := range []sliding.Result{
		{Moves: -1}, {Moves: 0, Solvable: true}, {Moves: 3, Solvable: true, Path: "ULD"},
		{Moves: 31, Solvable: true, Path: "RRDDLLUURRDDLLUURRDDLLUURRDDLLU"},
		{Moves: 1, Solvable: true, Path: "<"}, {Moves: 1, Solvable: true, Path: "\\u"},
	} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := appendSlidingResult(nil, r)
		if !ok {
			got, _ = json.Marshal(r) // the caller's fallback
		}
		if string(got) != string(want) {
			t.Errorf("%+v: encoded %s, encoding/json %s", r, got, want)
		}
	}
}
