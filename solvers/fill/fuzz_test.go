package fill

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/puzzleq/puzzleq/solvers"
)

func FuzzParseP84021(f *testing.F) {
	for _, s := range []string{
		`{"game_board": [[1,1,0,0,1,0],[0,0,1,0,1,0],[0,1,1,0,0,1],[1,1,0,1,1,1],[1,0,0,0,1,0],[0,1,1,1,0,0]], "table": [[1,0,0,1,1,0],[1,0,1,0,1,0],[0,1,1,0,1,1],[0,0,1,0,0,0],[1,1,0,1,1,0],[0,1,0,0,0,0]]}`,
		`{"game_board": [[0,0,0],[1,1,0],[1,1,1]], "table": [[1,1,1],[1,0,0],[0,0,0]]}`,
		`{"game_board": [[0]], "table": [[1]]}`,
		`{"game_board": [[0,1]], "table": [[1]]}`,
		`{"game_board": [[0,"1"]], "table": [[1,0]]}`,
		`{"game_board": [[0,1]], "table": [[1,0]]} 1`,
		`{"table": null, "game_board": [[]]}`,
		`{"game_board": [[0,1e0]], "table": [[1,0]], "x": 1}`,
		"{\n\"game_board\": [[0,\n1]],\n",
		`[]`, `null`, ``, `{}`, `{"game_board": [null], "table": [[1]]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseP84021(bytes.NewReader(data))
		if err != nil {
			var ie *solvers.InputError
			if !errors.As(err, &ie) || ie.Msg == "" {
				t.Fatalf("error %v is not a *solvers.InputError with a message", err)
			}
			return
		}
		if err := Validate(p); err != nil {
			t.Fatalf("parsed puzzle does not validate: %v", err)
		}
		res, err := Solve(context.Background(), p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.GameBoard)*len(p.GameBoard[0]) <= 400 {
			if want := referenceSolve(p.GameBoard, p.Table, false); res.Filled != want {
				t.Fatalf("Filled %d, reference %d", res.Filled, want)
			}
		}
		if err := checkResult(p, Options{}, res); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzSolve builds two small grids from the fuzz input: dims from the
// first two bytes, cell values from the low bits of the rest.
func FuzzSolve(f *testing.F) {
	f.Add(uint8(6), uint8(6), []byte{1, 1, 0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 1, 1, 0, 0},
		[]byte{1, 0, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0}, false)
	f.Add(uint8(3), uint8(3), []byte{0, 0, 0, 1, 1, 0, 1, 1, 1}, []byte{1, 1, 1, 1, 0, 0, 0, 0, 0}, true)
	f.Add(uint8(1), uint8(9), []byte{0, 0, 1, 0, 1, 0, 0, 0, 0}, []byte{1, 1, 0, 1, 0, 1, 1, 1, 0}, false)
	f.Add(uint8(4), uint8(4), []byte{0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0}, []byte{1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1}, true)
	f.Add(uint8(1), uint8(1), []byte{0}, []byte{1}, false)
	f.Fuzz(func(t *testing.T, rows, cols uint8, board, table []byte, flip bool) {
		r, c := 1+int(rows%16), 1+int(cols%16)
		mk := func(src []byte) [][]int {
			g := make([][]int, r)
			for i := range g {
				g[i] = make([]int, c)
				for j := range g[i] {
					if k := i*c + j; k < len(src) {
						g[i][j] = int(src[k] & 1)
					}
				}
			}
			return g
		}
		p := Puzzle{GameBoard: mk(board), Table: mk(table)}
		opts := Options{AllowFlip: flip}
		res, err := Solve(context.Background(), p, opts)
		if err != nil {
			t.Fatal(err)
		}
		if want := referenceSolve(p.GameBoard, p.Table, flip); res.Filled != want {
			t.Fatalf("Filled %d, reference %d", res.Filled, want)
		}
		if err := checkResult(p, opts, res); err != nil {
			t.Fatal(err)
		}
	})
}
