package fill

import (
	"context"
	"math/rand/v2"
	"testing"
)

// TestCanonSmallForms checks every bitmap form canonSmall builds against
// the transformation table lins applied cell by cell: for random small
// shapes, the bitmap of transformation t (normalised) must be the form
// canonSmall returns when t is the only candidate that can win.
func TestCanonSmallForms(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 84021))
	s := new(solver)
	for range 20000 {
		// A random shape inside a random box up to 8×8, with its top row
		// and left column occupied so that it is normalised.
		h, w := int32(1+rng.IntN(8)), int32(1+rng.IntN(8))
		var cells [][2]int32
		for r := range h {
			for c := range w {
				if rng.IntN(2) == 0 || r == 0 && c == 0 || r == h-1 && c == w-1 {
					cells = append(cells, [2]int32{r, c})
				}
			}
		}
		var bm uint64
		for _, c := range cells {
			bm |= 1 << (8*c[0] + c[1])
		}
		// Normalise: the box must be tight.
		minr, minc, maxr, maxc := int32(8), int32(8), int32(-1), int32(-1)
		for _, c := range cells {
			minr, minc, maxr, maxc = min(minr, c[0]), min(minc, c[1]), max(maxr, c[0]), max(maxc, c[1])
		}
		if minr != 0 || minc != 0 || maxr != h-1 || maxc != w-1 {
			t.Fatal("shape not normalised")
		}
		want := [8]uint64{}
		for tr := range uint8(8) {
			ox, oy, _, _ := affine(tr, h, w)
			l := lins[tr]
			for _, c := range cells {
				x, y := ox+l.xr*c[0]+l.xc*c[1], oy+l.yr*c[0]+l.yc*c[1]
				want[tr] |= 1 << (8*x + y)
			}
		}
		for _, nt := range []int{4, 8} {
			best, bt := want[0], uint8(0)
			for tr := 1; tr < nt; tr++ {
				if want[tr] < best {
					best, bt = want[tr], uint8(tr)
				}
			}
			got, gt := canonSmall(bm, h, w, nt)
			if got != best || gt != bt {
				t.Fatalf("%dx%d %#x nt=%d: canonSmall = %#x, t%d; want %#x, t%d (forms %#x)", h, w, bm, nt, got, gt, best, bt, want)
			}
			// The cache, on a miss and then on a hit, agrees.
			for range 2 {
				if got, gt := s.canonCached(bm, h, w, nt); got != best || gt != bt {
					t.Fatalf("%dx%d %#x nt=%d: canonCached = %#x, t%d; want %#x, t%d", h, w, bm, nt, got, gt, best, bt)
				}
			}
		}
	}
}

// TestHashPathOnly sends every group down the hash path, which small
// test grids otherwise rarely reach, and compares with the reference.
func TestHashPathOnly(t *testing.T) {
	saved := smallSide
	defer func() { smallSide = saved }()
	smallSide = 0
	rng := rand.New(rand.NewPCG(11, 84021))
	for i := range 500 {
		p := randomPuzzle(rng)
		for _, flip := range []bool{false, true} {
			opts := Options{AllowFlip: flip}
			res, err := Solve(context.Background(), p, opts)
			if err != nil {
				t.Fatal(err)
			}
			if want := referenceSolve(p.GameBoard, p.Table, flip); res.Filled != want {
				t.Fatalf("instance %d flip=%v: Filled %d, reference %d", i, flip, res.Filled, want)
			}
			if err := checkResult(p, opts, res); err != nil {
				t.Fatalf("instance %d flip=%v: %v", i, flip, err)
			}
		}
	}
}

// TestMixedSizes uses grids large enough that small and large groups
// (bitmap and hash keys) occur in the same solve, with noise grids whose
// groups straddle the 8×8 limit.
func TestMixedSizes(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 84021))
	for i := range 200 {
		rows, cols := 9+rng.IntN(24), 9+rng.IntN(24)
		noise := func(v int, dens float64) [][]int {
			g := make([][]int, rows)
			for r := range g {
				g[r] = make([]int, cols)
				for c := range g[r] {
					if (rng.Float64() < dens) == (v == 1) {
						g[r][c] = 1
					}
				}
			}
			return g
		}
		var p Puzzle
		if i%2 == 0 {
			d := 0.3 + 0.3*rng.Float64()
			p = Puzzle{GameBoard: noise(0, d), Table: noise(1, d)}
		} else {
			var pool [][][2]int
			for range 1 + rng.IntN(4) {
				pool = append(pool, randomShape(rng, 1+rng.IntN(14)))
			}
			d := 0.2 + 0.8*rng.Float64()
			p = Puzzle{GameBoard: placeShapes(rng, rows, cols, pool, d, true, 0), Table: placeShapes(rng, rows, cols, pool, d, true, 1)}
		}
		for _, flip := range []bool{false, true} {
			opts := Options{AllowFlip: flip}
			res, err := Solve(context.Background(), p, opts)
			if err != nil {
				t.Fatal(err)
			}
			if want := referenceSolve(p.GameBoard, p.Table, flip); res.Filled != want {
				t.Fatalf("instance %d flip=%v: Filled %d, reference %d", i, flip, res.Filled, want)
			}
			if err := checkResult(p, opts, res); err != nil {
				t.Fatalf("instance %d flip=%v: %v", i, flip, err)
			}
		}
	}
}

