package sweep

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/puzzleq/puzzleq/solvers"
)

// maxLine bounds one input line. A valid line is at most 30 characters
// plus trailing blanks; anything this long is not a board, and refusing
// it keeps memory bounded whatever the input.
const maxLine = 4096

// ParseBOJ9944 reads every case of Baekjoon 9944 input until EOF: a line
// "N M", then N rows of M characters. Trailing blanks, CRLF line ends and
// blank lines between cases are accepted. Errors are *solvers.InputError
// with Line set to the 1-based line at fault.
func ParseBOJ9944(r io.Reader) ([]Puzzle, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 256), maxLine)
	line := 0
	next := func() (string, bool, error) {
		if !sc.Scan() {
			if err := sc.Err(); err != nil {
				if errors.Is(err, bufio.ErrTooLong) {
					return "", false, lineErr(solvers.TooLarge("", "line is longer than %d bytes", maxLine), line+1)
				}
				return "", false, fmt.Errorf("sweep: reading input: %w", err)
			}
			return "", false, nil
		}
		line++
		return strings.TrimRight(sc.Text(), " \t\r\v\f"), true, nil
	}
	var out []Puzzle
	for {
		text, ok, err := next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return out, nil
		}
		if strings.TrimSpace(text) == "" {
			continue
		}
		header := line
		n, m, herr := parseHeader(text)
		if herr != nil {
			return nil, lineErr(herr, header)
		}
		p := Puzzle{Board: make([]string, 0, n)}
		for i := 0; i < n; i++ {
			row, ok, err := next()
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, lineErr(solvers.Invalid("board", "expected %d rows after the header on line %d, input ends after %d", n, header, i), line+1)
			}
			if len(row) != m {
				return nil, lineErr(solvers.Invalid(fieldRow(i), "expected %d characters, got %d", m, len(row)), line)
			}
			for j := 0; j < m; j++ {
				if ch := row[j]; ch != '.' && ch != '*' {
					return nil, lineErr(solvers.Invalid(fieldRow(i), "column %d: unexpected character %q", j+1, rune(ch)), line)
				}
			}
			p.Board = append(p.Board, row)
		}
		if err := Validate(p); err != nil {
			return nil, lineErr(err, header)
		}
		out = append(out, p)
	}
}

func lineErr(err error, line int) error {
	return solvers.AtLine(err, line)
}

// parseHeader reads "N M" with both sides in 1..MaxSide.
func parseHeader(text string) (n, m int, _ *solvers.InputError) {
	f := strings.Fields(text)
	if len(f) != 2 {
		return 0, 0, solvers.Invalid("board", "expected a header \"N M\", got %q", clip(text))
	}
	var v [2]int
	for i, s := range f {
		x, err := strconv.Atoi(s)
		if err != nil {
			return 0, 0, solvers.Invalid("board", "expected a header \"N M\", got %q", clip(text))
		}
		v[i] = x
	}
	n, m = v[0], v[1]
	if n < 1 || m < 1 {
		return 0, 0, solvers.Invalid("board", "board is %dx%d, each side must be at least 1", n, m)
	}
	if n > MaxSide || m > MaxSide {
		return 0, 0, solvers.TooLarge("board", "board is %dx%d, the limit is %dx%d", n, m, MaxSide, MaxSide)
	}
	return n, m, nil
}

// clip keeps error messages short when a line is long garbage.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// FormatBOJ9944 writes "Case k: X" for each result, k counting from 1,
// as the judge expects.
func FormatBOJ9944(w io.Writer, results []Result) error {
	bw := bufio.NewWriter(w)
	for i, r := range results {
		if _, err := fmt.Fprintf(bw, "Case %d: %d\n", i+1, r.Moves); err != nil {
			return err
		}
	}
	return bw.Flush()
}
