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

// tileSeq holds the tiles of a board in row-major order with the blank
// skipped, four bits each, tile k in bits 4k..4k+3. Together with the
// blank's cell it is the table's working form of a board: the table index
// is a function of the two (see index), a horizontal move leaves the
// sequence unchanged, and a vertical move rotates C adjacent nibbles.
type tileSeq uint64

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

// toSeq drops the blank's nibble from a packed board.
func toSeq(b packed, blank int) tileSeq {
	low := uint64(b) & (1<<(4*uint(blank)) - 1)
	high := uint64(b) >> (4 * uint(blank+1)) << (4 * uint(blank))
	return tileSeq(low | high)
}

// index returns the table index of a reachable board, given as its tile
// sequence and blank cell: blank * (n-1)!/2 plus half the Lehmer rank of
// the sequence (see the package comment for why halving is a bijection).
// The rank is built in Horner form with a bit set of the tiles seen, so it
// costs O(n). The last two Lehmer digits are skipped: the last is always
// 0 and the one before is exactly the bit that halving drops.
func (t *table) index(s tileSeq, blank int) uint32 {
	var seen uint32
	var rank uint32
	m := uint32(t.n - 1) // number of tiles
	for k := uint32(0); k+2 < m; k++ {
		v := uint32(s) & 0xF
		s >>= 4
		// Lehmer digit: the tiles smaller than v not yet placed.
		d := v - 1 - uint32(bits.OnesCount32(seen&(1<<v-1)))
		seen |= 1 << v
		rank = rank*(m-k) + d
	}
	return uint32(blank)*t.half + rank
}

// move returns the board after the blank moves from cell blank to the
// neighbouring cell to. Horizontal moves keep the sequence. Moving down,
// the tile below jumps back over the C-1 tiles between, so the C nibbles
// from the blank's position rotate by one; moving up is the reverse.
func (t *table) move(s tileSeq, blank, to int) tileSeq {
	c := t.cols
	switch to - blank {
	case c: // down: tile at sequence position to-1 moves to position blank
		shift := 4 * uint(blank)
		mask := tileSeq(1)<<(4*uint(c)) - 1
		f := s >> shift & mask
		f = (f<<4 | f>>(4*uint(c-1))) & mask
		return s&^(mask<<shift) | f<<shift
	case -c: // up: tile at sequence position to moves to position blank-1
		shift := 4 * uint(to)
		mask := tileSeq(1)<<(4*uint(c)) - 1
		f := s >> shift & mask
		f = f>>4 | (f&0xF)<<(4*uint(c-1))
		return s&^(mask<<shift) | f<<shift
	}
	return s
}

// neighbourIndex returns the index of the board after the blank moves from
// blank (index i) to to, and the new sequence. Horizontal moves change only
// the blank term of the index, so they cost one addition.
func (t *table) neighbourIndex(s tileSeq, blank int, i uint32, to int) (tileSeq, uint32) {
	if d := to - blank; d == 1 || d == -1 {
		return s, uint32(int64(i) + int64(d)*int64(t.half))
	}
	ns := t.move(s, blank, to)
	return ns, t.index(ns, to)
}

// buildTable runs one BFS from the goal over every reachable board of an
// R×C shape. The queue holds the boards themselves in 32 bits: the blank
// cell in the top four bits and the first n-2 tiles below (the last tile
// is the one missing, recovered by XOR), so the build for 3×3 allocates
// 5 bytes per state, about 0.9 MB in all, and never unranks.
func buildTable(rows, cols int) *table {
	t := newTable(rows, cols)
	m := t.n - 1 // tiles
	// all is the XOR of every tile 1..m; XOR-ing the m-1 stored tiles into
	// it leaves the last one.
	all := uint32(0)
	for v := 1; v <= m; v++ {
		all ^= uint32(v)
	}
	lastShift := 4 * uint(m-1)
	lowMask := uint32(1)<<lastShift - 1 // m-1 <= 7 tiles: at most 28 bits

	var g tileSeq // goal: tiles 1..m in order, blank in the last cell
	for v := 1; v <= m; v++ {
		g |= tileSeq(v) << (4 * uint(v-1))
	}
	t.dist[t.index(g, m)] = 0
	queue := make([]uint32, 1, len(t.dist))
	queue[0] = uint32(m)<<28 | uint32(g)&lowMask
	for head, depth := 0, uint8(0); head < len(queue); depth++ {
		end := len(queue) // boards at depth end here
		for ; head < end; head++ {
			e := queue[head]
			blank := int(e >> 28)
			low := e & lowMask
			x := low ^ low>>16
			x ^= x >> 8
			x ^= x >> 4
			s := tileSeq(low) | tileSeq((all^x)&0xF)<<lastShift
			i := t.index(s, blank)
			for _, to := range t.nb[blank] {
				if to < 0 {
					continue
				}
				ns, j := t.neighbourIndex(s, blank, i, int(to))
				if t.dist[j] == unseen {
					t.dist[j] = depth + 1
					queue = append(queue, uint32(to)<<28|uint32(ns)&lowMask)
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
	s := toSeq(b, blank)
	i := t.index(s, blank)
	d := t.dist[i]
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
			ns, j := t.neighbourIndex(s, blank, i, int(to))
			if t.dist[j] == want {
				path[step] = walkOrder[k].name
				s, blank, i, moved = ns, int(to), j, true
				break
			}
		}
		if !moved {
			return Result{}, errTableMiss
		}
	}
	return Result{Moves: int(d), Solvable: true, Path: string(path)}, nil
}
