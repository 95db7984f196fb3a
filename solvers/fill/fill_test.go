package fill

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/solvers"
)

var (
	example1 = Puzzle{
		GameBoard: [][]int{{1, 1, 0, 0, 1, 0}, {0, 0, 1, 0, 1, 0}, {0, 1, 1, 0, 0, 1}, {1, 1, 0, 1, 1, 1}, {1, 0, 0, 0, 1, 0}, {0, 1, 1, 1, 0, 0}},
		Table:     [][]int{{1, 0, 0, 1, 1, 0}, {1, 0, 1, 0, 1, 0}, {0, 1, 1, 0, 1, 1}, {0, 0, 1, 0, 0, 0}, {1, 1, 0, 1, 1, 0}, {0, 1, 0, 0, 0, 0}},
	}
	example2 = Puzzle{
		GameBoard: [][]int{{0, 0, 0}, {1, 1, 0}, {1, 1, 1}},
		Table:     [][]int{{1, 1, 1}, {1, 0, 0}, {0, 0, 0}},
	}
)

func TestOfficialExamples(t *testing.T) {
	for _, tc := range []struct {
		p    Puzzle
		want int
	}{{example1, 14}, {example2, 0}} {
		res, err := Solve(context.Background(), tc.p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Filled != tc.want {
			t.Errorf("Filled = %d, want %d", res.Filled, tc.want)
		}
		if err := checkResult(tc.p, Options{}, res); err != nil {
			t.Error(err)
		}
		if got := referenceSolve(tc.p.GameBoard, tc.p.Table, false); got != tc.want {
			t.Errorf("reference = %d, want %d", got, tc.want)
		}
	}
}

// TestDeterministic: the same input gives the same placements, also when
// the pooled buffers were last used by a larger solve.
func TestDeterministic(t *testing.T) {
	a, _ := Solve(context.Background(), example1, Options{AllowFlip: true})
	_, _ = Solve(context.Background(), Puzzle{GameBoard: grid(300, 300, 0), Table: grid(300, 300, 1)}, Options{})
	b, _ := Solve(context.Background(), example1, Options{AllowFlip: true})
	if !equalResults(a, b) {
		t.Fatalf("results differ:\n%+v\n%+v", a, b)
	}
}

func equalResults(a, b Result) bool {
	if a.Filled != b.Filled || len(a.Placements) != len(b.Placements) {
		return false
	}
	for i := range a.Placements {
		x, y := a.Placements[i], b.Placements[i]
		if x.Rotation != y.Rotation || x.Flipped != y.Flipped || len(x.Piece) != len(y.Piece) {
			return false
		}
		for j := range x.Piece {
			if x.Piece[j] != y.Piece[j] || x.Hole[j] != y.Hole[j] {
				return false
			}
		}
	}
	return true
}

// grid returns a rows×cols grid of v.
func grid(rows, cols, v int) [][]int {
	g := make([][]int, rows)
	for i := range g {
		g[i] = make([]int, cols)
		for j := range g[i] {
			g[i][j] = v
		}
	}
	return g
}

// TestLargeSingleRegion: a 1000×1000 hole and a 1000×1000 piece are one
// group each; the iterative flood fill must not blow the stack.
func TestLargeSingleRegion(t *testing.T) {
	p := Puzzle{GameBoard: grid(1000, 1000, 0), Table: grid(1000, 1000, 1)}
	res, err := Solve(context.Background(), p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Filled != 1000*1000 || len(res.Placements) != 1 {
		t.Fatalf("Filled %d with %d placements", res.Filled, len(res.Placements))
	}
}

func TestCancelled(t *testing.T) {
	p := Puzzle{GameBoard: grid(1000, 1000, 0), Table: grid(1000, 1000, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := new(solver)
	_, err := s.solve(ctx, p, Options{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// Validation reads the whole input; the search itself stops at its
	// first poll, before the flood has grouped a single hole (the board
	// is one hole of a million cells), whatever the machine's speed.
	if len(s.holes) != 0 || len(s.pieces) != 0 {
		t.Errorf("the canceled solve grouped %d holes and %d pieces, want none", len(s.holes), len(s.pieces))
	}
	// And the same solver, not canceled, does group them: the check above
	// is not met by a board that has none.
	if _, err := s.solve(context.Background(), p, Options{}); err != nil || len(s.holes) != 1 {
		t.Fatalf("the solve not canceled: %d holes, %v; want the board's one", len(s.holes), err)
	}
}

func TestCancelledDuringSolve(t *testing.T) {
	p := Puzzle{GameBoard: grid(1000, 1000, 0), Table: grid(1000, 1000, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err := Solve(ctx, p, Options{})
	// Depending on the machine the solve may finish first; both are fine,
	// but an error must be the context's.
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
}

func TestValidate(t *testing.T) {
	ok := [][]int{{0, 1}, {1, 0}}
	tall := grid(1001, 3, 0)
	wide := grid(2, 1001, 0)
	for _, tc := range []struct {
		name       string
		p          Puzzle
		code       string
		field, msg string
	}{
		{"empty board", Puzzle{Table: ok}, solvers.CodeInvalidPuzzle, "game_board", "game_board is empty"},
		{"empty table", Puzzle{GameBoard: ok, Table: [][]int{}}, solvers.CodeInvalidPuzzle, "table", "table is empty"},
		{"empty row", Puzzle{GameBoard: [][]int{{}}, Table: ok}, solvers.CodeInvalidPuzzle, "game_board[0]", "game_board row 1 is empty"},
		{"ragged", Puzzle{GameBoard: [][]int{{0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}, {0, 0, 0, 0}}, Table: ok}, solvers.CodeInvalidPuzzle, "game_board[2]", "game_board row 3 has 4 columns, expected 5"},
		{"dims", Puzzle{GameBoard: grid(5, 5, 0), Table: grid(5, 6, 0)}, solvers.CodeInvalidPuzzle, "table", "game_board is 5x5 but table is 5x6"},
		{"value", Puzzle{GameBoard: ok, Table: [][]int{{0, 1}, {1, 7}}}, solvers.CodeInvalidPuzzle, "table[1][1]", "table row 2, column 2: value 7 is not 0 or 1"},
		{"negative", Puzzle{GameBoard: [][]int{{0, -1}, {1, 0}}, Table: ok}, solvers.CodeInvalidPuzzle, "game_board[0][1]", "game_board row 1, column 2: value -1 is not 0 or 1"},
		{"tall", Puzzle{GameBoard: tall, Table: tall}, solvers.CodeTooLarge, "game_board", "game_board is 1001x3, the limit is 1000x1000"},
		{"wide table", Puzzle{GameBoard: ok, Table: wide}, solvers.CodeTooLarge, "table", "table is 2x1001, the limit is 1000x1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.p)
			var ie *solvers.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("err = %v, want *solvers.InputError", err)
			}
			if ie.Code != tc.code || ie.Field != tc.field || ie.Msg != tc.msg {
				t.Errorf("got {%s %s %q}, want {%s %s %q}", ie.Code, ie.Field, ie.Msg, tc.code, tc.field, tc.msg)
			}
			if _, err := Solve(context.Background(), tc.p, Options{}); err == nil || err.Error() != ie.Error() {
				t.Errorf("Solve err = %v, want %v", err, ie)
			}
		})
	}
	if err := Validate(example1); err != nil {
		t.Errorf("example1: %v", err)
	}
	// The spec's own example of a cell error.
	p := Puzzle{GameBoard: grid(2, 5, 0), Table: grid(2, 5, 0)}
	p.Table[1][3] = 7
	if err := Validate(p); err == nil || err.Error() != "table row 2, column 4: value 7 is not 0 or 1" || err.(*solvers.InputError).Field != "table[1][3]" {
		t.Errorf("err = %#v", err)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in   string
		code       string
		field, msg string
		line       int
	}{
		{"empty", "", solvers.CodeInvalidPuzzle, "", "input is empty, expected a JSON object", 0},
		{"syntax", "{\n\"game_board\": [[1,0]],\n\"table\": [[1,0],]}", solvers.CodeInvalidPuzzle, "", "invalid JSON at byte offset 42: invalid character ']' looking for beginning of value", 3},
		{"truncated", `{"game_board": [[1,0]`, solvers.CodeInvalidPuzzle, "", "unexpected end of JSON input at byte offset 21", 1},
		{"unknown", `{"game_board": [[1]], "table": [[1]], "extra": 1}`, solvers.CodeInvalidPuzzle, "", `unknown field "extra", expected only "game_board" and "table"`, 0},
		{"trailing", `{"game_board": [[1]], "table": [[1]]} {}`, solvers.CodeInvalidPuzzle, "", "unexpected data after the JSON object at byte offset 38", 1},
		{"string value", `{"game_board": [[1,"a"]], "table": [[1,0]]}`, solvers.CodeInvalidPuzzle, "game_board[0][1]", `game_board row 1, column 2: value "a" is not 0 or 1`, 1},
		{"float value", `{"game_board": [[1,0]], "table": [[1,0],[0,1.5]]}`, solvers.CodeInvalidPuzzle, "table[1][1]", `table row 2, column 2: value 1.5 is not 0 or 1`, 1},
		{"row not array", `{"game_board": [[1,0], 3], "table": [[1,0]]}`, solvers.CodeInvalidPuzzle, "game_board[1]", `game_board row 2 is not an array of numbers`, 1},
		{"grid not array", `{"game_board": {}, "table": [[1,0]]}`, solvers.CodeInvalidPuzzle, "game_board", `game_board is not an array of rows`, 1},
		{"not object", `[1]`, solvers.CodeInvalidPuzzle, "", `the puzzle: JSON array at byte offset 1 cannot be the puzzle object`, 1},
		{"value 2", `{"game_board": [[1,0]], "table": [[1,2]]}`, solvers.CodeInvalidPuzzle, "table[0][1]", `table row 1, column 2: value 2 is not 0 or 1`, 0},
		{"null value", `{"game_board": [[1,0]], "table": [[1, null]]}`, solvers.CodeInvalidPuzzle, "table[0][1]", `table row 1, column 2: value null is not 0 or 1`, 0},
		{"null row", `{"game_board": [[1,0], null], "table": [[1,0],[0,1]]}`, solvers.CodeInvalidPuzzle, "game_board[1]", `game_board row 2 has 0 columns, expected 2`, 0},
		{"missing table", `{"game_board": [[1,0]]}`, solvers.CodeInvalidPuzzle, "table", `table is empty`, 0},
		{"dims", `{"game_board": [[1,0]], "table": [[1]]}`, solvers.CodeInvalidPuzzle, "table", `game_board is 1x2 but table is 1x1`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseP84021(strings.NewReader(tc.in))
			var ie *solvers.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("err = %v, want *solvers.InputError", err)
			}
			if ie.Code != tc.code || ie.Field != tc.field || ie.Msg != tc.msg || ie.Line != tc.line {
				t.Errorf("got {%s %q %q line %d}, want {%s %q %q line %d}", ie.Code, ie.Field, ie.Msg, ie.Line, tc.code, tc.field, tc.msg, tc.line)
			}
		})
	}
}

func TestParseTooLarge(t *testing.T) {
	in := strings.NewReader(`{"game_board": [[` + strings.Repeat(" ", MaxInputBytes) + `1]], "table": [[1]]}`)
	_, err := ParseP84021(in)
	var ie *solvers.InputError
	if !errors.As(err, &ie) || ie.Code != solvers.CodeTooLarge {
		t.Fatalf("err = %v, want too_large", err)
	}
}

func TestParseFormatRoundTrip(t *testing.T) {
	in := `{"game_board": [[1,1,0,0,1,0],[0,0,1,0,1,0],[0,1,1,0,0,1],[1,1,0,1,1,1],[1,0,0,0,1,0],[0,1,1,1,0,0]],
 "table": [[1,0,0,1,1,0],[1,0,1,0,1,0],[0,1,1,0,1,1],[0,0,1,0,0,0],[1,1,0,1,1,0],[0,1,0,0,0,0]]}
`
	p, err := ParseP84021(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Solve(context.Background(), p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := FormatP84021(&out, res); err != nil {
		t.Fatal(err)
	}
	if out.String() != "14\n" {
		t.Errorf("output %q", out.String())
	}
}

// TestNilContext: a nil context is a caller bug, but it must not panic.
func TestNilContext(t *testing.T) {
	var ctx context.Context
	res, err := Solve(ctx, example1, Options{})
	if err != nil || res.Filled != 14 {
		t.Fatalf("got %d, %v", res.Filled, err)
	}
}
