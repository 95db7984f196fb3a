package sliding

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/solvers"
)

func TestParseBOJ1525(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want [][]int
	}{
		{"sample", "1 0 3\n4 2 5\n7 8 6\n", [][]int{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}}},
		{"no final newline", "1 0 3\n4 2 5\n7 8 6", [][]int{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}}},
		{"crlf", "1 0 3\r\n4 2 5\r\n7 8 6\r\n", [][]int{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}}},
		{"blank lines and tabs", "\n\n 1\t0 3 \n\n4 2 5\n\t\n7 8 6\n\n", [][]int{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}}},
		{"2x2", "0 1\n3 2\n", [][]int{{0, 1}, {3, 2}}},
		{"3x2", "1 2\n3 4\n5 0\n", [][]int{{1, 2}, {3, 4}, {5, 0}}},
		{"plus sign", "+1 0\n3 2\n", [][]int{{1, 0}, {3, 2}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseBOJ1525(strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p.Board, tc.want) {
				t.Fatalf("got %v, want %v", p.Board, tc.want)
			}
		})
	}
}

func TestParseBOJ1525Errors(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		code  string
		line  int
		field string
		msg   string
	}{
		{"empty", "", solvers.CodeInvalidPuzzle, 1, "board", "board is empty: no numbers in input"},
		{"only blank lines", "\n \n\r\n", solvers.CodeInvalidPuzzle, 3, "board", "board is empty: no numbers in input"},
		{"short row", "1 0 3\n4 2 5\n7 8\n", solvers.CodeInvalidPuzzle, 3, "board[2]", "row 3: expected 3 numbers, got 2"},
		{"short row after blank", "1 0 3\n\n4 2 5\n\n7 8\n", solvers.CodeInvalidPuzzle, 5, "board[2]", "row 3: expected 3 numbers, got 2"},
		{"long row", "1 0 3\n4 2 5 9\n7 8 6\n", solvers.CodeInvalidPuzzle, 2, "board[1]", "row 2: expected 3 numbers, got 4"},
		{"not a number", "x 0 3\n4 2 5\n7 8 6\n", solvers.CodeInvalidPuzzle, 1, "board[0][0]", `row 1: "x" is not a number`},
		{"float", "1 0 3\n4 2.5 5\n7 8 6\n", solvers.CodeInvalidPuzzle, 2, "board[1][1]", `row 2: "2.5" is not a number`},
		{"long token", "1 0 3\n4 2 5\n7 8 " + strings.Repeat("z", 100) + "\n", solvers.CodeInvalidPuzzle, 3, "board[2][2]",
			`row 3: "zzzzzzzzzzzzzzzzzzzz"... is not a number`},
		{"huge number", "1 0 3\n4 2 5\n7 8 99999999999999999999999\n", solvers.CodeInvalidPuzzle, 3, "board[2][2]",
			"row 3, column 3: tile 99999999999999999999... is out of range"},
		{"out of range", "1 0 3\n4 2 5\n7 8 9\n", solvers.CodeInvalidPuzzle, 3, "board[2][2]", "row 3, column 3: tile 9 is out of range 0..8"},
		{"negative", "1 0 3\n4 -2 5\n7 8 6\n", solvers.CodeInvalidPuzzle, 2, "board[1][1]", "row 2, column 2: tile -2 is out of range 0..8"},
		{"duplicate", "\n1 0 3\n4 2 5\n7 8 5\n", solvers.CodeInvalidPuzzle, 4, "board[2][2]", "row 3, column 3: tile 5 appears twice (tile 6 is missing)"},
		{"one row", "1 2 0\n", solvers.CodeInvalidPuzzle, 1, "board", "board is 1x3, each side must be at least 2"},
		{"5x4", "1 2 3 4\n5 6 7 8\n9 10 11 12\n13 14 15 16\n17 18 19 0\n", solvers.CodeTooLarge, 1, "board", "board is 5x4 (20 cells), the limit is 16 cells (4x4, 3x5, 2x8)"},
		{"too many rows", strings.Repeat("1 2\n", 17), solvers.CodeTooLarge, 17, "board", "more than 16 rows, the limit is 16 cells"},
		{"long line", strings.Repeat("1 ", 3000), solvers.CodeTooLarge, 1, "board", "line is longer than 4096 bytes"},
		{"long second line", "1 0\n" + strings.Repeat(" ", 5000), solvers.CodeTooLarge, 2, "board", "line is longer than 4096 bytes"},
		{"many blank lines", strings.Repeat("\n", 2000), solvers.CodeTooLarge, 1025, "board", "more than 1024 lines of input"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseBOJ1525(strings.NewReader(tc.in))
			var ie *solvers.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("err = %v, want *solvers.InputError", err)
			}
			if ie.Code != tc.code || ie.Line != tc.line || ie.Field != tc.field || ie.Msg != tc.msg {
				t.Fatalf("got %+v\nwant code %q line %d field %q msg %q", *ie, tc.code, tc.line, tc.field, tc.msg)
			}
		})
	}
}

// errReader fails after its data, like a broken connection.
type errReader struct{ r io.Reader }

func (e errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

func TestParseBOJ1525ReadError(t *testing.T) {
	_, err := ParseBOJ1525(errReader{strings.NewReader("1 0 3\n")})
	var ie *solvers.InputError
	if !errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ie) {
		t.Fatalf("err = %v, want the reader's error, not an InputError", err)
	}
}

func TestFormatBOJ1525(t *testing.T) {
	for _, tc := range []struct {
		res  Result
		want string
	}{
		{Result{3, true, "DRD"}, "3\n"},
		{Result{Moves: -1}, "-1\n"},
		{Result{0, true, ""}, "0\n"},
	} {
		var buf bytes.Buffer
		if err := FormatBOJ1525(&buf, tc.res); err != nil || buf.String() != tc.want {
			t.Errorf("%+v: %q, %v; want %q", tc.res, buf.String(), err, tc.want)
		}
	}
}
