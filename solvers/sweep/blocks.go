package sweep

import "sync"

// Blocks. A game is a Hamiltonian path of the empty cells' grid graph,
// and a graph with a Hamiltonian path has a block-cut tree that is itself
// a path: a cut vertex whose removal leaves three or more pieces would
// need the path to pass through it twice, and so would a block with three
// or more cut vertices. When the tree is a path with more than one block,
// the game starts in one end block and ends in the other (a game
// starting in a middle block, or on a cut vertex, would have to cross
// some cut vertex twice). So once per board, before any search, a
// depth-first search finds the blocks (Hopcroft and Tarjan): if the tree
// is not a path there is no game, and otherwise only cells of the two end
// blocks that are not cut vertices can start one.

const maxCells = MaxSide * stride

var blockPool = sync.Pool{New: func() any { return new(blockScratch) }}

// blockScratch holds the arrays of the analysis, indexed by packed cell.
type blockScratch struct {
	disc, low [maxCells]int32
	dir       [maxCells]uint8 // next direction to try from the cell
	mark      [maxCells]bool  // the cell is in the block being listed
	parent    [maxCells]int32
	nblocks   [maxCells]uint8 // how many blocks hold the cell (capped)
	stack     [maxCells]int32 // DFS stack of cells
	edges     [4 * maxCells]int32
	members   [2 * maxCells]int32 // cells of each block, block after block
	bounds    [maxCells + 1]int32 // block k is members[bounds[k]:bounds[k+1]]
}

var cellSteps = [4]int32{-stride, stride, -1, 1}

// blockStarts analyses the empty cells, which must be connected. It
// returns ok false when no game exists, and otherwise starts, the cells
// that may start a game (as bitset rows like s.board), or all false and
// restrict false when every cell may.
func (s *searcher) blockStarts(b *blockScratch) (starts [MaxSide + 2]uint64, restrict, ok bool) {
	empty := func(v int32) bool {
		r, c := v/stride, v%stride
		return r >= 0 && int(r) < s.n && c >= 0 && int(c) < s.m && s.board[r+1]>>c&1 == 1
	}
	var root int32 = -1
	for v := int32(0); v < maxCells && root < 0; v++ {
		if empty(v) {
			root = v
		}
	}
	if root < 0 || s.empty < 3 {
		return starts, false, true
	}
	for v := range b.disc {
		b.disc[v], b.nblocks[v] = 0, 0
	}
	nb, nm := 0, int32(0) // blocks, members
	ne := 0               // edge stack size (pairs)
	sp := 0
	t := int32(1)
	b.disc[root], b.low[root], b.dir[root], b.parent[root] = t, t, 0, -1
	b.stack[sp] = root
	sp++
	for sp > 0 {
		u := b.stack[sp-1]
		if d := b.dir[u]; d < 4 {
			b.dir[u]++
			v := u + cellSteps[d]
			if (d >= 2 && (v/stride != u/stride)) || !empty(v) {
				continue
			}
			switch {
			case b.disc[v] == 0:
				t++
				b.disc[v], b.low[v], b.dir[v], b.parent[v] = t, t, 0, u
				b.edges[2*ne], b.edges[2*ne+1] = u, v
				ne++
				b.stack[sp] = v
				sp++
			case v != b.parent[u] && b.disc[v] < b.disc[u]:
				b.low[u] = min(b.low[u], b.disc[v])
				b.edges[2*ne], b.edges[2*ne+1] = u, v
				ne++
			}
			continue
		}
		sp--
		p := b.parent[u]
		if p < 0 {
			break
		}
		b.low[p] = min(b.low[p], b.low[u])
		if b.low[u] < b.disc[p] {
			continue
		}
		// The edges above (p, u) on the stack form a block.
		b.bounds[nb] = nm
		for {
			ne--
			x, y := b.edges[2*ne], b.edges[2*ne+1]
			for _, w := range [2]int32{x, y} {
				if !b.mark[w] {
					b.mark[w] = true
					b.members[nm] = w
					nm++
				}
			}
			if x == p && y == u {
				break
			}
		}
		for _, w := range b.members[b.bounds[nb]:nm] {
			b.mark[w] = false
			if b.nblocks[w] < 3 {
				b.nblocks[w]++
			}
		}
		nb++
	}
	b.bounds[nb] = nm
	if int(t) != s.empty {
		return starts, false, false // not connected
	}
	if nb <= 1 {
		return starts, false, true
	}
	ends := 0
	for k := 0; k < nb; k++ {
		cuts := 0
		for _, w := range b.members[b.bounds[k]:b.bounds[k+1]] {
			switch b.nblocks[w] {
			case 2:
				cuts++
			case 3:
				return starts, false, false // three pieces without it
			}
		}
		switch {
		case cuts >= 3:
			return starts, false, false // the tree branches here
		case cuts == 1:
			ends++
			for _, w := range b.members[b.bounds[k]:b.bounds[k+1]] {
				if b.nblocks[w] == 1 {
					starts[w/stride+1] |= 1 << (w % stride)
				}
			}
		}
	}
	if ends != 2 {
		return starts, false, false
	}
	return starts, true, true
}
