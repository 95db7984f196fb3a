package sweep

import (
	"context"
	"fmt"
	"math/bits"

	"github.com/puzzleq/puzzleq/solvers"
)

// DefaultMaxNodes is the node budget used when Options.MaxNodes is 0.
//
// Measured on 30x30 boards, a node costs 0.2-0.8µs of CPU (the most
// when every node floods), so 30 million nodes is at most about 25 s of
// CPU: under a minute even when a shared core runs at half speed. The
// hardest board in testdata/corpus needs about 58 thousand nodes and the
// 30x30 boards of BenchmarkLarge under 100 thousand each, so the margin
// is over two orders of magnitude.
const DefaultMaxNodes = 30_000_000

// pollEvery is how many nodes pass between two looks at ctx. A node
// costs at most a few microseconds, so cancellation is seen within a few
// milliseconds.
const pollEvery = 1024

// tuning switches prunings off one at a time, so that tests can check
// each is optimum-preserving and benchmarks can measure what it buys.
// The zero value enables everything.
type tuning struct {
	noConnectivity bool // skip the one-region check
	noDeadEnds     bool // skip the "at most one dead end" check
	noBound        bool // skip branch and bound (search every completion)
	noSymmetry     bool // try every start cell, even symmetric ones
	noOrdering     bool // try start cells in row-major order
	alwaysFlood    bool // run the flood fill even after rolls that cannot split the region
	noParity       bool // try start cells of both colours of the chessboard
	noBlocks       bool // skip the block-cut tree analysis of the board
}

// Solve returns the fewest rolls that visit every empty cell of p, the
// start cell and the rolls of one optimal game, or Moves -1 when no game
// visits every cell. It validates p first. It returns an error wrapping
// solvers.ErrBudgetExceeded when the search needs more than
// opts.MaxNodes nodes (DefaultMaxNodes when 0), and one wrapping
// ctx.Err() when ctx ends first.
func Solve(ctx context.Context, p Puzzle, opts Options) (Result, error) {
	return solve(ctx, p, opts, tuning{})
}

func solve(ctx context.Context, p Puzzle, opts Options, t tuning) (Result, error) {
	r, _, err := solveCount(ctx, p, opts, t)
	return r, err
}

// solveCount is solve that also reports the nodes searched, for the
// ablation measurements.
func solveCount(ctx context.Context, p Puzzle, opts Options, t tuning) (Result, int64, error) {
	if err := Validate(p); err != nil {
		return Result{}, 0, err
	}
	if ctx == nil {
		// Tolerated rather than a panic: no caller can cancel it anyway.
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return Result{}, 0, fmt.Errorf("sweep: %w", err)
	}
	s := newSearcher(ctx, p, opts, t)
	s.run()
	if s.err != nil {
		return Result{}, s.nodes, s.err
	}
	if s.best == noAnswer {
		return Result{Moves: -1, Start: nil, Path: ""}, s.nodes, nil
	}
	return Result{
		Moves: s.best,
		Start: []int{s.bestStart / stride, s.bestStart % stride},
		Path:  string(s.bestPath),
	}, s.nodes, nil
}

// stride packs a cell as row*stride+col; rows of the bitset are indexed
// row+1 so that rows 0 and n+1 stay empty and need no border tests.
const stride = 32

const noAnswer = 1 << 30

// chess[i&1] holds the "black" cells of bitset row i, those with an even
// (row+col) where row = i-1: odd columns in even rows i, even columns in
// odd ones.
var chess = [2]uint64{0xaaaaaaaaaaaaaaaa, 0x5555555555555555}

type searcher struct {
	ctx       context.Context
	t         tuning
	n, m      int
	empty     int
	free      [MaxSide + 2]uint64 // unvisited empty cells, row r at index r+1, column c at bit c
	comp      [MaxSide + 2]uint64 // scratch for the flood fill
	tgt       [MaxSide + 2]uint64 // scratch: the side cells a split test must find joined
	stack     []flood             // scratch for the flood fill, reused
	left      int                 // unvisited empty cells
	path      []byte
	best      int
	bestPath  []byte
	bestStart int
	start     int
	nodes     int64
	maxNodes  int64
	nextPoll  int64
	err       error
	board     [MaxSide + 2]uint64 // all empty cells
}

