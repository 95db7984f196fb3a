package sliding

import (
	"context"
	"fmt"
	"math/bits"

	"github.com/puzzleq/puzzleq/solvers"
)

// maxGroups bounds the number of pattern groups of a heuristic (15 for the
// Manhattan distance, one group per tile).
const maxGroups = maxCells

// heuristic is a set of additive pattern databases partitioning the tiles
// of one shape, optionally with the reflected lookup of square boards.
type heuristic struct {
	rows, cols, n int
	groups        []*pdb
	groupOf       [maxCells]uint8            // group of each tile (tile 0 unused)
	md            *[maxCells][maxCells]uint8 // Manhattan distance by tile and cell
	// reflect enables the second lookup in the board reflected along the
	// main diagonal: tile t at cell c stands for tile reflTile[t] at cell
	// reflCell[c] of the reflected board.
	reflect  bool
	reflTile [maxCells]uint8
	reflCell [maxCells]uint8
	// manhattan marks the Manhattan distance as one single-tile database
	// per tile (manhattanHeuristic): idaStar then runs idaStarManhattan,
	// which never looks at the databases.
	manhattan bool
}

// newHeuristic assembles a heuristic from databases covering every tile of
// an R×C board exactly once.
func newHeuristic(rows, cols int, groups []*pdb, reflect bool) *heuristic {
	h := &heuristic{rows: rows, cols: cols, n: rows * cols, groups: groups, reflect: reflect && rows == cols,
		md: manhattanTable(rows, cols)}
	for g, p := range groups {
		for _, t := range p.tiles {
			h.groupOf[t] = uint8(g)
		}
	}
	for c := 0; c < h.n; c++ {
		h.reflCell[c] = uint8(c)
		if h.reflect {
			r, k := c/cols, c%cols
			h.reflCell[c] = uint8(k*cols + r)
		}
	}
	for t := 1; t < h.n; t++ {
		h.reflTile[t] = h.reflCell[t-1] + 1
	}
	return h
}

// memory returns the bytes held by the databases.
func (h *heuristic) memory() int64 {
	var m int64
	for _, p := range h.groups {
		m += int64(len(p.data))
	}
	return m
}

// lookup returns the moves of group g's tiles for the tile cells in pos:
// their Manhattan distance plus twice the stored excess.
func (h *heuristic) lookup(g int, pos *[maxCells]uint8) int {
	p := h.groups[g]
	var used uint32
	var idx uint32
	md := 0
	m := uint32(h.n)
	for _, t := range p.tiles {
		c := pos[t]
		md += int(h.md[t][c])
		idx = idx*m + uint32(c) - uint32(bits.OnesCount32(used&(1<<c-1)))
		m--
		used |= 1 << c
	}
	return md + 2*p.entry(idx)
}

// searcher is one IDA* run. All of its state is fixed-size arrays, so the
// search allocates nothing per node.
type searcher struct {
	h      *heuristic
	nb     [maxCells][4]int8 // neighbour cells in walkOrder, -1 off the board
	tileAt [maxCells]uint8
	pos    [maxCells]uint8 // cell of each tile
	rpos   [maxCells]uint8 // cell of each tile in the reflected board
	hg     [maxGroups]int  // entry of each group
	rg     [maxGroups]int  // entry of each group, reflected board
	hsum   int
	rsum   int
	blank  int
	searchControl
}

// searchControl is the state an IDA* run shares with its caller whatever
// the heuristic: the iteration's bounds, the path, the node count and the
// checks of the context and the budget made every pollEvery nodes.
type searchControl struct {
	ctx       context.Context
	maxNodes  int64
	nodes     int64
	nextPoll  int64
	nextProg  int64
	progress  func(bound int, nodes int64)
	bound     int
	nextBound int
	path      []byte
	err       error
}

// newControl returns the control of a run with opts' budget and progress.
func newControl(ctx context.Context, opts Options) searchControl {
	c := searchControl{ctx: ctx, progress: opts.Progress, maxNodes: opts.MaxNodes}
	if c.maxNodes <= 0 {
		c.maxNodes = DefaultMaxNodes
	}
	c.nextPoll = min(pollEvery, c.maxNodes+1)
	c.nextProg = progressEvery
	return c
}

// iterate runs the IDA* iterations from the bound h0: dfs searches one
// iteration (the root counted already), with c.bound set, and returns true
// when it found the goal, with c.path cut to the moves made, or stopped
// with c.err set.
func (c *searchControl) iterate(h0 int, dfs func() bool) (string, int64, error) {
	c.bound = h0
	for {
		if c.progress != nil {
			c.progress(c.bound, c.nodes)
		}
		if cap(c.path) < c.bound {
			c.path = make([]byte, c.bound)
		}
		c.path = c.path[:c.bound]
		c.nextBound = 1 << 30
		c.nodes++ // the root
		if dfs() {
			if c.err != nil {
				return "", c.nodes, c.err
			}
			return string(c.path), c.nodes, nil
		}
		if c.nodes > c.maxNodes {
			return "", c.nodes, fmt.Errorf("sliding: %w: more than %d nodes (bound %d)", solvers.ErrBudgetExceeded, c.maxNodes, c.bound)
		}
		if c.nextBound == 1<<30 {
			return "", c.nodes, fmt.Errorf("sliding: internal error: search space exhausted")
		}
		c.bound = c.nextBound
	}
}

