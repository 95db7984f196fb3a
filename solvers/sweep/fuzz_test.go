package sweep

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/solvers"
)

// FuzzParseBOJ9944 checks that the parser never panics, that every error
// is an InputError with a line, and that what it accepts is valid and
// survives a round trip through the judge format.
func FuzzParseBOJ9944(f *testing.F) {
	f.Add(officialSample)
	f.Add("1 1\n.\n")
	f.Add("\r\n2 2  \r\n.* \r\n..\t\r\n\r\n")
	f.Add("2 5\n.....\n....\n")
	f.Add("31 1\n")
	f.Add("1 2 3\n")
	f.Add("-1 4\n")
	f.Add("1 1\n*\n")
	f.Fuzz(func(t *testing.T, in string) {
		ps, err := ParseBOJ9944(strings.NewReader(in))
		if err != nil {
			var ie *solvers.InputError
			if !errors.As(err, &ie) || ie.Line < 1 || ie.Msg == "" {
				t.Fatalf("error %v (%#v) is not an InputError with a line", err, err)
			}
			return
		}
		var again bytes.Buffer
		for _, p := range ps {
			if err := Validate(p); err != nil {
				t.Fatalf("parsed an invalid board: %v", err)
			}
			again.WriteString(itoa(len(p.Board)) + " " + itoa(len(p.Board[0])) + "\n" + strings.Join(p.Board, "\n") + "\n")
		}
		ps2, err := ParseBOJ9944(&again)
		if err != nil || len(ps2) != len(ps) {
			t.Fatalf("round trip failed: %v", err)
		}
	})
}

// FuzzSolve compares the solver with the plain reference on tiny boards
// decoded from the fuzz input: two bytes of size, then one bit per cell.
func FuzzSolve(f *testing.F) {
	f.Add([]byte{3, 3, 0xff, 0xff})
	f.Add([]byte{5, 5, 0x3c, 0xff, 0xef, 0xfb, 0xff})
	f.Add([]byte{1, 6, 0x2d})
	f.Add([]byte{4, 1, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		n, m := 1+int(data[0])%5, 1+int(data[1])%6
		bitsIn := data[2:]
		board := make([]string, n)
		for i := 0; i < n; i++ {
			row := make([]byte, m)
			for j := 0; j < m; j++ {
				k := i*m + j
				row[j] = '*'
				if k/8 < len(bitsIn) && bitsIn[k/8]>>(k%8)&1 == 1 {
					row[j] = '.'
				}
			}
			board[i] = string(row)
		}
		if Validate(Puzzle{Board: board}) != nil {
			return
		}
		want, _ := refSolve(board, 0)
		got, err := Solve(context.Background(), Puzzle{Board: board}, Options{})
		if err != nil || got.Moves != want {
			t.Fatalf("board %q: got %+v %v, reference %d", board, got, err, want)
		}
		if msg := replay(board, got); msg != "" {
			t.Fatalf("board %q: %s", board, msg)
		}
	})
}

func itoa(i int) string { return strconv.Itoa(i) }