func newSearcher(ctx context.Context, p Puzzle, opts Options, t tuning) *searcher {
	s := &searcher{ctx: ctx, t: t, n: len(p.Board), m: len(p.Board[0]), best: noAnswer}
	s.maxNodes = opts.MaxNodes
	if s.maxNodes <= 0 {
		s.maxNodes = DefaultMaxNodes
	}
	s.nextPoll = min(pollEvery, s.maxNodes+1)
	for r, row := range p.Board {
		for c := 0; c < len(row); c++ {
			if row[c] == '.' {
				s.board[r+1] |= 1 << c
				s.empty++
			}
		}
	}
	s.path = make([]byte, 0, s.empty)
	return s
}

func (s *searcher) isEmpty(r, c int) bool {
	return r >= 0 && r < s.n && c >= 0 && c < s.m && s.board[r+1]>>c&1 == 1
}

// run tries every start cell that can matter, best candidates first, and
// shares the best answer between them so later starts are bounded by it.
func (s *searcher) run() {
	// Group start cells: dead ends (at most one empty neighbour) first,
	// since a complete game must start or end at each of them; then cells
	// where a roll cannot pass straight through, since some roll stops
	// there anyway; then the rest. Row-major inside each group.
	var groups [3][]int
	for r := 0; r < s.n; r++ {
		for c := 0; c < s.m; c++ {
			if !s.isEmpty(r, c) {
				continue
			}
			g := 2
			if !s.t.noOrdering {
				u, d, l, rt := s.isEmpty(r-1, c), s.isEmpty(r+1, c), s.isEmpty(r, c-1), s.isEmpty(r, c+1)
				deg := b2i(u) + b2i(d) + b2i(l) + b2i(rt)
				switch {
				case deg <= 1:
					g = 0
				case !(u && d) && !(l && rt):
					g = 1
				}
			}
			groups[g] = append(groups[g], r*stride+c)
		}
	}
	// A cell with at most one empty neighbour is an end of every complete
	// game (the dead-end rule at the root), so with more than two of them
	// there is no game, and with two the start is one of them.
	if !s.t.noDeadEnds && !s.t.noOrdering {
		switch {
		case len(groups[0]) > 2:
			return
		case len(groups[0]) == 2:
			groups[1], groups[2] = nil, nil
		}
	}
	// Colour the board like a chessboard. A game is a simple path over
	// every empty cell, alternating colours, so it starts on the colour
	// that has one cell more, and with more than one extra there is none.
	var black int
	for i := 1; i <= s.n; i++ {
		black += bits.OnesCount64(s.board[i] & chess[i&1])
	}
	white := s.empty - black
	if !s.t.noParity {
		switch {
		case black > white+1 || white > black+1:
			return
		case black != white:
			major := 0 // the colour (row+col)&1 of the majority
			if white > black {
				major = 1
			}
			for g := range groups {
				kept := groups[g][:0]
				for _, cell := range groups[g] {
					if (cell/stride+cell%stride)&1 == major {
						kept = append(kept, cell)
					}
				}
				groups[g] = kept
			}
		}
	}
	if !s.t.noBlocks {
		b := blockPool.Get().(*blockScratch)
		starts, restrict, ok := s.blockStarts(b)
		blockPool.Put(b)
		if !ok {
			return
		}
		if restrict {
			for g := range groups {
				kept := groups[g][:0]
				for _, cell := range groups[g] {
					if starts[cell/stride+1]>>(cell%stride)&1 != 0 {
						kept = append(kept, cell)
					}
				}
				groups[g] = kept
			}
		}
	}
	syms := s.symmetries()
	var tried [MaxSide * stride]bool
	for _, g := range groups {
		for _, cell := range g {
			if tried[cell] {
				continue
			}
			for _, f := range syms {
				tried[f(cell)] = true
			}
			s.tryStart(cell)
			if s.err != nil {
				return
			}
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// symmetries returns the maps of the board's rectangle onto itself that
// map empty cells onto empty cells (always including the identity). A
// game from cell x mirrors, roll by roll, into a game of the same length
// from f(x), so only one start cell per orbit needs searching.
func (s *searcher) symmetries() []func(int) int {
	n, m := s.n, s.m
	id := func(x int) int { return x }
	if s.t.noSymmetry {
		return []func(int) int{id}
	}
	cands := []func(int) int{
		func(x int) int { return (n-1-x/stride)*stride + x%stride },
		func(x int) int { return (x/stride)*stride + m - 1 - x%stride },
		func(x int) int { return (n-1-x/stride)*stride + m - 1 - x%stride },
	}
	if n == m {
		cands = append(cands,
			func(x int) int { return (x%stride)*stride + x/stride },
			func(x int) int { return (n-1-x%stride)*stride + n - 1 - x/stride },
			func(x int) int { return (x%stride)*stride + n - 1 - x/stride },
			func(x int) int { return (n-1-x%stride)*stride + x/stride },
		)
	}
	out := []func(int) int{id}
	for _, f := range cands {
		ok := true
		for r := 0; r < n && ok; r++ {
			for c := 0; c < m; c++ {
				if s.isEmpty(r, c) {
					y := f(r*stride + c)
					if !s.isEmpty(y/stride, y%stride) {
						ok = false
						break
					}
				}
			}
		}
		if ok {
			out = append(out, f)
		}
	}
	return out
}

func (s *searcher) tryStart(cell int) {
	s.free = s.board
	r, c := cell/stride, cell%stride
	s.free[r+1] &^= 1 << c
	s.left = s.empty - 1
	s.path = s.path[:0]
	s.start = cell
	s.dfs(r+1, c, 0, seg{kind: segFull})
}

// poll enforces the node budget exactly and looks at ctx every pollEvery
// nodes; it reports false, with s.err set, when the search must stop.
func (s *searcher) poll() bool {
	if s.nodes > s.maxNodes {
		s.err = fmt.Errorf("sweep: %w (limit %d nodes)", solvers.ErrBudgetExceeded, s.maxNodes)
		return false
	}
	if err := s.ctx.Err(); err != nil {
		s.err = fmt.Errorf("sweep: search stopped after %d nodes: %w", s.nodes, err)
		return false
	}
	s.nextPoll = min(s.nodes+pollEvery, s.maxNodes+1)
	return true
}

// seg is what a node knows about the roll that led to it, for the
// connectivity test: nothing (the root: flood everything), that the roll
// cannot have split the free cells, or the rolled segment, whose side
// cells must still be joined.
type seg struct {
	kind   uint8
	idx    int    // segRow: row index; segCol: column
	lo, hi int    // segCol: row indices of the segment
	mask   uint64 // segRow: the segment's bits
}

const (
	segFull uint8 = iota // flood the whole free set
	segKept              // the roll kept the free cells connected
	segRow               // a horizontal segment
	segCol               // a vertical segment
)

// dfs explores every game continuing from the ball at row index ri (row
// ri-1) and column c after moves rolls; sg describes the last roll.
func (s *searcher) dfs(ri, c, moves int, sg seg) {
	s.nodes++
	if s.nodes >= s.nextPoll && !s.poll() {
		return
	}
	if s.left == 0 {
		// Every cell is visited, so the ball is stuck: a complete game.
		if moves < s.best {
			s.best = moves
			s.bestStart = s.start
			s.bestPath = append(s.bestPath[:0], s.path...)
		}
		return
	}
	if !s.hopeful(ri, c, moves, sg) {
		return
	}
	bit := uint64(1) << c
	// Up.
	if s.free[ri-1]&bit != 0 {
		r := ri - 1
		for s.free[r]&bit != 0 {
			s.free[r] &^= bit
			r--
		}
		r++
		s.left -= ri - r
		s.path = append(s.path, 'U')
		s.dfs(r, c, moves+1, s.colSeg(r, ri-1, c))
		s.path = s.path[:len(s.path)-1]
		s.left += ri - r
		for k := r; k < ri; k++ {
			s.free[k] |= bit
		}
		if s.err != nil {
			return
		}
	}
	// Down.
	if s.free[ri+1]&bit != 0 {
		r := ri + 1
		for s.free[r]&bit != 0 {
			s.free[r] &^= bit
			r++
		}
		r--
		s.left -= r - ri
		s.path = append(s.path, 'D')
		s.dfs(r, c, moves+1, s.colSeg(ri+1, r, c))
		s.path = s.path[:len(s.path)-1]
		s.left += r - ri
		for k := ri + 1; k <= r; k++ {
			s.free[k] |= bit
		}
		if s.err != nil {
			return
		}
	}
	row := s.free[ri]
	// Left: the run of free cells just below bit c ends at the highest
	// occupied bit under c.
	if c > 0 && row>>(c-1)&1 != 0 {
		below := uint64(1)<<c - 1
		walls := ^row & below
		lo := 0
		if walls != 0 {
			lo = 64 - bits.LeadingZeros64(walls)
		}
		mask := below &^ (uint64(1)<<lo - 1)
		s.free[ri] &^= mask
		s.left -= c - lo
		s.path = append(s.path, 'L')
		s.dfs(ri, lo, moves+1, s.rowSeg(ri, mask))
		s.path = s.path[:len(s.path)-1]
		s.left += c - lo
		s.free[ri] |= mask
		if s.err != nil {
			return
		}
	}
	// Right: the run above bit c ends at the lowest occupied bit above c;
	// bits at or above m are never set, so there always is one.
	if row>>(c+1)&1 != 0 {
		upto := uint64(1)<<(c+1) - 1
		hi := bits.TrailingZeros64(^row &^ upto) // first wall above c
		mask := (uint64(1)<<hi - 1) &^ upto
		s.free[ri] &^= mask
		s.left -= hi - 1 - c
		s.path = append(s.path, 'R')
		s.dfs(ri, hi-1, moves+1, s.rowSeg(ri, mask))
		s.path = s.path[:len(s.path)-1]
		s.left += hi - 1 - c
		s.free[ri] |= mask
	}
}

// hopeful reports whether a game continuing from the ball at (ri, c)
// after moves rolls can still visit every free cell in fewer than s.best
// rolls. s.left > 0.
//
// The rest of any game is a simple path b, x1, ..., xk in the grid: b is
// the ball's cell and the xi are cells free now, because the ball stops
// before visited cells and never re-enters one. A complete game has
// {x1..xk} = all free cells. Call a neighbour of a free cell "open" when
// it is free or is b. Then:
//
//   - The free cells are one connected region (the xi are a path).
//   - Every xi but xk has two path neighbours, both open, so at most one
//     free cell has fewer than two open neighbours (it must be xk).
//   - If a free cell has no pair of opposite open neighbours, the ball
//     cannot roll straight through it, so some roll ends there. Rolls end
//     on distinct cells, so the game needs at least as many more rolls as
//     there are such cells, and at least one.
func (s *searcher) hopeful(ri, c, moves int, sg seg) bool {
	if s.best == noAnswer || s.t.noBound {
		// No bound to test yet: only the dead ends matter, and the
		// count can stop at the second.
		if !s.t.noDeadEnds && s.deadEnds(ri, c)+s.besideBall(ri, c) > 1 {
			return false
		}
		return s.joined(ri, c, sg)
	}
	ball := uint64(1) << c
	s.free[ri] |= ball
	stops, deadEnds := 0, 0
	for i := 1; i <= s.n; i++ {
		a := s.free[i]
		free := a
		if i == ri {
			free &^= ball
		}
		if free == 0 {
			continue
		}
		up, down, l, r := s.free[i-1], s.free[i+1], a<<1, a>>1
		straight := up&down | l&r
		stops += bits.OnesCount64(free &^ straight)
		two := straight | (up|down)&(l|r)
		deadEnds += bits.OnesCount64(free &^ two)
	}
	s.free[ri] &^= ball
	if !s.t.noDeadEnds && deadEnds+s.besideBall(ri, c) > 1 {
		return false
	}
	if !s.t.noBound {
		if stops < 1 {
			stops = 1
		}
		if moves+stops >= s.best {
			return false
		}
	}
	return s.joined(ri, c, sg)
}

// deadEnds counts the free cells with fewer than two open neighbours, as
// hopeful does, but stops at two.
func (s *searcher) deadEnds(ri, c int) int {
	ball := uint64(1) << c
	s.free[ri] |= ball
	deadEnds := 0
	for i := 1; i <= s.n && deadEnds < 2; i++ {
		a := s.free[i]
		free := a
		if i == ri {
			free &^= ball
		}
		if free == 0 {
			continue
		}
		up, down, l, r := s.free[i-1], s.free[i+1], a<<1, a>>1
		two := up&down | l&r | (up|down)&(l|r)
		deadEnds += bits.OnesCount64(free &^ two)
	}
	s.free[ri] &^= ball
	return deadEnds
}

// besideBall counts the ball's free neighbours whose only open
// neighbours are the ball and one free cell, less one. Such a cell w
// needs both of them on the path unless the game ends at w, so it is
// either the first cell of the next roll or the game's last cell. Only
// one cell is first, so all but one of them must be last, like the
// dead ends: the sum with the dead ends may be at most one.
func (s *searcher) besideBall(ri, c int) int {
	bit := uint64(1) << c
	k := 0
	if s.free[ri-1]&bit != 0 && s.freeNeighbours(ri-1, c) == 1 {
		k++
	}
	if s.free[ri+1]&bit != 0 && s.freeNeighbours(ri+1, c) == 1 {
		k++
	}
	if c > 0 && s.free[ri]&(bit>>1) != 0 && s.freeNeighbours(ri, c-1) == 1 {
		k++
	}
	if s.free[ri]&(bit<<1) != 0 && s.freeNeighbours(ri, c+1) == 1 {
		k++
	}
	return max(k-1, 0)
}

// freeNeighbours counts the free neighbours of the cell at row index ri,
// column c.
func (s *searcher) freeNeighbours(ri, c int) int {
	bit := uint64(1) << c
	n := int(s.free[ri-1]>>c&1 + s.free[ri+1]>>c&1)
	return n + bits.OnesCount64(s.free[ri]&(bit<<1|bit>>1))
}

// joined applies the connectivity test that sg calls for.
func (s *searcher) joined(ri, c int, sg seg) bool {
	if s.t.noConnectivity || sg.kind == segKept && !s.t.alwaysFlood {
		return true
	}
	if sg.kind == segFull || s.t.alwaysFlood {
		return s.connected(ri, c)
	}
	return s.sideJoined(&sg)
}

// Skipping the flood fill. Every expanded node has its free cells
// connected (the root is flooded, and a child is flooded unless the test
// below shows the roll kept them connected). A roll removes a straight
// segment S from the free set F. The cells of F\S next to S lie only
// beside it: the cell past its far end stopped the roll, and the cell
// before its near end is where the ball was. If those side cells all lie
// in one run of one neighbouring row (or column), any path in F through S
// can be rerouted along that run, so F\S stays connected and flooding it
// would find nothing. Otherwise the flood decides.

// rowSeg describes a horizontal roll over mask in row index ri, after
// it, for the child's connectivity test.
func (s *searcher) rowSeg(ri int, mask uint64) seg {
	if s.rowKeepsConnected(ri, mask) {
		return seg{kind: segKept}
	}
	return seg{kind: segRow, idx: ri, mask: mask}
}

// colSeg describes a vertical roll over row indices lo..hi of column c.
func (s *searcher) colSeg(lo, hi, c int) seg {
	if s.colKeepsConnected(lo, hi, c) {
		return seg{kind: segKept}
	}
	return seg{kind: segCol, idx: c, lo: lo, hi: hi}
}

// rowKeepsConnected applies that test to a horizontal segment mask in
// row index ri, after the roll.
func (s *searcher) rowKeepsConnected(ri int, mask uint64) bool {
	up, down := s.free[ri-1]&mask, s.free[ri+1]&mask
	return up == 0 && oneRun(down) || down == 0 && oneRun(up)
}

// colKeepsConnected applies it to a vertical segment in column c, row
// indices lo..hi, gathering each side column into a word.
func (s *searcher) colKeepsConnected(lo, hi, c int) bool {
	var l, r uint64
	for k := lo; k <= hi; k++ {
		if c > 0 {
			l |= (s.free[k] >> (c - 1) & 1) << k
		}
		r |= (s.free[k] >> (c + 1) & 1) << k
	}
	return l == 0 && oneRun(r) || r == 0 && oneRun(l)
}

// oneRun reports whether the set bits of x are contiguous (or none).
func oneRun(x uint64) bool {
	if x == 0 {
		return true
	}
	y := x >> bits.TrailingZeros64(x)
	return y&(y+1) == 0
}

// connected reports whether the free cells form one region touching the
// ball at (ri, c). It floods from one free neighbour of the ball with
// whole-row bit operations, sweeping down and up until nothing grows.
func (s *searcher) connected(ri, c int) bool {
	bit := uint64(1) << c
	var sr int
	var seed uint64
	switch {
	case s.free[ri-1]&bit != 0:
		sr, seed = ri-1, bit
	case s.free[ri+1]&bit != 0:
		sr, seed = ri+1, bit
	case s.free[ri]&(bit<<1|bit>>1) != 0:
		sr, seed = ri, s.free[ri]&(bit<<1|bit>>1)&-(s.free[ri]&(bit<<1|bit>>1))
	default:
		return false // stuck with cells left
	}
	comp := &s.comp
	for i := 0; i <= s.n+1; i++ {
		comp[i] = 0
	}
	// Each stack entry is a row and the runs just added to it; a run is
	// added once, so the work is linear in the number of runs.
	stack := s.stack[:0]
	add := rowFill(s.free[sr], seed)
	comp[sr] = add
	cnt := bits.OnesCount64(add)
	stack = append(stack, flood{sr, add})
	for len(stack) > 0 {
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, j := range [2]int{top.row - 1, top.row + 1} {
			if g := top.bits & s.free[j] &^ comp[j]; g != 0 {
				add := rowFill(s.free[j], g)
				comp[j] |= add
				cnt += bits.OnesCount64(add)
				stack = append(stack, flood{j, add})
			}
		}
	}
	s.stack = stack
	return cnt == s.left
}

// sideJoined is the connectivity test after a roll over segment sg that
// the local test could not settle. The free set F was connected before
// the roll, so F\S is connected iff S's side cells (its free
// neighbours, which lie beside it) are all in one component of F\S: any
// path of F through S enters and leaves S at side cells and can be
// rerouted between them. So the flood starts at one side cell and stops
// as soon as it has reached all of them, which is usually long before it
// has covered F. Unlike connected it does not ask whether the ball has
// a free neighbour; when it has none it has no roll either, so the node
// ends with no child in both cases, and node counts agree with flooding
// everything (TestFloodSkipLosesNothing).
func (s *searcher) sideJoined(sg *seg) bool {
	tgt := &s.tgt
	need := 0
	var sr int
	var seed uint64
	if sg.kind == segRow {
		i := sg.idx
		u, d := s.free[i-1]&sg.mask, s.free[i+1]&sg.mask
		tgt[i-1], tgt[i+1] = u, d
		need = bits.OnesCount64(u) + bits.OnesCount64(d)
		if u != 0 {
			sr, seed = i-1, u&-u
		} else {
			sr, seed = i+1, d&-d
		}
	} else {
		side := uint64(1)<<(sg.idx+1) | uint64(1)<<sg.idx>>1
		for k := sg.lo; k <= sg.hi; k++ {
			t := s.free[k] & side
			tgt[k] = t
			if t != 0 {
				if need == 0 {
					sr, seed = k, t&-t
				}
				need += bits.OnesCount64(t)
			}
		}
	}
	ok := need == 0 || s.floodTo(sr, seed, need)
	if sg.kind == segRow {
		tgt[sg.idx-1], tgt[sg.idx+1] = 0, 0
	} else {
		for k := sg.lo; k <= sg.hi; k++ {
			tgt[k] = 0
		}
	}
	return ok
}

// floodTo floods the free cells from seed in row index sr, as connected
// does, and reports whether it reaches need cells of s.tgt.
func (s *searcher) floodTo(sr int, seed uint64, need int) bool {
	comp, tgt := &s.comp, &s.tgt
	for i := 0; i <= s.n+1; i++ {
		comp[i] = 0
	}
	stack := s.stack[:0]
	add := rowFill(s.free[sr], seed)
	comp[sr] = add
	need -= bits.OnesCount64(add & tgt[sr])
	stack = append(stack, flood{sr, add})
	for len(stack) > 0 && need > 0 {
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, j := range [2]int{top.row - 1, top.row + 1} {
			if g := top.bits & s.free[j] &^ comp[j]; g != 0 {
				add := rowFill(s.free[j], g)
				comp[j] |= add
				need -= bits.OnesCount64(add & tgt[j])
				stack = append(stack, flood{j, add})
			}
		}
	}
	s.stack = stack[:0]
	return need <= 0
}

type flood struct {
	row  int
	bits uint64
}

// rowFill returns the runs of set bits of row that contain a bit of seed
// (seed ⊆ row), by occluded fill in both directions: each step doubles
// the distance covered, and runs are at most MaxSide long.
func rowFill(row, seed uint64) uint64 {
	g, p := seed, row
	g |= p & (g << 1)
	p &= p << 1
	g |= p & (g << 2)
	p &= p << 2
	g |= p & (g << 4)
	p &= p << 4
	g |= p & (g << 8)
	p &= p << 8
	g |= p & (g << 16)
	h, q := g, row
	h |= q & (h >> 1)
	q &= q >> 1
	h |= q & (h >> 2)
	q &= q >> 2
	h |= q & (h >> 4)
	q &= q >> 4
	h |= q & (h >> 8)
	q &= q >> 8
	h |= q & (h >> 16)
	return h
}