// Poll and progress intervals, in nodes.
const (
	pollEvery     = 4096
	progressEvery = 1 << 20
)

func (s *searcher) value() int {
	if s.rsum > s.hsum {
		return s.rsum
	}
	return s.hsum
}

// idaStar solves a packed, solvable board of a shape h covers, returning
// the blank's moves in walkOrder letters and the number of nodes.
func idaStar(ctx context.Context, h *heuristic, b packed, blank int, opts Options) (string, int64, error) {
	if h.manhattan {
		return idaStarManhattan(ctx, h, b, blank, opts)
	}
	s := &searcher{h: h, blank: blank, searchControl: newControl(ctx, opts)}
	nb := neighbours(h.rows, h.cols)
	copy(s.nb[:], nb)
	for c := 0; c < h.n; c++ {
		t := uint8(b.at(c))
		s.tileAt[c] = t
		s.pos[t] = uint8(c)
		s.rpos[h.reflTile[t]] = h.reflCell[c]
	}
	for g := range h.groups {
		s.hg[g] = h.lookup(g, &s.pos)
		s.hsum += s.hg[g]
		if h.reflect {
			s.rg[g] = h.lookup(g, &s.rpos)
			s.rsum += s.rg[g]
		}
	}
	return s.iterate(s.value(), func() bool { return s.dfs(0, -1) })
}

// dfs searches below the current board, whose f = g + h is within the
// bound, at depth g (moves made so far), never moving the blank back to
// prev. It returns true when the goal is found (the path is in s.path) or
// the search must stop (s.err set). Children are counted as nodes and
// tested against the bound here, before any recursion, and the reflected
// lookup is made only for children the normal sum does not already prune:
// most generated nodes are pruned, so this saves a call and often a
// memory access per node. A child pruned by the normal sum alone offers
// g+1+hsum as a candidate for the next bound, possibly lower than its true
// f; a lower candidate is still a valid bound (h has the parity of the
// Manhattan distance either way, so it is the usual bound+2 in practice).
func (s *searcher) dfs(g int, prev int) bool {
	if s.hsum == 0 {
		// Every pattern, hence every tile, is home: the goal. (h is 0 at
		// the goal only, as the groups cover all tiles.)
		s.path = s.path[:g]
		return true
	}
	if s.nodes >= s.nextPoll {
		if s.poll() {
			return true
		}
	}
	h := s.h
	blank := s.blank
	limit := s.bound - g - 1 // largest h a child may have
	for k, to8 := range s.nb[blank] {
		to := int(to8)
		if to < 0 || to == prev {
			continue
		}
		s.nodes++
		t := s.tileAt[to]
		// Slide tile t from to into the blank's cell: first only the
		// tile's cell, which is all the lookup needs.
		s.pos[t] = uint8(blank)
		grp := int(h.groupOf[t])
		oh := s.hg[grp]
		nh := h.lookup(grp, &s.pos)
		if sum := s.hsum + nh - oh; sum > limit {
			s.pos[t] = uint8(to)
			if f := g + 1 + sum; f < s.nextBound {
				s.nextBound = f
			}
			continue
		}
		var rt uint8
		var rgrp, orh int
		if h.reflect {
			rt = h.reflTile[t]
			s.rpos[rt] = h.reflCell[blank]
			rgrp = int(h.groupOf[rt])
			orh = s.rg[rgrp]
			nrh := h.lookup(rgrp, &s.rpos)
			if sum := s.rsum + nrh - orh; sum > limit {
				s.rpos[rt] = h.reflCell[to]
				s.pos[t] = uint8(to)
				if f := g + 1 + sum; f < s.nextBound {
					s.nextBound = f
				}
				continue
			}
			s.rg[rgrp] = nrh
			s.rsum += nrh - orh
		}
		s.hg[grp] = nh
		s.hsum += nh - oh
		s.tileAt[blank], s.tileAt[to] = t, 0
		s.blank = to
		s.path[g] = walkOrder[k].name
		if s.dfs(g+1, blank) {
			return true
		}
		// Undo.
		s.blank = blank
		s.tileAt[blank], s.tileAt[to] = 0, t
		s.hsum += oh - nh
		s.hg[grp] = oh
		if h.reflect {
			s.rsum += orh - s.rg[rgrp]
			s.rg[rgrp] = orh
			s.rpos[rt] = h.reflCell[to]
		}
		s.pos[t] = uint8(to)
	}
	return false
}

// poll checks the context and the node budget and reports progress. It
// returns true (with s.err set) when the search must stop.
func (s *searchControl) poll() bool {
	s.nextPoll = min(s.nodes+pollEvery, s.maxNodes+1)
	if s.nodes > s.maxNodes {
		s.err = fmt.Errorf("sliding: %w: more than %d nodes (bound %d)", solvers.ErrBudgetExceeded, s.maxNodes, s.bound)
		return true
	}
	if err := s.ctx.Err(); err != nil {
		s.err = err
		return true
	}
	if s.progress != nil && s.nodes >= s.nextProg {
		s.nextProg = s.nodes + progressEvery
		s.progress(s.bound, s.nodes)
	}
	return false
}
