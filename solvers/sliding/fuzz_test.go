package sliding

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/solvers"
)

// checkInputError fails unless err is a well-formed *solvers.InputError.
func checkInputError(t *testing.T, err error, wantLine bool) {
	t.Helper()
	var ie *solvers.InputError
	if !errors.As(err, &ie) {
		t.Fatalf("err = %v (%T), want *solvers.InputError", err, err)
	}
	if ie.Code != solvers.CodeInvalidPuzzle && ie.Code != solvers.CodeTooLarge {
		t.Fatalf("bad code %q", ie.Code)
	}
	if !strings.HasPrefix(ie.Field, "board") || ie.Msg == "" || len(ie.Msg) > 200 {
		t.Fatalf("bad error %+v", *ie)
	}
	if wantLine != (ie.Line >= 1) {
		t.Fatalf("error %+v: Line set = %v, want %v", *ie, ie.Line >= 1, wantLine)
	}
}

// checkSolve solves a board that passed validation and checks the answer:
// against the reference BFS for the small shapes, and for 3×3 (too slow for
// the reference in a fuzz loop) by an independent parity count and replay.
func checkSolve(t *testing.T, board [][]int) {
	t.Helper()
	n := len(board) * len(board[0])
	opts := Options{}
	if n > maxTableCells {
		opts.MaxNodes = 2_000_000 // random large boards may need more
	}
	res, err := Solve(t.Context(), Puzzle{Board: board}, opts)
	if errors.Is(err, solvers.ErrBudgetExceeded) {
		return
	}
	if err != nil {
		t.Fatalf("%s: %v", boardString(board), err)
	}
	if n <= 6 {
		checkAgainst(t, board, referenceBFS(board))
		return
	}
	if res.Solvable != naiveSolvable(board) {
		t.Fatalf("%s: solvable %v, naive parity disagrees", boardString(board), res.Solvable)
	}
	if !res.Solvable {
		if res.Moves != -1 || res.Path != "" {
			t.Fatalf("%s: unsolvable but %+v", boardString(board), res)
		}
		return
	}
	if res.Moves < 0 || (n <= 9 && res.Moves > 31) || len(res.Path) != res.Moves {
		t.Fatalf("%s: bad result %+v", boardString(board), res)
	}
	end, err := replay(board, res.Path)
	if err != nil || !isGoal(end) {
		t.Fatalf("%s: path %q does not reach the goal (%v)", boardString(board), res.Path, err)
	}
}

// naiveSolvable is the parity rule written out with an O(n²) inversion
// count, independent of the package's bit tricks.
func naiveSolvable(board [][]int) bool {
	var tiles []int
	blankRow := 0
	for i, row := range board {
		for _, v := range row {
			if v == 0 {
				blankRow = i
			} else {
				tiles = append(tiles, v)
			}
		}
	}
	inv := 0
	for i := range tiles {
		for j := i + 1; j < len(tiles); j++ {
			if tiles[i] > tiles[j] {
				inv++
			}
		}
	}
	if len(board[0])%2 == 0 {
		inv += len(board) - 1 - blankRow
	}
	return inv%2 == 0
}

func FuzzParseBOJ1525(f *testing.F) {
	for _, s := range []string{
		"1 0 3\n4 2 5\n7 8 6\n",
		"3 6 0\n8 1 2\n7 4 5\n",
		"1 0 3\r\n4 2 5\r\n7 8 6",
		"\n1 0\n\n3 2\n\n",
		"1 0 3\n4 2 5\n7 8\n",
		"x 0 3\n4 2 5\n7 8 6\n",
		"1 2 3\n4 5 6\n7 8 9\n10 11 0\n",
		"1 0 3\n4 -2 5\n7 8 99999999999999999999\n",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := ParseBOJ1525(strings.NewReader(in))
		if err != nil {
			checkInputError(t, err, true)
			return
		}
		if err := Validate(p); err != nil {
			t.Fatalf("parsed board fails Validate: %v", err)
		}
		// Round trip: the board printed back parses to the same board.
		var sb strings.Builder
		for _, row := range p.Board {
			sb.WriteString(boardString([][]int{row})) // "1 2 3"
			sb.WriteByte('\n')
		}
		p2, err := ParseBOJ1525(strings.NewReader(sb.String()))
		if err != nil || boardString(p2.Board) != boardString(p.Board) {
			t.Fatalf("round trip of %s: %s, %v", boardString(p.Board), boardString(p2.Board), err)
		}
		checkSolve(t, p.Board)
		res, _ := Solve(t.Context(), p, Options{})
		var out bytes.Buffer
		if err := FormatBOJ1525(&out, res); err != nil || !strings.HasSuffix(out.String(), "\n") {
			t.Fatalf("format: %q, %v", out.String(), err)
		}
	})
}

// FuzzSolve builds a board from the fuzzer's bytes and checks that Solve
// never panics and answers correctly. The top bit of shape picks the mode:
// set, the data shuffles 0..R*C-1 into a valid board of a supported shape
// (Fisher-Yates driven by the bytes), so most inputs reach the solver;
// clear, the bytes are taken as raw signed tiles on any shape up to 4×4,
// so validation sees every kind of bad board.
func FuzzSolve(f *testing.F) {
	f.Add(byte(0x80|0x03), []byte{})                      // 3×3 goal
	f.Add(byte(0x80|0x03), []byte{7, 1, 200, 3, 9, 4, 5}) // 3×3 shuffle
	f.Add(byte(0x80|0x01), []byte{1, 2, 3})               // 2×3 shuffle
	f.Add(byte(0x80|0x02), []byte{255, 0, 17})            // 3×2 shuffle
	f.Add(byte(0x80), []byte{1})                          // 2×2 shuffle
	f.Add(byte(3*5+3), []byte{1, 0, 3, 4, 2, 5, 7, 8, 6}) // raw sample
	f.Add(byte(3*5+3), []byte{3, 6, 0, 8, 1, 2, 7, 4, 5}) // raw unsolvable
	f.Add(byte(2*5+2), []byte{1, 1, 0, 0xFF})             // raw duplicate and -1
	f.Add(byte(4*5+4), []byte{})                          // 4×4
	f.Add(byte(0), []byte{})                              // 0×0
	f.Fuzz(func(t *testing.T, shape byte, data []byte) {
		var board [][]int
		if shape&0x80 != 0 {
			rows, cols := 2+int(shape&1), 2+int(shape>>1&1)
			perm := make([]int, rows*cols)
			for i := range perm {
				perm[i] = (i + 1) % len(perm) // start from the goal
			}
			for i := len(perm) - 1; i > 0 && len(data) > 0; i-- {
				j := int(data[0]) % (i + 1)
				data = data[1:]
				perm[i], perm[j] = perm[j], perm[i]
			}
			for r := range rows {
				board = append(board, perm[r*cols:(r+1)*cols])
			}
		} else {
			rows, cols := int(shape%5), int(shape/5%5)
			for r := range rows {
				row := make([]int, cols)
				for c := range row {
					if k := r*cols + c; k < len(data) {
						row[c] = int(int8(data[k]))
						if data[k] == 0x7F {
							row[c] = 1 << 62 // a huge tile
						}
					}
				}
				board = append(board, row)
			}
		}
		if err := Validate(Puzzle{Board: board}); err != nil {
			checkInputError(t, err, false)
			if _, err2 := Solve(t.Context(), Puzzle{Board: board}, Options{}); err2 == nil {
				t.Fatalf("Solve accepts a board Validate rejects: %v", err)
			}
			return
		}
		checkSolve(t, board)
	})
}
