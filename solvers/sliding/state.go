package sliding

import "math/bits"

// packed is a board packed four bits per cell, cell i (row-major) in bits
// 4i..4i+3. It is how a query enters the solver: one uint64 instead of a
// [][]int, copied for free. Four bits hold tiles up to 15, so the same
// encoding serves the 16 cells of a 4×4 board.
type packed uint64

// at returns the tile in cell i.
func (b packed) at(i int) int { return int(b>>(4*uint(i))) & 0xF }

// pack packs a validated board (at most 16 cells, tiles 0..15).
func pack(board [][]int) (b packed, blank int) {
	i := 0
	for _, row := range board {
		for _, v := range row {
			if v == 0 {
				blank = i
			}
			b |= packed(v) << (4 * uint(i))
			i++
		}
	}
	return b, blank
}

// inversions counts the pairs of tiles (blank skipped, row-major) that are
// out of order: for each tile, the larger tiles before it, counted with a
// popcount over a bit set of the tiles seen so far, so it costs O(n)
// rather than O(n²).
func inversions(b packed, n int) int {
	var seen uint32
	inv := 0
	for i := 0; i < n; i++ {
		v := uint(b.at(i))
		if v == 0 {
			continue
		}
		// Tiles greater than v that were already seen are inversions with v.
		inv += bits.OnesCount32(seen >> (v + 1))
		seen |= 1 << v
	}
	return inv
}

// solvable applies the parity rule (see the package comment): the goal is
// reachable exactly when inv, plus for even widths the number of rows
// between the blank and the bottom row, is even.
func solvable(b packed, blank, rows, cols int) bool {
	p := inversions(b, rows*cols)
	if cols%2 == 0 {
		p += rows - 1 - blank/cols
	}
	return p%2 == 0
}

// direction is a move of the blank.
type direction struct {
	name   byte // 'U', 'D', 'L' or 'R'
	dr, dc int
}

// walkOrder is the tie-break order of the path walk: alphabetical, so that
// the greedy walk returns the lexicographically smallest shortest path
// (see the package comment).
var walkOrder = [4]direction{
	{'D', 1, 0},
	{'L', 0, -1},
	{'R', 0, 1},
	{'U', -1, 0},
}

// neighbours lists, for each blank cell of an R×C board, the cells the
// blank can move to, in walkOrder, with -1 where the move leaves the board.
func neighbours(rows, cols int) [][4]int8 {
	nb := make([][4]int8, rows*cols)
	for p := range nb {
		r, c := p/cols, p%cols
		for k, d := range walkOrder {
			nr, nc := r+d.dr, c+d.dc
			if nr < 0 || nr >= rows || nc < 0 || nc >= cols {
				nb[p][k] = -1
			} else {
				nb[p][k] = int8(nr*cols + nc)
			}
		}
	}
	return nb
}
