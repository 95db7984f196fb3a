package sliding

import (
	"context"
	"fmt"
	"math/bits"
)

// maxCells is the largest board, in cells, that Solve accepts (4×4, 2×8,
// 3×5, ...). Cell and tile numbers fit in four bits and cell sets in a
// uint32.
const maxCells = 16

// pdb is an additive pattern database of one shape: for each placement of
// the pattern tiles, the fewest moves of pattern tiles that bring them to
// their goal cells, the other tiles being indistinguishable and their
// moves free. The placement of the k pattern tiles (in the order of tiles)
// is ranked as a k-permutation of the n cells:
//
//	rank = ((d0*(n-1) + d1)*(n-2) + d2)... , di = ci - #{cj < ci : j < i}
//
// so the database has n!/(n-k)! entries (5,765,760 for six tiles on 16
// cells). An entry is stored in four bits, two per byte (entry i in the
// low nibble of byte i/2 when i is even, the high one when odd), as
//
//	(moves - md) / 2
//
// where md is the Manhattan distance of the pattern tiles: each move of a
// pattern tile changes md by one, so moves - md is even and never
// negative, and it is small (at most 6 for the 4×4 groups, 13 for any
// group of searchShapes, checked when built). The lookup adds md back,
// which costs a few reads of a 256-byte table and halves the memory and
// the cache footprint of the databases.
type pdb struct {
	rows, cols, n int
	tiles         []uint8 // pattern tiles, in rank order
	data          []uint8 // (moves - md)/2 by rank, four bits each
	mapped        []byte  // the file mapping data lies in (mapPDB), else nil
}

// maxExcess is the largest (moves - md)/2 that four bits hold.
const maxExcess = 15

// entry returns the stored (moves - md)/2 of rank i.
func (p *pdb) entry(i uint32) int { return int(p.data[i>>1] >> (4 * (i & 1)) & 0xF) }

// nibbleBytes is the size in bytes of a database of count entries.
func nibbleBytes(count int) int { return (count + 1) / 2 }

