package sliding

import (
	"errors"
	"math/bits"
	"sync"
)

// maxTableCells is the largest board, in cells, solved by the distance
// table: 9!/2 = 181,440 reachable states, one byte each. The next size up
// (10 cells) would already need 1.8 MB, and 16 cells 10 TB, so larger
// boards need a search instead.
const maxTableCells = 9

// maxTableSide bounds each side of a table shape: with both sides at least
// 2 and at most maxTableCells cells, no side exceeds 4 (2×4, 4×2).
const maxTableSide = maxTableCells / 2

// unseen marks a table entry the BFS has not reached. Distances for boards
// of up to 9 cells stay far below it (31 for 3×3).
const unseen = 0xFF

// table holds the distance to the goal of every reachable board of one
// shape, indexed by index.
type table struct {
	rows, cols, n int
	half          uint32    // (n-1)!/2: table entries per blank cell
	nb            [][4]int8 // neighbour cells of each blank cell, in walkOrder
	dist          []uint8   // distance to the goal, by index
}

// lazyTable builds the table of one shape on first use.
type lazyTable struct {
	once sync.Once
	t    *table
}

// tables holds the lazily built table of each shape, indexed by rows and
// columns. A fixed array rather than a map: the lookup is on every query,
// and the set of shapes is small and known.
var tables [maxTableSide + 1][maxTableSide + 1]lazyTable

// tableFor returns the table of an R×C board, building it on first use. It
// is safe for concurrent use. The shape must have 2..maxTableSide rows and
// columns and at most maxTableCells cells.
func tableFor(rows, cols int) *table {
	lt := &tables[rows][cols]
	lt.once.Do(func() { lt.t = buildTable(rows, cols) })
	return lt.t
}

// newTable allocates an empty table of an R×C board, every entry unseen.
func newTable(rows, cols int) *table {
	n := rows * cols
	half := uint32(1)
	for k := 3; k <= n-1; k++ { // (n-1)!/2 = 3*4*...*(n-1)
		half *= uint32(k)
	}
	t := &table{
		rows: rows, cols: cols, n: n,
		half: half,
		nb:   neighbours(rows, cols),
		dist: make([]uint8, uint32(n)*half),
	}
	for i := range t.dist {
		t.dist[i] = unseen
	}
	return t
}

// index returns the table index of a reachable board: the blank's cell
// times (n-1)!/2, plus half the Lehmer rank of the tiles in row-major order
// (see the package comment for why halving is a bijection). It runs in
// O(n) with a bit set of the tiles seen so far.
func (t *table) index(b packed) uint32 {
	var seen uint32
	var rank uint32
	blank := 0
	m := uint32(t.n - 1) // number of tiles
	k := uint32(0)       // tiles ranked so far
	for i := 0; i < t.n; i++ {
		v := uint32(b) & 0xF
		b >>= 4
		if v == 0 {
			blank = i
			continue
		}
		// Lehmer digit: the tiles smaller than v not yet placed.
		d := v - 1 - uint32(bits.OnesCount32(seen&(1<<v-1)))
		seen |= 1 << v
		rank = rank*(m-k) + d
		k++
	}
	return uint32(blank)*t.half + rank>>1
}

// buildTable runs one BFS from the goal over every reachable board of an
// R×C shape. The queue holds the boards themselves, packed into 32 bits
// by dropping the last cell (recovered as the one tile missing), so the
// build for 3×3 allocates 5 bytes per state: about 0.9 MB in all.
func buildTable(rows, cols int) *table {
	t := newTable(rows, cols)
	n := t.n
	// all is the XOR of every tile 0..n-1; XOR-ing the n-1 stored cells
	// into it leaves the tile of the dropped last cell.
	all := uint32(0)
	for v := 1; v < n; v++ {
		all ^= uint32(v)
	}
	lastShift := 4 * uint(n-1)

	g := goal(n)
	t.dist[t.index(g)] = 0
	queue := make([]uint32, 1, len(t.dist))
	queue[0] = uint32(g)
	for head, depth := 0, uint8(0); head < len(queue); depth++ {
		end := len(queue) // boards at depth end here
		for ; head < end; head++ {
			low := queue[head]
			x := low ^ low>>16
			x ^= x >> 8
			x ^= x >> 4
			b := packed(low) | packed((all^x)&0xF)<<lastShift
			blank := 0
			for b.at(blank) != 0 {
				blank++
			}
			for _, to := range t.nb[blank] {
				if to < 0 {
					continue
				}
				nb := b.slide(blank, int(to))
				j := t.index(nb)
				if t.dist[j] == unseen {
					t.dist[j] = depth + 1
					queue = append(queue, uint32(nb))
				}
			}
		}
	}
	return t
}

// errTableMiss means a board that passed the parity rule has no distance:
// a bug, reported as an error rather than a panic.
var errTableMiss = errors.New("sliding: internal error: solvable board missing from distance table")

// solveTable answers a validated, solvable board from its shape's table:
// one lookup for the distance, then a walk down the distances for the path,
// taking the first neighbour in walkOrder that is one step closer.
func solveTable(b packed, blank, rows, cols int) (Result, error) {
	t := tableFor(rows, cols)
	d := t.dist[t.index(b)]
	if d == unseen {
		return Result{}, errTableMiss
	}
	path := make([]byte, d)
	for step := range path {
		want := d - 1 - uint8(step)
		moved := false
		for k, to := range t.nb[blank] {
			if to < 0 {
				continue
			}
			nb := b.slide(blank, int(to))
			if t.dist[t.index(nb)] == want {
				path[step] = walkOrder[k].name
				b, blank, moved = nb, int(to), true
				break
			}
		}
		if !moved {
			return Result{}, errTableMiss
		}
	}
	return Result{Moves: int(d), Solvable: true, Path: string(path)}, nil
}
