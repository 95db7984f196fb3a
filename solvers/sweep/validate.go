package sweep

import (
	"strconv"
	"unicode/utf8"

	"github.com/puzzleq/puzzleq/solvers"
)

// MaxSide is the largest number of rows or columns a board may have; it
// is the judge's limit and it lets a row fit in one machine word.
const MaxSide = 30

// Validate checks that p is a board the solver accepts: 1..MaxSide rows of
// equal length 1..MaxSide, made only of '.' and '*', with at least one
// '.'. It returns a *solvers.InputError whose Field is "board" or
// "board[i]" (0-based row) and whose message counts rows and columns
// from 1, as a person reading the board would.
func Validate(p Puzzle) error {
	rows := len(p.Board)
	if rows == 0 {
		return solvers.Invalid("board", "board has no rows")
	}
	cols := utf8.RuneCountInString(p.Board[0])
	if rows > MaxSide || cols > MaxSide {
		return solvers.TooLarge("board", "board is %dx%d, the limit is %dx%d", rows, cols, MaxSide, MaxSide)
	}
	if cols == 0 {
		return solvers.Invalid("board[0]", "row 1 is empty")
	}
	empty := 0
	for i, row := range p.Board {
		field := fieldRow(i)
		col := 0
		for _, ch := range row {
			col++
			switch ch {
			case '.':
				empty++
			case '*':
			default:
				return solvers.Invalid(field, "row %d, column %d: unexpected character %q", i+1, col, ch)
			}
		}
		if col != cols {
			if col > MaxSide {
				return solvers.TooLarge(field, "row %d has %d columns, the limit is %d", i+1, col, MaxSide)
			}
			return solvers.Invalid(field, "row %d has %d columns, expected %d", i+1, col, cols)
		}
	}
	if empty == 0 {
		return solvers.Invalid("board", "board has no empty cell ('.')")
	}
	return nil
}

func fieldRow(i int) string { return "board[" + strconv.Itoa(i) + "]" }