// manhattanTable returns md[t][c], the Manhattan distance of tile t from
// cell c to its goal cell t-1 on an R×C board (row 0 unused).
func manhattanTable(rows, cols int) *[maxCells][maxCells]uint8 {
	var md [maxCells][maxCells]uint8
	for t := 1; t < rows*cols; t++ {
		gr, gc := (t-1)/cols, (t-1)%cols
		for c := 0; c < rows*cols; c++ {
			md[t][c] = uint8(abs(c/cols-gr) + abs(c%cols-gc))
		}
	}
	return &md
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// permCount returns n!/(n-k)!, the number of placements of k tiles.
func permCount(n, k int) int {
	s := 1
	for i := 0; i < k; i++ {
		s *= n - i
	}
	return s
}

// rankCells returns the rank of k distinct cells (see pdb).
func rankCells(cells []uint8, n int) uint32 {
	var used uint32
	var idx uint32
	m := uint32(n)
	for _, c := range cells {
		d := uint32(c) - uint32(bits.OnesCount32(used&(1<<c-1)))
		idx = idx*m + d
		m--
		used |= 1 << c
	}
	return idx
}

// cellMasks returns, for each cell of an R×C board, the set of its
// orthogonal neighbours as a bit mask.
func cellMasks(rows, cols int) [maxCells]uint32 {
	var m [maxCells]uint32
	for c := 0; c < rows*cols; c++ {
		r, k := c/cols, c%cols
		if r > 0 {
			m[c] |= 1 << (c - cols)
		}
		if r < rows-1 {
			m[c] |= 1 << (c + cols)
		}
		if k > 0 {
			m[c] |= 1 << (c - 1)
		}
		if k < cols-1 {
			m[c] |= 1 << (c + 1)
		}
	}
	return m
}

// buildPDB computes the database of the given pattern tiles on an R×C
// board by a backward 0-1 BFS from the goal. A search state is the
// placement of the pattern tiles plus the blank's cell, numbered
// rank*(n-k) + (the blank's rank among the free cells); a blank move that
// slides a pattern tile costs 1, any other costs 0. The BFS works level by
// level on one array of 2-bit marks per state: unseen, visited, or in one
// of two frontiers (this level and the next; their codes alternate with
// the level's parity, so no pass is needed to turn the next level into the
// current one). A state taken from the level floods its blank region
// (every free cell the blank reaches at cost 0) at once: all of the region
// is settled at this level, and every pattern tile bordering the region
// gives a state of the next level. The first level at which a placement
// is settled, whatever the blank's cell, is its entry: the minimum over
// blank cells, which is what a lookup without the blank needs.
//
// For six tiles on 16 cells there are 57.7 M states: 14.4 MB of marks and
// a 0.7 MB bit set of the placements already entered, besides the 2.9 MB
// result. ctx is polled between levels; on
// cancellation the build stops and returns ctx.Err().
func buildPDB(ctx context.Context, rows, cols int, tiles []uint8) (*pdb, error) {
	n := rows * cols
	k := len(tiles)
	size := permCount(n, k)
	free := n - k
	total := size * free
	const (
		unseenMark  = 0
		visitedMark = 3
		lowBits     = 0x5555555555555555
	)
	marks := make([]uint64, (total+31)/32)
	data := make([]uint8, nibbleBytes(size))
	settled := make([]uint64, (size+63)/64) // placements with an entry
	md := manhattanTable(rows, cols)
	nbm := cellMasks(rows, cols)

	stateOf := func(cells []uint8, occ uint32, blank int) int {
		br := blank - bits.OnesCount32(occ&(1<<blank-1))
		return int(rankCells(cells, n))*free + br
	}
	goal := make([]uint8, k)
	var occ0 uint32
	for i, t := range tiles {
		goal[i] = t - 1
		occ0 |= 1 << (t - 1)
	}
	s0 := stateOf(goal, occ0, n-1)
	marks[s0/32] |= 1 << (2 * (s0 % 32)) // frontier code 1 at depth 0

	cells := make([]uint8, k)
	var digits [maxCells]int
	var tileAtCell [maxCells]int8
	var prefix [maxCells + 1]uint32 // cells of tiles 0..i-1
	// weight[i] is the place value of digit i: (n-i-1)!/(n-k)!.
	var weight [maxCells]int
	weight[k-1] = 1
	for i := k - 2; i >= 0; i-- {
		weight[i] = weight[i+1] * (n - i - 1)
	}
	// Shift masks for the flood: cells that have a left / right neighbour.
	var hasLeft, hasRight uint32
	for c := 0; c < n; c++ {
		if c%cols > 0 {
			hasLeft |= 1 << c
		}
		if c%cols < cols-1 {
			hasRight |= 1 << c
		}
	}
	all := uint32(1)<<n - 1
	for depth := 0; ; depth++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if depth > 250 {
			panic("sliding: pattern database build does not terminate")
		}
		fc := uint64(1 + depth&1) // this level's code
		nc := 3 - fc              // next level's code
		pat := fc * lowBits
		added := 0
		for w := range marks {
			x := marks[w] ^ pat
			m := ^(x | x>>1) & lowBits // entries equal to fc
			for m != 0 {
				j := bits.TrailingZeros64(m) / 2
				m &= m - 1
				s := w*32 + j
				if marks[w]>>(2*j)&3 != fc {
					continue // settled by a flood earlier in this level
				}
				// Unrank: placement digits, then cells, then the blank.
				// 32-bit divisions: much cheaper than 64-bit ones.
				p := int(uint32(s) / uint32(free))
				br := s - p*free
				x := uint32(p)
				for i := k - 1; i >= 0; i-- {
					d := uint32(n - i)
					q := x / d
					digits[i] = int(x - q*d)
					x = q
				}
				var occ uint32
				for i := 0; i < k; i++ {
					// The digits[i]-th cell not yet used.
					prefix[i] = occ
					c := nthZero(occ, digits[i])
					cells[i] = uint8(c)
					occ |= 1 << c
					tileAtCell[c] = int8(i)
				}
				prefix[k] = occ
				blank := nthZero(occ, br)
				// Flood the blank's region, all cells at once.
				open := all &^ occ
				region := uint32(1) << blank
				for {
					grow := region | (region&hasLeft)>>1 | (region&hasRight)<<1 |
						region>>cols | region<<cols
					grow &= open
					if grow == region {
						break
					}
					region = grow
				}
				if settled[p/64]&(1<<(p%64)) == 0 {
					settled[p/64] |= 1 << (p % 64)
					m := 0
					for i, c := range cells {
						m += int(md[tiles[i]][c])
					}
					e := (depth - m) / 2
					if e < 0 || e > maxExcess || (depth-m)%2 != 0 {
						panic(fmt.Sprintf("sliding: pattern database entry %d with Manhattan distance %d does not fit", depth, m))
					}
					data[p/2] |= uint8(e) << (4 * (p % 2))
				}
				base := p * free
				for r := region; r != 0; r &= r - 1 {
					b := bits.TrailingZeros32(r)
					v := base + b - bits.OnesCount32(occ&(1<<b-1))
					marks[uint(v)/32] |= visitedMark << (2 * (uint(v) % 32))
				}
				for r := region; r != 0; r &= r - 1 {
					b := bits.TrailingZeros32(r)
					for q := nbm[b] & occ; q != 0; q &= q - 1 {
						c := bits.TrailingZeros32(q)
						i := int(tileAtCell[c])
						// Tile i slides from c to b; the rank is updated
						// rather than recomputed. Digit i changes by b-c,
						// less the earlier tiles' cells strictly between
						// b and c (a vertical move passes cols-1 cells),
						// and each later tile in between gains (b > c) or
						// loses one smaller occupied cell, so its digit
						// moves by one step the other way.
						r := p + (b-c)*weight[i]
						if b-c != 1 && b-c != -1 {
							lo, hi := min(b, c), max(b, c)
							between := (uint32(1)<<hi - 1) &^ (uint32(1)<<(lo+1) - 1)
							before := bits.OnesCount32(prefix[i] & between)
							later := occ &^ prefix[i+1] & between
							step := 1
							if b < c {
								before, step = -before, -1
							}
							r -= before * weight[i]
							for ; later != 0; later &= later - 1 {
								r += step * weight[tileAtCell[bits.TrailingZeros32(later)]]
							}
						}
						nocc := occ ^ 1<<c ^ 1<<b
						v := r*free + c - bits.OnesCount32(nocc&(1<<c-1))
						if debugRank {
							cells[i] = uint8(b)
							if v != stateOf(cells, nocc, c) {
								panic("incremental rank")
							}
							cells[i] = uint8(c)
						}
						w, sh := uint(v)/32, 2*(uint(v)%32)
						if marks[w]>>sh&3 == unseenMark {
							marks[w] |= nc << sh
							added++
						}
					}
				}
			}
		}
		if added == 0 {
			break
		}
	}
	return &pdb{rows: rows, cols: cols, n: n, tiles: append([]uint8(nil), tiles...), data: data}, nil
}

// debugRank makes the build check every incremental successor rank
// against a full rankCells (a development aid: it passed on every shape).
const debugRank = false

// zeroSel[m][i] is the position of the i-th zero bit of the byte m.
var zeroSel = func() (t [256][8]uint8) {
	for m := range 256 {
		i := 0
		for c := range 8 {
			if m&(1<<c) == 0 {
				t[m][i] = uint8(c)
				i++
			}
		}
	}
	return t
}()

// nthZero returns the position of the i-th (from 0) zero bit of m, which
// must lie in the low 16 bits.
func nthZero(m uint32, i int) int {
	lo := m & 0xFF
	z := 8 - bits.OnesCount32(lo)
	if i < z {
		return int(zeroSel[lo][i])
	}
	return 8 + int(zeroSel[m>>8&0xFF][i-z])
}
