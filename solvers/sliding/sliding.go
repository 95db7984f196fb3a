package sliding

import (
	"context"
	"fmt"

	"github.com/puzzleq/puzzleq/solvers"
)

// Size limits accepted by Validate. Every board within them is solved by
// table lookup; 4×4 (IDA* with pattern databases) comes later.
const (
	// minSide is the fewest rows or columns: a 1-wide board cannot reorder
	// its tiles, so it is not a puzzle.
	minSide = 2
	// maxRows and maxCols are the largest board currently supported.
	maxRows = 3
	maxCols = 3
)

// DefaultMaxNodes is the node budget used when Options.MaxNodes is 0. It
// applies only to boards solved by search, which the coming 4×4 IDA* path
// will use. Boards of up to 9 cells, all that Validate accepts today, are
// answered from a precomputed distance table in constant time, so the
// table method ignores the budget entirely.
const DefaultMaxNodes int64 = 200_000_000

// Validate checks that p is a well-formed board of a supported size. It
// returns nil or a *solvers.InputError whose Field locates the fault
// ("board", "board[2]", "board[2][1]") and whose message names it.
// Unsolvable boards are valid: Solve answers them with -1.
func Validate(p Puzzle) error {
	b := p.Board
	if len(b) == 0 {
		return solvers.Invalid("board", "board is empty")
	}
	cols := len(b[0])
	if cols == 0 {
		return solvers.Invalid("board[0]", "row 1 is empty")
	}
	for i, row := range b {
		if len(row) != cols {
			return solvers.Invalid(fmt.Sprintf("board[%d]", i),
				"row %d: expected %d numbers, got %d", i+1, cols, len(row))
		}
	}
	rows := len(b)
	if rows < minSide || cols < minSide {
		return solvers.Invalid("board", "board is %dx%d, each side must be at least %d", rows, cols, minSide)
	}
	if rows > maxRows || cols > maxCols {
		return solvers.TooLarge("board", "board is %dx%d, the limit is %dx%d", rows, cols, maxRows, maxCols)
	}

	// Ranges first, so that the duplicate check below can index a bit set.
	n := rows * cols
	for i, row := range b {
		for j, v := range row {
			if v < 0 || v >= n {
				return solvers.Invalid(fmt.Sprintf("board[%d][%d]", i, j),
					"row %d, column %d: tile %d is out of range 0..%d", i+1, j+1, v, n-1)
			}
		}
	}
	// With n cells and n tiles in range, a missing tile always comes with
	// a duplicate, so the duplicate's message names the missing tile too.
	var seen, present uint32
	for _, row := range b {
		for _, v := range row {
			present |= 1 << uint(v)
		}
	}
	for i, row := range b {
		for j, v := range row {
			if seen&(1<<uint(v)) != 0 {
				missing := 0
				for present&(1<<uint(missing)) != 0 {
					missing++
				}
				return solvers.Invalid(fmt.Sprintf("board[%d][%d]", i, j),
					"row %d, column %d: tile %d appears twice (tile %d is missing)", i+1, j+1, v, missing)
			}
			seen |= 1 << uint(v)
		}
	}
	return nil
}

// Solve returns the minimum number of moves that bring p to the goal and
// one shortest path, or Moves -1 when the goal is unreachable. It validates
// p first (errors are *solvers.InputError) and returns ctx.Err() if ctx is
// already done. Unreachable boards are decided by the parity rule alone.
// The path is the lexicographically smallest shortest path (see the
// package comment). The first query of a shape builds its distance table,
// a few milliseconds for 3×3; later ones take about a microsecond.
func Solve(ctx context.Context, p Puzzle, opts Options) (Result, error) {
	if err := Validate(p); err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	rows, cols := len(p.Board), len(p.Board[0])
	b, blank := pack(p.Board)
	if !solvable(b, blank, rows, cols) {
		return Result{Moves: -1}, nil
	}
	// Dispatch on the size of the state space. Validate admits nothing
	// beyond maxTableCells today; the 4×4 search will go in the else branch
	// and use opts.MaxNodes (the table method ignores it).
	if rows*cols <= maxTableCells {
		return solveTable(b, blank, rows, cols)
	}
	return Result{}, solvers.TooLarge("board", "board is %dx%d, the limit is %dx%d", rows, cols, maxRows, maxCols)
}
