package fill

import (
	"context"
	"encoding/binary"
	"math/bits"
	"sync"
)

// A transformation is numbered t = 4·flip + k: mirror left-to-right when
// flip is 1, then turn k quarter turns clockwise. lin holds its linear
// part: x = xr·r + xc·c, y = yr·r + yc·c, before the translation that
// brings the bounding box back to the origin (see affine).
type lin struct{ xr, xc, yr, yc int32 }

var lins = [8]lin{
	{1, 0, 0, 1},   // 0°: (r, c)
	{0, 1, -1, 0},  // 90°: (c, h-1-r)
	{-1, 0, 0, -1}, // 180°: (h-1-r, w-1-c)
	{0, -1, 1, 0},  // 270°: (w-1-c, r)
	{1, 0, 0, -1},  // mirror: (r, w-1-c)
	{0, -1, -1, 0}, // mirror, 90°: (w-1-c, h-1-r)
	{-1, 0, 0, 1},  // mirror, 180°: (h-1-r, c)
	{0, 1, 1, 0},   // mirror, 270°: (c, r)
}

var (
	// composeT[g][f] is "f, then g".
	composeT [8][8]uint8
	inverseT [8]uint8
	// hashA and hashB are the fixed pseudo-random tables of the shape
	// hash Σ hashA[x]·hashB[y]. Fixed, not per process, so that which of
	// several equivalent rotations a placement reports never varies.
	hashA, hashB [MaxSide]uint64
)

func init() {
	for g := range 8 {
		for f := range 8 {
			G, F := lins[g], lins[f]
			m := lin{
				G.xr*F.xr + G.xc*F.yr, G.xr*F.xc + G.xc*F.yc,
				G.yr*F.xr + G.yc*F.yr, G.yr*F.xc + G.yc*F.yc,
			}
			for t := range 8 {
				if lins[t] == m {
					composeT[g][f] = uint8(t)
				}
			}
		}
	}
	for t := range 8 {
		for u := range 8 {
			if composeT[u][t] == 0 {
				inverseT[t] = uint8(u)
			}
		}
	}
	x := uint64(0x243f6a8885a308d3)
	for i := range MaxSide {
		// Odd values keep every product informative in the low bits.
		hashA[i] = splitmix(&x) | 1
		hashB[i] = splitmix(&x) | 1
	}
}

