package sliding

import (
	"context"
	"fmt"

	"github.com/puzzleq/puzzleq/solvers"
)

// minSide is the fewest rows or columns Validate accepts: a 1-wide board
// cannot reorder its tiles, so it is not a puzzle. The other limit is
// maxCells cells (4×4, 3×5, 5×3, 2×8, 8×2 and everything smaller). Boards
// of up to maxTableCells cells are answered from a distance table, larger
// ones by IDA* with pattern databases.
const minSide = 2

// DefaultMaxNodes is the node budget used when Options.MaxNodes is 0. It
// applies only to boards solved by search (more than 9 cells); boards of
// up to 9 cells are answered from a precomputed distance table and ignore
// the budget. With the 7-8 tables (UseTables) the 80-move board, among
// the hardest 4×4 positions, needs 12 M nodes, so the budget is 16 times
// the worst 4×4 board and bounds a runaway search at 20 to 30 s of CPU
// (7 to 10 M nodes per CPU-second). With 6-6-3 it is 30 times the
// hardest of Korf's 100 random instances (6 M nodes) and far above random
// boards of the other shapes (5 M on average for 2×8), but not enough
// for the very hardest 4×4 boards (1.1 G nodes for the 80-move one); a
// caller on 6-6-3 that wants those must raise MaxNodes.
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
	if rows*cols > maxCells {
		return solvers.TooLarge("board", "board is %dx%d (%d cells), the limit is %d cells (4x4, 3x5, 2x8)",
			rows, cols, rows*cols, maxCells)
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
//
// Boards of at most 9 cells are answered from a distance table and their
// path is the lexicographically smallest shortest path (see the package
// comment); the first query of a shape builds its table, a few
// milliseconds for 3×3, later ones take about a microsecond. Larger boards
// are solved by IDA* with pattern databases (built on first use unless
// Preload ran), which polls ctx, reports to opts.Progress and stops after
// opts.MaxNodes nodes with an error wrapping solvers.ErrBudgetExceeded;
// their path is a shortest path, not necessarily the smallest.
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
	// Dispatch on the size of the state space: (n)!/2 states, at most
	// 9!/2 for the table.
	if rows*cols <= maxTableCells {
		return solveTable(b, blank, rows, cols)
	}
	path, _, err := solveSearch(ctx, b, blank, rows, cols, opts)
	if err != nil {
		return Result{}, err
	}
	return Result{Moves: len(path), Solvable: true, Path: path}, nil
}

// solveSearch solves a solvable board of more than maxTableCells cells by
// IDA*. A board with more rows than columns is transposed first (see
// transpose), and the path transposed back. It returns the path and the
// number of nodes searched.
func solveSearch(ctx context.Context, b packed, blank, rows, cols int, opts Options) (string, int64, error) {
	if b == goalBoard(rows*cols) {
		return "", 0, nil // no need to build the databases
	}
	tr := rows > cols
	if tr {
		b, blank = transpose(b, rows, cols)
		rows, cols = cols, rows
	}
	h, err := heuristicFor(ctx, rows, cols)
	if err != nil {
		return "", 0, err
	}
	path, nodes, err := idaStar(ctx, h, b, blank, opts)
	if err != nil {
		return "", nodes, err
	}
	if tr {
		path = transposePath(path)
	}
	return path, nodes, nil
}

// goalBoard returns the packed goal of an n-cell board.
func goalBoard(n int) packed {
	var g packed
	for v := 1; v < n; v++ {
		g |= packed(v) << (4 * uint(v-1))
	}
	return g
}

// transpose reflects an R×C board along its main diagonal into a C×R
// board: the tile in cell (r, c) goes to cell (c, r), and tile v, whose
// goal cell is (gr, gc), is renamed to the tile whose goal is (gc, gr).
// That maps the goal to the goal (the blank's goal cell is the last on
// both) and moves to moves, with U↔L and D↔R, so distances are unchanged.
func transpose(b packed, rows, cols int) (packed, int) {
	var out packed
	blank := 0
	for c := 0; c < rows*cols; c++ {
		r, k := c/cols, c%cols
		nc := k*rows + r
		v := b.at(c)
		nv := 0
		if v == 0 {
			blank = nc
		} else {
			gr, gk := (v-1)/cols, (v-1)%cols
			nv = gk*rows + gr + 1
		}
		out |= packed(nv) << (4 * uint(nc))
	}
	return out, blank
}

// transposePath maps a path of the transposed board back (U↔L, D↔R).
func transposePath(p string) string {
	out := []byte(p)
	for i, m := range out {
		switch m {
		case 'U':
			out[i] = 'L'
		case 'L':
			out[i] = 'U'
		case 'D':
			out[i] = 'R'
		case 'R':
			out[i] = 'D'
		}
	}
	return string(out)
}
