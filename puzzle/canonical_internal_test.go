package puzzle

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/puzzleq/puzzleq/solvers/sliding"
)

// TestSlidingCanonicalMatchesEncodingJSON: the reflection-free canonical
// form of a sliding board is encoding/json's, byte for byte, so the cache
// keys of every board stay what they were (a changed key would miss
// every cached answer). Boards of every size, negative and large tiles,
// and nil rows and boards.
func TestSlidingCanonicalMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	boards := [][][]int{nil, {}, {nil}, {{}}, {{1, 2, 3}, {4, 5, 6}, {7, 8, 0}}, {{-1, 1 << 40}, nil}}
	for range 5000 {
		b := make([][]int, r.IntN(6))
		for i := range b {
			if r.IntN(20) == 0 {
				continue // a nil row
			}
			b[i] = make([]int, r.IntN(6))
			for j := range b[i] {
				b[i][j] = r.IntN(40) - 5
			}
		}
		boards = append(boards, b)
	}
	for _, b := range boards {
		want := canonicalJSON(KindSliding, sliding.Puzzle{Board: b})
		if got := appendSlidingCanonical(nil, b); !bytes.Equal(got, want) {
			t.Fatalf("board %v:\n got %s\nwant %s", b, got, want)
		}
	}
}

// TestSlidingKeyIsStable: a board's cache key is the one earlier builds
// gave it, so answers cached before an upgrade are still found after.
func TestSlidingKeyIsStable(t *testing.T) {
	p, err := Decode([]byte(`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]},"options":{"max_nodes":5}}`))
	if err != nil {
		t.Fatal(err)
	}
	// Key of this board at d3c1be7, before the reflection-free form.
	const want = "d4b52300186c9ddba31cbc963cb027c811816ccb83ec571b60558a15980c9128"
	if got := p.Key(); got != want {
		t.Fatalf("key %s, want %s", got, want)
	}
}