func splitmix(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// offsets[t] is affine's translation as coefficients of h-1 and w-1:
// ox = xh·(h-1) + xw·(w-1), oy = yh·(h-1) + yw·(w-1).
var offsets [8]struct{ xh, xw, yh, yw int32 }

func init() {
	for t := range uint8(8) {
		// With h = 1 and w = 2 (and h = 2, w = 1) each coefficient shows.
		ox1, oy1, _, _ := affine(t, 1, 2)
		ox2, oy2, _, _ := affine(t, 2, 1)
		offsets[t].xw, offsets[t].yw = ox1, oy1
		offsets[t].xh, offsets[t].yh = ox2, oy2
	}
}

// affine returns the translation of transformation t applied to an h×w
// bounding box and the dimensions of the result.
func affine(t uint8, h, w int32) (ox, oy, oh, ow int32) {
	l := lins[t]
	if l.xr < 0 {
		ox = h - 1
	}
	if l.xc < 0 {
		ox = w - 1
	}
	if l.yr < 0 {
		oy = h - 1
	}
	if l.yc < 0 {
		oy = w - 1
	}
	if l.xr != 0 {
		return ox, oy, h, w
	}
	return ox, oy, w, h
}

// comp is one group of cells: a hole or a piece.
//
// A 1000×1000 solve has a few hundred thousand groups, written by flood
// and read three times after, so the bounding box, below MaxSide, takes
// 16 bits a coordinate and a group 28 bytes.
type comp struct {
	start, n int32 // cells[start : start+n], row-major first cell first
	// class and rank, for holes: the hole's class and how many holes came
	// before it in that class.
	class, rank      int32
	minr, minc, h, w int16 // bounding box
	t                uint8 // transformation onto the class's canonical form (pieces: large ones only)
}

// class is a set of congruent holes. The first hole is the representative:
// rep's cells under transformation rep.t are the canonical form.
type class struct {
	hash    uint64
	n, h, w int32
	rep     int32
	holes   int32 // holes in the class
	pieces  int32 // pieces placed so far (at most holes)
	base    int32 // the class's first entry in solver.order
	cbase   int32 // small classes: the class's first cell in the copies (see pieceCopy)
}

// key identifies a canonical form up to hash collisions.
type key struct {
	hash uint64
	n    int32
}

// solver holds the flat buffers of one solve; they are pooled so that
// repeated solves do not allocate.
type solver struct {
	rows, cols, wp int
	board, table   []uint8 // padded grids, 1 = cell still to be grouped
	label          []int32 // padded board: hole id + 1
	hcells, pcells []uint32
	holes, pieces  []comp
	classes        []class
	slots          []int32
	shift          uint
	small          []smallSlot // exact table of the small classes
	sshift         uint
	labelled       []int32     // holes whose cells carry labels, cleared after the solve
	order          []pieceCopy // one per hole, grouped by class, in rank order: the piece that fills it
	copied         int32       // the board bytes set aside for small pieces' cell copies (every small hole's cells): result clears them
	dirty          bool        // board or table may hold 1s: clear them before reuse
	forms          [2][formSize]formEntry
}

// formSize is the number of entries of the canonical-form cache.
const (
	formBits = 10
	formSize = 1 << formBits
)

// formEntry caches canonSmall for one bitmap. The function is pure, so the
// cache (one per solver, for 4 and 8 transformations) is never cleared;
// 0 is no group's bitmap, so zeroed entries never match.
type formEntry struct {
	raw, canon uint64
	t          uint8
}

// pieceCopy is what result needs about a placed piece. match copies it
// to the slot of the hole the piece fills, so that result reads it in
// hole order, and packs it in 32 bits, because match writes these slots
// in as many interleaved streams as there are classes, and each new cache
// line of them costs a trip to memory. A small piece's copy is its
// bounding box corner (coordinates are below MaxSide < 1<<10), its
// height and width less 1 (below 8) and its transformation; its cells
// are copied too, one byte each (8·row + col in its bounding box, as in
// bitmap), into the board buffer, which the flood has left all 0: the
// class's cells start at cbase and the hole of rank k gets n of them at
// cbase + k·n. A large piece's copy is its index: there are few large
// pieces and each has many cells, so reading them out of order costs
// little.
type pieceCopy uint32

// smallCopy's 10-bit coordinates need MaxSide <= 1<<10: this fails to
// compile otherwise.
var _ = [1]struct{}{}[(MaxSide-1)>>10]

func smallCopy(p *comp, t uint8) pieceCopy {
	return pieceCopy(uint32(p.minr) | uint32(p.minc)<<10 | uint32(p.h-1)<<20 | uint32(p.w-1)<<23 | uint32(t)<<26)
}

// small unpacks a small piece's copy.
func (c pieceCopy) small() (minr, minc, h, w int32, t uint8) {
	return int32(c & 1023), int32(c >> 10 & 1023), int32(c>>20&7) + 1, int32(c>>23&7) + 1, uint8(c >> 26 & 7)
}

// smallSlot is one slot of the table of small classes: the canonical
// bitmap (0: empty) and the class.
type smallSlot struct {
	key uint64
	ci  int32
}

var pool = sync.Pool{New: func() any { return new(solver) }}

func (s *solver) reset(rows, cols int) {
	s.rows, s.cols, s.wp = rows, cols, cols+2
	n := (rows + 2) * (cols + 2)
	s.board = grow(s.board, n)
	s.table = grow(s.table, n)
	s.label = grow(s.label, n)
	// The border must read as "not a cell". A finished flood leaves both
	// grids all 0 (it clears every cell it groups) and result clears what
	// match copied into the board (see pieceCopy), so only a solve that
	// stopped early leaves work here. Labels are kept all 0 between solves
	// (see clearLabels), because verify trusts them.
	// The whole capacity, not just this solve's part: a later, larger
	// solve reslices into it without clearing.
	if s.dirty {
		clear(s.board[:cap(s.board)])
		clear(s.table[:cap(s.table)])
	}
	s.dirty = true
	// Four spare slots for flood's speculative writes.
	s.hcells = grow(s.hcells, rows*cols+4)
	s.pcells = grow(s.pcells, rows*cols+4)
	s.holes = s.holes[:0]
	s.pieces = s.pieces[:0]
	s.classes = s.classes[:0]
}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// Solve finds the largest number of board cells the table's pieces can
// fill. It validates p first (returning a *solvers.InputError) and returns
// ctx.Err() if ctx ends during the solve. Placements are deterministic and
// listed in row-major order of the holes' first cells; within a shape
// class the k-th piece (in row-major order of first cells) goes into the
// k-th hole, which is the pairing the textbook greedy makes.
func Solve(ctx context.Context, p Puzzle, opts Options) (Result, error) {
	s := pool.Get().(*solver)
	defer pool.Put(s)
	return s.solve(ctx, p, opts)
}

// solve is Solve on a given solver.
func (s *solver) solve(ctx context.Context, p Puzzle, opts Options) (Result, error) {
	if err := validate(p, s); err != nil {
		return Result{}, err
	}
	if ctx == nil {
		// A nil context is a caller bug, but Solve must not panic.
		ctx = context.Background()
	}
	done := ctx.Done()
	var err error
	if s.holes, err = s.flood(done, s.board, s.hcells, s.holes); err != nil {
		return Result{}, ctx.Err()
	}
	if s.pieces, err = s.flood(done, s.table, s.pcells, s.pieces); err != nil {
		return Result{}, ctx.Err()
	}
	defer s.clearLabels()
	nt := 4
	if opts.AllowFlip {
		nt = 8
	}
	if err := s.classify(done, nt); err != nil {
		return Result{}, ctx.Err()
	}
	filled, placed, err := s.match(done, nt)
	if err == nil && stopAfterMatch != nil && stopAfterMatch(placed) {
		err = doneError{}
	}
	if err != nil {
		return Result{}, ctx.Err()
	}
	return s.result(filled, placed), nil
}

// stopAfterMatch, when set, is asked after match whether the solve stops
// there, as one canceled at the end of match does: with the small pieces'
// copies left in the board. A variable so that tests can stop a solve at
// the one point a cancel cannot be timed to reach.
var stopAfterMatch func(placed int) bool

// doneError reports that ctx ended; Solve turns it into ctx.Err().
type doneError struct{}

func (doneError) Error() string { return "done" }

func isDone(done <-chan struct{}) bool {
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// flood groups the cells marked 1 in grid into 4-connected components,
// clearing them as it goes. It is a breadth-first search that uses the
// output cell list as its queue, so it needs neither recursion nor a
// separate stack. Cells are packed as r<<16 | c. It records each group's
// bounding box on the way (the first cell is the row-major first, so it
// holds the top row).
func (s *solver) flood(done <-chan struct{}, grid []uint8, cells []uint32, comps []comp) ([]comp, error) {
	wp := s.wp
	n := 0
	for r := 0; r < s.rows; r++ {
		if isDone(done) {
			return comps, doneError{}
		}
		row := grid[(r+1)*wp+1 : (r+1)*wp+1+s.cols]
		for c := 0; ; c++ {
			// Jump to the next marked cell eight cells at a time: most
			// cells are unmarked or were cleared by an earlier search,
			// and a branch per cell would mostly be mispredicted.
			for c+8 <= len(row) && binary.LittleEndian.Uint64(row[c:]) == 0 {
				c += 8
			}
			if c+8 <= len(row) {
				c += bits.TrailingZeros64(binary.LittleEndian.Uint64(row[c:])) >> 3
			} else {
				for c < len(row) && row[c] == 0 {
					c++
				}
				if c == len(row) {
					break
				}
			}
			row[c] = 0
			start := n
			// The first cell needs no load from the queue, and its upper
			// and left neighbours, scanned already, are never marked.
			i := (r+1)*wp + c + 1
			down, right := int(grid[i+wp]), int(grid[i+1])
			grid[i+wp], grid[i+1] = 0, 0
			v := uint32(r)<<16 | uint32(c)
			cells[n] = v
			n++
			cells[n] = v + 1<<16
			n += down
			cells[n] = v + 1
			n += right
			minc, maxc, maxr := uint32(c), uint32(c), uint32(r)
			for head := start + 1; head < n; head++ {
				if head&4095 == 4095 && isDone(done) {
					return comps, doneError{}
				}
				v := cells[head]
				vr, vc := v>>16, v&0xffff
				maxr, minc, maxc = max(maxr, vr), min(minc, vc), max(maxc, vc)
				i := int(vr+1)*wp + int(vc) + 1
				// Branch-free: write each neighbour speculatively and
				// advance n only if it was marked. Whether a neighbour is
				// marked is close to random, so branches here would be
				// mispredicted about half the time. The four loads come
				// first so that they overlap instead of each waiting for
				// the previous store. Clearing an unmarked cell is
				// harmless, and cells has four spare slots.
				up, down, left, right := int(grid[i-wp]), int(grid[i+wp]), int(grid[i-1]), int(grid[i+1])
				grid[i-wp], grid[i+wp], grid[i-1], grid[i+1] = 0, 0, 0, 0
				cells[n] = v - 1<<16
				n += up
				cells[n] = v + 1<<16
				n += down
				cells[n] = v - 1
				n += left
				cells[n] = v + 1
				n += right
			}
			comps = append(comps, comp{
				start: int32(start), n: int32(n - start),
				minr: int16(r), minc: int16(minc), h: int16(int(maxr) - r + 1), w: int16(maxc-minc) + 1,
			})
		}
	}
	return comps, nil
}

// shape returns the hash of c's normalised cell set under each of the
// first nt transformations, in one pass over its cells.
func (s *solver) shape(c *comp, cells []uint32, nt int, hs *[8]uint64) {
	cs := cells[c.start : c.start+c.n]
	minr, minc, h, w := int32(c.minr), int32(c.minc), int32(c.h), int32(c.w)
	// Coordinates after each transformation, normalised: with p, q the
	// local row and column and P, Q their mirrors, t0..t7 map (p, q) to
	// (p,q) (q,P) (P,Q) (Q,p) (p,Q) (Q,P) (P,q) (q,p); see lins.
	var h0, h1, h2, h3, h4, h5, h6, h7 uint64
	for _, v := range cs {
		p, q := int32(v>>16)-minr, int32(v&0xffff)-minc
		P, Q := h-1-p, w-1-q
		ap, aq, aP, aQ := hashA[p], hashA[q], hashA[P], hashA[Q]
		bp, bq, bP, bQ := hashB[p], hashB[q], hashB[P], hashB[Q]
		h0 += ap * bq
		h1 += aq * bP
		h2 += aP * bQ
		h3 += aQ * bp
		if nt == 8 {
			h4 += ap * bQ
			h5 += aQ * bP
			h6 += aP * bq
			h7 += aq * bp
		}
	}
	*hs = [8]uint64{h0, h1, h2, h3, h4, h5, h6, h7}
}

// canon picks the canonical key: the smallest hash over the allowed
// transformations, with the cell count. Congruent shapes have the same set
// of transformed forms and so the same key. It is a plain argmin (no
// tie-breaking by dimensions) so that it compiles to conditional moves:
// which transformation wins is data-dependent and a branch would often be
// mispredicted. Ties between different forms are hash collisions, which
// find resolves.
func canon(c *comp, hs *[8]uint64, nt int) (key, uint8) {
	bt, best := 0, hs[0]
	for t := 1; t < nt; t++ {
		if h := hs[t]; h < best {
			bt, best = t, h
		}
	}
	return key{best, c.n}, uint8(bt)
}

// dims is the height and width of an h×w box after transformation t:
// the odd ones turn it a quarter.
func dims(t uint8, h, w int32) (int32, int32) {
	if t&1 == 1 {
		return w, h
	}
	return h, w
}

// find looks for the class of c. It returns the class, the transformation
// that maps c exactly onto the class's canonical form, and, when no class
// matched, the empty slot where a new class with this key belongs. With
// skipFull it ignores classes that have no empty hole left, which cannot
// take a piece anyway.
//
// bt, the transformation canon chose, is tried first: unless hashes
// collide it is the one that fits. Otherwise every transformation with the
// key's hash and the class's dimensions is a candidate, so a collision
// never hides a match.
func (s *solver) find(c *comp, cells []uint32, hs *[8]uint64, nt int, k key, bt uint8, skipFull bool) (int32, uint8, int) {
	if len(s.slots) == 0 {
		return -1, 0, 0 // no large class
	}
	mask := len(s.slots) - 1
	slot := int((k.hash*0x9e3779b97f4a7c15)>>s.shift) & mask
	for ; s.slots[slot] >= 0; slot = (slot + 1) & mask {
		ci := s.slots[slot]
		cl := &s.classes[ci]
		if cl.hash != k.hash || cl.n != k.n || skipFull && cl.pieces >= cl.holes {
			continue
		}
		if oh, ow := dims(bt, int32(c.h), int32(c.w)); oh == cl.h && ow == cl.w && s.verify(c, cells, bt, cl) {
			return ci, bt, slot
		}
		for t := range uint8(nt) {
			if t == bt || hs[t] != k.hash {
				continue
			}
			if oh, ow := dims(t, int32(c.h), int32(c.w)); oh != cl.h || ow != cl.w {
				continue
			}
			if s.verify(c, cells, t, cl) {
				return ci, t, slot
			}
		}
	}
	return -1, 0, slot
}

// verify reports whether c under transformation t is exactly the
// canonical form of cl. Composing t with the inverse of the
// representative's transformation gives an affine map from c's cells to
// board indices inside the representative's bounding box; c matches iff
// every image carries the representative's label (the sizes are equal, so
// no cell can be missed).
func (s *solver) verify(c *comp, cells []uint32, t uint8, cl *class) bool {
	rep := &s.holes[cl.rep]
	g := composeT[inverseT[rep.t]][t]
	ox, oy, _, _ := affine(g, int32(c.h), int32(c.w))
	l := lins[g]
	wp := s.wp
	kr := int(l.xr)*wp + int(l.yr)
	kc := int(l.xc)*wp + int(l.yc)
	k0 := int(int32(rep.minr)+1+ox)*wp + int(int32(rep.minc)+1+oy) - kr*int(c.minr) - kc*int(c.minc)
	want := cl.rep + 1
	for _, v := range cells[c.start : c.start+c.n] {
		if s.label[k0+kr*int(v>>16)+kc*int(v&0xffff)] != want {
			return false
		}
	}
	return true
}

// smallSide bounds the shapes that get exact bitmap keys: a group whose
// bounding box fits smallSide×smallSide (at most 8, one bit per cell of a
// uint64) is keyed by its canonical bitmap; larger groups take the hash
// path. A variable so that tests can send every group down the hash path.
var smallSide int32 = 8

func (s *solver) isSmall(c *comp) bool {
	return int32(c.h) <= smallSide && int32(c.w) <= smallSide
}

// bitmap is c's normalised cell set as an 8×8 bitmap, bit 8·row + col.
// Cells are packed r<<16 | c, so v - (minr<<16 | minc) is dr<<16 | dc
// with dc < 8, and dr<<3 | dc is one shift and one OR away.
func bitmap(c *comp, cells []uint32) uint64 {
	base := uint32(c.minr)<<16 | uint32(c.minc)
	var bm uint64
	for _, v := range cells[c.start : c.start+c.n] {
		d := v - base
		bm |= 1 << (d>>13 | d&7)
	}
	return bm
}

// transpose8 mirrors an 8×8 bitmap in its main diagonal: (r, c) → (c, r).
func transpose8(x uint64) uint64 {
	t := 0x0f0f0f0f00000000 & (x ^ x<<28)
	x ^= t ^ t>>28
	t = 0x3333000033330000 & (x ^ x<<14)
	x ^= t ^ t>>14
	t = 0x5500550055005500 & (x ^ x<<7)
	return x ^ t ^ t>>7
}

// mirror8 reverses the bits of every byte: column c → 7-c.
func mirror8(x uint64) uint64 {
	x = x>>1&0x5555555555555555 | x&0x5555555555555555<<1
	x = x>>2&0x3333333333333333 | x&0x3333333333333333<<2
	return x>>4&0x0f0f0f0f0f0f0f0f | x&0x0f0f0f0f0f0f0f0f<<4
}

// canonSmall returns the canonical form of a small shape, the smallest of
// its normalised bitmaps under the allowed transformations, and the
// transformation that gives it. The bitmap is the shape itself, so equal
// keys mean congruent shapes: no collisions, no verification. With P, Q
// the mirrored row and column, the forms are built from the bitmap bm of
// (p, q) by reversing the rows (bswap) or the columns (mirror8) of the
// 8×8 box, shifting back to the origin, and transposing.
func canonSmall(bm uint64, h, w int32, nt int) (uint64, uint8) {
	sh, sw := uint(8*(8-h)), uint(8-w)
	m := mirror8(bm)
	x6 := bits.ReverseBytes64(bm) >> sh       // (P, q)
	x4 := m >> sw                             // (p, Q)
	x2 := bits.ReverseBytes64(m) >> (sh + sw) // (P, Q)
	x1 := transpose8(x6)                      // (q, P)
	x3 := transpose8(x4)                      // (Q, p)
	bt, best := uint8(0), bm
	if x1 < best {
		bt, best = 1, x1
	}
	if x2 < best {
		bt, best = 2, x2
	}
	if x3 < best {
		bt, best = 3, x3
	}
	if nt == 8 {
		if x4 < best {
			bt, best = 4, x4
		}
		if x5 := transpose8(x2); x5 < best { // (Q, P)
			bt, best = 5, x5
		}
		if x6 < best {
			bt, best = 6, x6
		}
		if x7 := transpose8(bm); x7 < best { // (q, p)
			bt, best = 7, x7
		}
	}
	return best, bt
}

// canonCached is canonSmall through the solver's direct-mapped cache.
// The same few shapes in the same few orientations make up most groups,
// and a cache hit (a multiply and one compare) costs a fraction of the
// transforms.
func (s *solver) canonCached(bm uint64, h, w int32, nt int) (uint64, uint8) {
	e := &s.forms[nt>>3&1][(bm*0x9e3779b97f4a7c15)>>(64-formBits)]
	if e.raw == bm {
		return e.canon, e.t
	}
	k, t := canonSmall(bm, h, w, nt)
	*e = formEntry{raw: bm, canon: k, t: t}
	return k, t
}

// findSmall returns the slot of key in the table of small classes: the
// one holding it, or the empty one where it belongs.
func (s *solver) findSmall(key uint64) int {
	mask := len(s.small) - 1
	slot := int((key*0x9e3779b97f4a7c15)>>s.sshift) & mask
	for s.small[slot].key != 0 && s.small[slot].key != key {
		slot = (slot + 1) & mask
	}
	return slot
}

// tableSize returns a power of two at least twice n and the shift that
// takes the top bits of a 64-bit product to an index.
func tableSize(n int) (int, uint) {
	size := 4
	for size < 2*n {
		size *= 2
	}
	shift := uint(64)
	for 1<<(64-shift) < size {
		shift--
	}
	return size, shift
}

// label writes hole i's id + 1 under its cells, for verify. Only the
// representatives of large classes are labelled; clearLabels undoes it.
func (s *solver) labelHole(i int) {
	h := &s.holes[i]
	wp := s.wp
	for _, v := range s.hcells[h.start : h.start+h.n] {
		s.label[int(v>>16+1)*wp+int(v&0xffff)+1] = int32(i) + 1
	}
	s.labelled = append(s.labelled, int32(i))
}

// clearLabels restores the all-zero labels that the next solve relies on.
func (s *solver) clearLabels() {
	wp := s.wp
	for _, i := range s.labelled {
		h := &s.holes[i]
		for _, v := range s.hcells[h.start : h.start+h.n] {
			s.label[int(v>>16+1)*wp+int(v&0xffff)+1] = 0
		}
	}
	s.labelled = s.labelled[:0]
}

// classify sorts the holes into classes of congruent shapes.
func (s *solver) classify(done <-chan struct{}, nt int) error {
	var size int
	size, s.sshift = tableSize(len(s.holes))
	// Key 0 (no group's bitmap) marks an empty slot, so clearing is a
	// memclr. The table of large classes is set up only if one occurs.
	s.small = grow(s.small, size)
	clear(s.small)
	s.slots = s.slots[:0]
	for i := range s.holes {
		if i&1023 == 1023 && isDone(done) {
			return doneError{}
		}
		h := &s.holes[i]
		if s.isSmall(h) {
			key, t := s.canonCached(bitmap(h, s.hcells), int32(h.h), int32(h.w), nt)
			h.t = t
			slot := s.findSmall(key)
			if s.small[slot].key != 0 {
				s.join(h, s.small[slot].ci)
				continue
			}
			s.small[slot] = smallSlot{key: key, ci: int32(len(s.classes))}
			s.classes = append(s.classes, class{n: h.n, rep: int32(i)})
			s.join(h, int32(len(s.classes)-1))
			continue
		}
		if len(s.slots) == 0 {
			var size int
			size, s.shift = tableSize(len(s.holes))
			s.slots = grow(s.slots, size)
			for i := range s.slots {
				s.slots[i] = -1
			}
		}
		var hs [8]uint64
		s.shape(h, s.hcells, nt, &hs)
		k, t := canon(h, &hs, nt)
		ci, ft, slot := s.find(h, s.hcells, &hs, nt, k, t, false)
		if ci < 0 {
			h.t = t
			oh, ow := dims(t, int32(h.h), int32(h.w))
			s.labelHole(i)
			s.slots[slot] = int32(len(s.classes))
			s.classes = append(s.classes, class{hash: k.hash, n: k.n, h: oh, w: ow, rep: int32(i)})
			s.join(h, int32(len(s.classes)-1))
			continue
		}
		h.t = ft
		s.join(h, ci)
	}
	base, cbase := int32(0), int32(0)
	for ci := range s.classes {
		cl := &s.classes[ci]
		cl.base, cl.cbase = base, cbase
		base += cl.holes
		if s.isSmall(&s.holes[cl.rep]) {
			cbase += cl.holes * cl.n
		}
	}
	s.order = grow(s.order, int(base))
	// Small holes are distinct cells of the board, so the copies fit.
	s.copied = cbase
	return nil
}

// join puts hole h into class ci, after the class's earlier holes.
func (s *solver) join(h *comp, ci int32) {
	cl := &s.classes[ci]
	h.class, h.rank = ci, cl.holes
	cl.holes++
}

// match gives each piece, in order, the first empty hole of its class:
// the k-th piece of a class goes into the class's k-th hole. It reads no
// hole: it copies what result needs about the piece to the slot of that
// hole (see pieceCopy), and result pairs them up.
func (s *solver) match(done <-chan struct{}, nt int) (filled, placed int, err error) {
	for i := range s.pieces {
		if i&1023 == 1023 && isDone(done) {
			return 0, 0, doneError{}
		}
		p := &s.pieces[i]
		small := s.isSmall(p)
		var ci int32
		var t uint8
		if small {
			var key uint64
			key, t = s.canonCached(bitmap(p, s.pcells), int32(p.h), int32(p.w), nt)
			e := s.small[s.findSmall(key)]
			if e.key == 0 || s.classes[e.ci].pieces >= s.classes[e.ci].holes {
				continue
			}
			ci = e.ci
		} else {
			var hs [8]uint64
			s.shape(p, s.pcells, nt, &hs)
			k, bt := canon(p, &hs, nt)
			ci, t, _ = s.find(p, s.pcells, &hs, nt, k, bt, true)
			if ci < 0 {
				continue
			}
		}
		cl := &s.classes[ci]
		if small {
			s.order[cl.base+cl.pieces] = smallCopy(p, t)
			o := cl.cbase + cl.pieces*p.n
			dst := s.board[o : o+p.n]
			base := uint32(p.minr)<<16 | uint32(p.minc)
			for j, v := range s.pcells[p.start : p.start+p.n] {
				d := v - base
				dst[j] = uint8(d>>13 | d&7)
			}
		} else {
			p.t = t
			s.order[cl.base+cl.pieces] = pieceCopy(i)
		}
		cl.pieces++
		filled += int(p.n)
		placed++
	}
	return filled, placed, nil
}

// result lists the placements in hole order. All cell pairs share one
// backing array, so the result costs two allocations. It walks the holes
// in order and takes each filled hole's piece from the copies match left
// (see pieceCopy), so that all it touches but large pieces' cells is read
// or written front to back: the placements and their cells are megabytes
// that nothing has touched since they were cleared, and written in the
// pieces' order they would land a cache line here and a cache line there,
// each store waiting for its line to come from memory.
func (s *solver) result(filled, placed int) Result {
	res := Result{Filled: filled, Placements: make([]Placement, placed)}
	buf := make([][2]int32, 2*filled)
	pls := res.Placements
	off := int32(0)
	for i := range s.holes {
		h := &s.holes[i]
		cl := &s.classes[h.class]
		if h.rank >= cl.pieces {
			continue
		}
		small := s.isSmall(h)
		var minr, minc, ph, pw int32
		var pt uint8
		var p *comp
		if small {
			minr, minc, ph, pw, pt = s.order[cl.base+h.rank].small()
		} else {
			p = &s.pieces[s.order[cl.base+h.rank]]
			minr, minc, ph, pw, pt = int32(p.minr), int32(p.minc), int32(p.h), int32(p.w), p.t
		}
		g := composeT[inverseT[h.t]][pt]
		// Hole cell = K + L·(r, c): the linear part of g and, folded into
		// K, its translation and both boxes' corners. No branch on g,
		// which varies from placement to placement.
		l, o := lins[g], offsets[g]
		kr := int32(h.minr) + o.xh*(ph-1) + o.xw*(pw-1) - l.xr*minr - l.xc*minc
		kc := int32(h.minc) + o.yh*(ph-1) + o.yw*(pw-1) - l.yr*minr - l.yc*minc
		n := cl.n
		pc, hc := buf[off:off+n:off+n], buf[off+n:off+2*n:off+2*n]
		off += 2 * n
		if small {
			c0 := cl.cbase + h.rank*n
			for j, d := range s.board[c0 : c0+n] {
				r, c := minr+int32(d>>3), minc+int32(d&7)
				pc[j] = [2]int32{r, c}
				hc[j] = [2]int32{kr + l.xr*r + l.xc*c, kc + l.yr*r + l.yc*c}
			}
		} else {
			for j, v := range s.pcells[p.start : p.start+n] {
				r, c := int32(v>>16), int32(v&0xffff)
				pc[j] = [2]int32{r, c}
				hc[j] = [2]int32{kr + l.xr*r + l.xc*c, kc + l.yr*r + l.yc*c}
			}
		}
		// Field by field: assigning a whole Placement is a typed copy
		// with a bulk write barrier, which cost as much as the cells.
		pl := &pls[0]
		pls = pls[1:]
		pl.Piece, pl.Hole = pc, hc
		pl.Rotation, pl.Flipped = int(g&3)*90, g >= 4
	}
	// The board is all 0 again, as reset expects.
	clear(s.board[:s.copied])
	s.dirty = false
	return res
}