// TestReuseAfterCancel: a solve stopped early leaves marked cells in the
// pooled grids; later solves on the same solver, smaller and then larger
// again, must not see them.
func TestReuseAfterCancel(t *testing.T) {
	s := new(solver)
	marked := func() int {
		n := 0
		for _, g := range [][]uint8{s.board, s.table} {
			for _, v := range g {
				n += int(v)
			}
		}
		return n
	}
	big := Puzzle{GameBoard: grid(60, 60, 0), Table: grid(60, 60, 1)}
	if err := validate(big, s); err != nil {
		t.Fatal(err)
	}
	// Validation filled both grids; no flood ran, as after a cancel.
	small := Puzzle{GameBoard: [][]int{{0, 1}, {1, 1}}, Table: [][]int{{1, 0}, {0, 0}}}
	if err := validate(small, s); err != nil {
		t.Fatal(err)
	}
	if n := marked(); n != 2 {
		t.Fatalf("grids hold %d marked cells, want 2", n)
	}
	// A complete solve of the small puzzle, then a larger one that
	// reslices into the capacity the cancelled solve dirtied.
	s.holes, _ = s.flood(nil, s.board, s.hcells, s.holes)
	s.pieces, _ = s.flood(nil, s.table, s.pcells, s.pieces)
	s.dirty = false
	mid := Puzzle{GameBoard: grid(40, 40, 1), Table: grid(40, 40, 0)}
	if err := validate(mid, s); err != nil {
		t.Fatal(err)
	}
	if n := marked(); n != 0 {
		t.Fatalf("grids hold %d marked cells, want 0", n)
	}
	// And through Solve, with the pool: results match the reference.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Solve(ctx, big, Options{}); err == nil {
		t.Fatal("cancelled solve succeeded")
	}
	for _, p := range []Puzzle{small, example1, mid, benchPuzzle(50)} {
		res, err := Solve(context.Background(), p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if want := referenceSolve(p.GameBoard, p.Table, false); res.Filled != want {
			t.Fatalf("Filled %d, reference %d", res.Filled, want)
		}
	}
}

// TestReuseAfterMatch: a solve that stops after match leaves the small
// pieces' copies in the board; later solves on the same solver must give
// the results of a fresh one, and a finished solve must leave both grids
// all 0 over their whole capacity.
func TestReuseAfterMatch(t *testing.T) {
	s := new(solver)
	first := benchPuzzle(100)
	t.Cleanup(func() { stopAfterMatch = nil })
	for _, flip := range []bool{false, true} {
		// The solve stops after match, through solve itself, so that how
		// solve marks the solver for clearing is what is tested.
		placed := -1
		stopAfterMatch = func(n int) bool { placed = n; return true }
		_, err := s.solve(context.Background(), first, Options{AllowFlip: flip})
		stopAfterMatch = nil
		if err != nil || placed <= 0 {
			t.Fatalf("match placed %d, err %v", placed, err)
		}
		for _, p := range []Puzzle{example1, benchPuzzle(50), first} {
			opts := Options{AllowFlip: flip}
			got, err := s.solve(context.Background(), p, opts)
			if err != nil {
				t.Fatal(err)
			}
			want, err := new(solver).solve(context.Background(), p, opts)
			if err != nil {
				t.Fatal(err)
			}
			if !equalResults(got, want) {
				t.Fatalf("flip=%v: results differ from a fresh solver's", flip)
			}
			for _, g := range [][]uint8{s.board, s.table} {
				for i, v := range g[:cap(g)] {
					if v != 0 {
						t.Fatalf("flip=%v: grid byte %d is %d after a finished solve", flip, i, v)
					}
				}
			}
		}
	}
}
