package sliding

import "context"

// mdMove is one move of the blank from a given cell: the cell it moves to
// (-1 off the board) and, by tile, the change of the Manhattan distance
// when that tile slides from there into the blank's cell (-1 or +1).
// Keeping the change next to the cell it belongs to means a child costs
// one read of the tile and one of this row, both in a few cache lines.
type mdMove struct {
	to int8
	dh [maxCells]int8
}

// mdSearcher is one IDA* run with the Manhattan distance: the board
// changes in place and h is carried down the recursion, updated from the
// moved tile's row of the delta table instead of any database lookup.
type mdSearcher struct {
	moves  [maxCells][4]mdMove // by blank cell, in walkOrder
	tileAt [maxCells]uint8     // tile of each cell; the blank's cell is stale
	searchControl
}

// idaStarManhattan is idaStar for the Manhattan heuristic (h.manhattan).
// It searches the same tree in the same order as the general search with
// the single-tile databases, so it returns the same path and node count,
// and checks the context and the budget at the same points.
func idaStarManhattan(ctx context.Context, h *heuristic, b packed, blank int, opts Options) (string, int64, error) {
	s := &mdSearcher{searchControl: newControl(ctx, opts)}
	nb := neighbours(h.rows, h.cols)
	for c := 0; c < h.n; c++ {
		for k, to := range nb[c] {
			m := &s.moves[c][k]
			m.to = to
			if to < 0 {
				continue
			}
			for t := 1; t < h.n; t++ {
				m.dh[t] = int8(h.md[t][c]) - int8(h.md[t][to])
			}
		}
	}
	h0 := 0
	for c := 0; c < h.n; c++ {
		t := uint8(b.at(c))
		s.tileAt[c] = t
		if t != 0 {
			h0 += int(h.md[t][c])
		}
	}
	return s.iterate(h0, func() bool { return s.dfs(0, h0, blank, -1) })
}

// dfs searches below the current board, whose Manhattan distance is h and
// whose blank is at cell blank, at depth g, never moving the blank back to
// prev; it returns as searcher.dfs does. Children are counted and tested
// against the bound before any call, as there, so a pruned child costs a
// few instructions and no call. Cell numbers are masked to four bits so
// that the compiler drops the bounds checks.
func (s *mdSearcher) dfs(g, h, blank, prev int) bool {
	if h == 0 {
		s.path = s.path[:g]
		return true
	}
	if s.nodes >= s.nextPoll {
		if s.poll() {
			return true
		}
	}
	limit := s.bound - g - 1 // largest h a child may have
	moves := &s.moves[blank&(maxCells-1)]
	for k := range moves {
		m := &moves[k]
		to := int(m.to)
		if to < 0 || to == prev {
			continue
		}
		s.nodes++
		t := s.tileAt[to&(maxCells-1)]
		nh := h + int(m.dh[t&(maxCells-1)])
		if nh > limit {
			if f := g + 1 + nh; f < s.nextBound {
				s.nextBound = f
			}
			continue
		}
		s.tileAt[blank&(maxCells-1)] = t
		s.path[g] = walkOrder[k].name
		if s.dfs(g+1, nh, to, blank) {
			return true
		}
		s.tileAt[to&(maxCells-1)] = t
	}
	return false
}
