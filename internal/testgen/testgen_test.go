package testgen_test

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/puzzle"
)

// Fill writes, cell for cell, what formatting the grids with fmt from the
// same draws writes, and a request that puzzle's strict decoder accepts;
// Fills is reproducible from its seed.
func TestFill(t *testing.T) {
	for _, side := range []int{1, 2, 7, 50} {
		got := testgen.Fill(rand.New(rand.NewSource(int64(side))), side)
		rng := rand.New(rand.NewSource(int64(side)))
		grid := func() string {
			rows := make([]string, side)
			for i := range rows {
				cells := make([]string, side)
				for j := range cells {
					cells[j] = fmt.Sprint(rng.Intn(2))
				}
				rows[i] = "[" + strings.Join(cells, ",") + "]"
			}
			return "[" + strings.Join(rows, ",") + "]"
		}
		want := fmt.Sprintf(`{"kind":"fill","puzzle":{"game_board":%s,"table":%s}}`, grid(), grid())
		if got != want {
			t.Fatalf("side %d:\n got %s\nwant %s", side, got, want)
		}
		if !json.Valid([]byte(got)) {
			t.Fatalf("side %d: not JSON: %s", side, got)
		}
		if _, _, err := puzzle.DecodeItem([]byte(got)); err != nil {
			t.Fatalf("side %d: the decoder refuses it: %v", side, err)
		}
	}
	a, b := testgen.Fills(3, 5, 9), testgen.Fills(3, 5, 9)
	if strings.Join(a, "\n") != strings.Join(b, "\n") || a[0] == a[1] {
		t.Fatalf("Fills(3, 5, 9) twice: %q and %q; want the same three distinct requests", a, b)
	}
}
