package sliding

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/puzzleq/puzzleq/solvers"
)

// Input bounds of ParseBOJ1525. The judge sends three short lines; the
// bounds only keep hostile input from costing memory or time. A line of
// maxLineBytes holds at most maxLineBytes/2 numbers, so a parse never holds
// more than maxParseRows*maxLineBytes/2 ints.
const (
	maxLineBytes = 4096 // longest line, in bytes, without its newline
	maxParseRows = 16   // most non-blank lines (rows); enough to report a 4×4 as too large
	maxLines     = 1024 // most lines in all, blank ones included
	maxQuoted    = 20   // longest token quoted back in an error message
)

// ParseBOJ1525 reads a board in the judge's format: one row per line,
// numbers separated by spaces or tabs. The judge gives three lines of three
// numbers; any R×C board with consistent rows is accepted here and checked
// by Validate. Blank lines are skipped and CRLF line ends are tolerated.
// Errors are *solvers.InputError with Line set to the 1-based input line,
// for example "row 3: expected 3 numbers, got 2".
func ParseBOJ1525(r io.Reader) (Puzzle, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 256), maxLineBytes+2) // +2: room for "\r\n"
	var (
		board    [][]int
		rowLines []int // input line of each row, to locate Validate's errors
		line     int
	)
	for sc.Scan() {
		line++
		if line > maxLines {
			return Puzzle{}, atLine(solvers.TooLarge("board", "more than %d lines of input", maxLines), line)
		}
		fields := strings.Fields(sc.Text()) // also drops a trailing '\r'
		if len(fields) == 0 {
			continue
		}
		i := len(board)
		if i == maxParseRows {
			return Puzzle{}, atLine(solvers.TooLarge("board",
				"more than %d rows, the limit is %d cells", maxParseRows, maxCells), line)
		}
		if i > 0 && len(fields) != len(board[0]) {
			return Puzzle{}, atLine(solvers.Invalid(fmt.Sprintf("board[%d]", i),
				"row %d: expected %d numbers, got %d", i+1, len(board[0]), len(fields)), line)
		}
		row := make([]int, len(fields))
		for j, f := range fields {
			v, err := strconv.Atoi(f)
			if err != nil {
				field := fmt.Sprintf("board[%d][%d]", i, j)
				if errors.Is(err, strconv.ErrRange) {
					return Puzzle{}, atLine(solvers.Invalid(field,
						"row %d, column %d: tile %s is out of range", i+1, j+1, quoteShort(f, false)), line)
				}
				return Puzzle{}, atLine(solvers.Invalid(field,
					"row %d: %s is not a number", i+1, quoteShort(f, true)), line)
			}
			row[j] = v
		}
		board = append(board, row)
		rowLines = append(rowLines, line)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return Puzzle{}, atLine(solvers.TooLarge("board",
				"line is longer than %d bytes", maxLineBytes), line+1)
		}
		return Puzzle{}, fmt.Errorf("sliding: reading input: %w", err)
	}
	if len(board) == 0 {
		return Puzzle{}, atLine(solvers.Invalid("board", "board is empty: no numbers in input"), max(line, 1))
	}
	p := Puzzle{Board: board}
	if err := Validate(p); err != nil {
		i := faultRow(err)
		if i >= len(rowLines) {
			i = 0
		}
		return Puzzle{}, solvers.AtLine(err, rowLines[i])
	}
	return p, nil
}

// atLine sets the input line on a parse error.
func atLine(err *solvers.InputError, line int) error {
	err.Line = line
	return err
}

// faultRow returns the row index named by the Field of a Validate error
// ("board[2]" or "board[2][1]" → 2), or 0 for errors about the whole board.
// Validate only names rows that exist, so the result indexes the board.
func faultRow(err error) int {
	var ie *solvers.InputError
	if !errors.As(err, &ie) {
		return 0
	}
	rest, ok := strings.CutPrefix(ie.Field, "board[")
	if !ok {
		return 0
	}
	num, _, ok := strings.Cut(rest, "]")
	if !ok {
		return 0
	}
	i, err2 := strconv.Atoi(num)
	if err2 != nil || i < 0 {
		return 0
	}
	return i
}

// quoteShort renders a token for an error message, cut to maxQuoted bytes
// so that a 4 KB token does not become a 4 KB message.
func quoteShort(s string, quote bool) string {
	cut := len(s) > maxQuoted
	if cut {
		s = s[:maxQuoted]
	}
	if quote {
		s = strconv.Quote(s)
	}
	if cut {
		s += "..."
	}
	return s
}

// FormatBOJ1525 writes the answer as the judge expects it: the number of
// moves (-1 when unsolvable) on one line.
func FormatBOJ1525(w io.Writer, res Result) error {
	_, err := fmt.Fprintf(w, "%d\n", res.Moves)
	return err
}
