package fill

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
)

// referenceSolve is a plain port of the textbook solution (BFS for the
// groups, a 0/1 matrix per group, compare every hole with every piece
// under four rotations, take the first fit). The textbook's bounds check
// compares the column with the number of rows; here it uses the number of
// columns, so rectangular boards work. With flip it also tries the
// mirrored matrix's rotations, after the plain ones.
func referenceSolve(gameBoard, table [][]int, flip bool) int {
	answer := 0
	empties := refFindBlock(gameBoard, 0)
	puzzles := refFindBlock(table, 1)
	for _, empty := range empties {
		hole := refMakeTable(empty)
		for pi := 0; pi < len(puzzles); pi++ {
			if refFits(hole, refMakeTable(puzzles[pi]), flip) {
				answer += len(puzzles[pi])
				puzzles = append(puzzles[:pi:pi], puzzles[pi+1:]...)
				break
			}
		}
	}
	return answer
}

func refFits(hole, puzzle [][]int, flip bool) bool {
	for range 4 {
		puzzle = refRotate(puzzle)
		if refEqual(hole, puzzle) {
			return true
		}
	}
	if flip {
		puzzle = refMirror(puzzle)
		for range 4 {
			puzzle = refRotate(puzzle)
			if refEqual(hole, puzzle) {
				return true
			}
		}
	}
	return false
}

// refFindBlock returns the groups of cells equal to f, in row-major order
// of their first cell. It works on a copy: the textbook overwrote the
// board to mark visited cells.
func refFindBlock(src [][]int, f int) [][][2]int {
	board := make([][]int, len(src))
	for i := range src {
		board[i] = append([]int(nil), src[i]...)
	}
	dx := []int{0, 0, -1, 1}
	dy := []int{-1, 1, 0, 0}
	var blocks [][][2]int
	for i := range board {
		for j := range board[i] {
			if board[i][j] != f {
				continue
			}
			queue := [][2]int{{i, j}}
			board[i][j] = f ^ 1
			lst := [][2]int{{i, j}}
			for len(queue) > 0 {
				x, y := queue[0][0], queue[0][1]
				queue = queue[1:]
				for d := range 4 {
					nx, ny := x+dx[d], y+dy[d]
					if nx < 0 || nx > len(board)-1 || ny < 0 || ny > len(board[0])-1 {
						continue
					}
					if board[nx][ny] == f {
						queue = append(queue, [2]int{nx, ny})
						board[nx][ny] = f ^ 1
						lst = append(lst, [2]int{nx, ny})
					}
				}
			}
			blocks = append(blocks, lst)
		}
	}
	return blocks
}

func refMakeTable(block [][2]int) [][]int {
	minX, minY, maxX, maxY := block[0][0], block[0][1], block[0][0], block[0][1]
	for _, c := range block {
		minX, maxX = min(minX, c[0]), max(maxX, c[0])
		minY, maxY = min(minY, c[1]), max(maxY, c[1])
	}
	t := make([][]int, maxX-minX+1)
	for i := range t {
		t[i] = make([]int, maxY-minY+1)
	}
	for _, c := range block {
		t[c[0]-minX][c[1]-minY] = 1
	}
	return t
}

// refRotate turns the matrix 90° clockwise.
func refRotate(p [][]int) [][]int {
	r := make([][]int, len(p[0]))
	for i := range r {
		r[i] = make([]int, len(p))
	}
	for i := range p {
		for j := range p[i] {
			r[j][len(p)-1-i] = p[i][j]
		}
	}
	return r
}

func refMirror(p [][]int) [][]int {
	r := make([][]int, len(p))
	for i := range p {
		r[i] = make([]int, len(p[i]))
		for j := range p[i] {
			r[i][len(p[i])-1-j] = p[i][j]
		}
	}
	return r
}

func refEqual(a, b [][]int) bool {
	if len(a) != len(b) || len(a[0]) != len(b[0]) {
		return false
	}
	for i := range a {
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return true
}

// checkResult verifies res independently of the solver: every placement
// pairs one whole group of table 1s with one whole group of board 0s,
// nothing is used twice, and the stated mirror and rotation carry
// Piece[i] onto Hole[i] for every i, translation included.
func checkResult(p Puzzle, opts Options, res Result) error {
	pieceID, pieceSize := refLabels(p.Table, 1)
	holeID, holeSize := refLabels(p.GameBoard, 0)
	usedP, usedH := map[int]bool{}, map[int]bool{}
	total := 0
	for k, pl := range res.Placements {
		piece, hole := widen(pl.Piece), widen(pl.Hole)
		if len(piece) == 0 || len(piece) != len(hole) {
			return fmt.Errorf("placement %d: %d piece cells, %d hole cells", k, len(pl.Piece), len(pl.Hole))
		}
		pid, err := groupOf(piece, pieceID, pieceSize)
		if err != nil {
			return fmt.Errorf("placement %d piece: %v", k, err)
		}
		hid, err := groupOf(hole, holeID, holeSize)
		if err != nil {
			return fmt.Errorf("placement %d hole: %v", k, err)
		}
		if usedP[pid] || usedH[hid] {
			return fmt.Errorf("placement %d reuses a piece or a hole", k)
		}
		usedP[pid], usedH[hid] = true, true
		if pl.Flipped && !opts.AllowFlip {
			return fmt.Errorf("placement %d is flipped without AllowFlip", k)
		}
		if pl.Rotation%90 != 0 || pl.Rotation < 0 || pl.Rotation > 270 {
			return fmt.Errorf("placement %d: rotation %d", k, pl.Rotation)
		}
		moved := refApply(piece, pl.Flipped, pl.Rotation/90)
		// moved is normalised; the translation is fixed by the first cell.
		dr, dc := hole[0][0]-moved[0][0], hole[0][1]-moved[0][1]
		for i := range moved {
			if moved[i][0]+dr != hole[i][0] || moved[i][1]+dc != hole[i][1] {
				return fmt.Errorf("placement %d: piece cell %v goes to %v, not %v", k, piece[i],
					[2]int{moved[i][0] + dr, moved[i][1] + dc}, hole[i])
			}
		}
		total += len(hole)
	}
	if total != res.Filled {
		return fmt.Errorf("placements fill %d cells, Filled is %d", total, res.Filled)
	}
	return nil
}

// widen converts a placement's cells to the checker's [2]int.
func widen(cells [][2]int32) [][2]int {
	out := make([][2]int, len(cells))
	for i, c := range cells {
		out[i] = [2]int{int(c[0]), int(c[1])}
	}
	return out
}

// refApply normalises cells, mirrors them left-to-right when flip, then
// turns them k quarter turns clockwise, normalising after each step.
func refApply(cells [][2]int, flip bool, k int) [][2]int {
	out := make([][2]int, len(cells))
	copy(out, cells)
	norm := func() (h, w int) {
		minR, minC, maxR, maxC := out[0][0], out[0][1], out[0][0], out[0][1]
		for _, c := range out {
			minR, maxR = min(minR, c[0]), max(maxR, c[0])
			minC, maxC = min(minC, c[1]), max(maxC, c[1])
		}
		for i := range out {
			out[i][0] -= minR
			out[i][1] -= minC
		}
		return maxR - minR + 1, maxC - minC + 1
	}
	h, w := norm()
	if flip {
		for i := range out {
			out[i][1] = w - 1 - out[i][1]
		}
	}
	for range k {
		for i := range out {
			out[i] = [2]int{out[i][1], h - 1 - out[i][0]}
		}
		h, w = w, h
	}
	return out
}

// refLabels numbers the 4-connected groups of cells equal to f.
func refLabels(g [][]int, f int) (map[[2]int]int, map[int]int) {
	id, size := map[[2]int]int{}, map[int]int{}
	for gi, b := range refFindBlock(g, f) {
		for _, c := range b {
			id[c] = gi
		}
		size[gi] = len(b)
	}
	return id, size
}

func groupOf(cells [][2]int, id map[[2]int]int, size map[int]int) (int, error) {
	seen := map[[2]int]bool{}
	g := -1
	for _, c := range cells {
		x, ok := id[c]
		if !ok {
			return 0, fmt.Errorf("cell %v is not in any group", c)
		}
		if seen[c] {
			return 0, fmt.Errorf("cell %v listed twice", c)
		}
		seen[c] = true
		if g >= 0 && x != g {
			return 0, fmt.Errorf("cells from two groups")
		}
		g = x
	}
	if len(cells) != size[g] {
		return 0, fmt.Errorf("%d of the group's %d cells", len(cells), size[g])
	}
	return g, nil
}

// randomShape grows a random polyomino of k cells, normalised.
func randomShape(rng *rand.Rand, k int) [][2]int {
	cells := [][2]int{{0, 0}}
	in := map[[2]int]bool{{0, 0}: true}
	dirs := [4][2]int{{0, 1}, {1, 0}, {0, -1}, {-1, 0}}
	for len(cells) < k {
		c := cells[rng.IntN(len(cells))]
		d := dirs[rng.IntN(4)]
		n := [2]int{c[0] + d[0], c[1] + d[1]}
		if !in[n] {
			in[n] = true
			cells = append(cells, n)
		}
	}
	return refApply(cells, false, 0)
}

// placeShapes stamps shapes (randomly turned, and mirrored when flip) at
// row-major anchors with probability density, wherever they fit without
// touching an earlier shape edge to edge (corners may touch). Stamped
// cells get value v, the rest 1-v.
func placeShapes(rng *rand.Rand, rows, cols int, shapes [][][2]int, density float64, flip bool, v int) [][]int {
	g := make([][]int, rows)
	used := make([][]bool, rows)
	for i := range g {
		g[i] = make([]int, cols)
		used[i] = make([]bool, cols)
		for j := range g[i] {
			g[i][j] = 1 - v
		}
	}
	free := func(r, c int) bool { return r < 0 || r >= rows || c < 0 || c >= cols || !used[r][c] }
	for r := range rows {
		for c := range cols {
			if rng.Float64() >= density {
				continue
			}
			sh := refApply(shapes[rng.IntN(len(shapes))], flip && rng.IntN(2) == 1, rng.IntN(4))
			ok := true
			for _, s := range sh {
				y, x := r+s[0], c+s[1]
				if y >= rows || x >= cols || !free(y, x) || !free(y-1, x) || !free(y+1, x) || !free(y, x-1) || !free(y, x+1) {
					ok = false
					break
				}
			}
			if !ok {
				continue
			}
			for _, s := range sh {
				used[r+s[0]][c+s[1]] = true
				g[r+s[0]][c+s[1]] = v
			}
		}
	}
	return g
}

// randomPuzzle makes a small instance of one of several kinds: noise
// grids (lots of diagonal contact and odd shapes), stamped polyominoes
// from a shared pool (many matches, including mirror-only ones), thin
// boards.
func randomPuzzle(rng *rand.Rand) Puzzle {
	dims := [][2]int{{1, 1}, {1, 7}, {7, 1}, {3, 7}, {7, 3}, {2, 9}, {6, 6}, {5, 8}, {10, 10}}
	d := dims[rng.IntN(len(dims))]
	if rng.IntN(3) == 0 {
		d = [2]int{1 + rng.IntN(12), 1 + rng.IntN(12)}
	}
	rows, cols := d[0], d[1]
	if rng.IntN(3) == 0 {
		noise := func(v int) [][]int {
			g := make([][]int, rows)
			dens := rng.Float64()
			for i := range g {
				g[i] = make([]int, cols)
				for j := range g[i] {
					if rng.Float64() < dens {
						g[i][j] = 1
					}
				}
			}
			return g
		}
		return Puzzle{GameBoard: noise(0), Table: noise(1)}
	}
	var pool [][][2]int
	for range 1 + rng.IntN(5) {
		pool = append(pool, randomShape(rng, 1+rng.IntN(6)))
	}
	dens := 0.2 + 0.8*rng.Float64()
	return Puzzle{
		GameBoard: placeShapes(rng, rows, cols, pool, dens, true, 0),
		Table:     placeShapes(rng, rows, cols, pool, dens, true, 1),
	}
}

func TestAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 84021))
	n := 2500
	if testing.Short() {
		n = 500
	}
	for i := range n {
		p := randomPuzzle(rng)
		for _, flip := range []bool{false, true} {
			opts := Options{AllowFlip: flip}
			res, err := Solve(context.Background(), p, opts)
			if err != nil {
				t.Fatalf("instance %d flip=%v: %v", i, flip, err)
			}
			want := referenceSolve(p.GameBoard, p.Table, flip)
			if res.Filled != want {
				t.Fatalf("instance %d flip=%v: Filled %d, reference %d\nboard %v\ntable %v", i, flip, res.Filled, want, p.GameBoard, p.Table)
			}
			if err := checkResult(p, opts, res); err != nil {
				t.Fatalf("instance %d flip=%v: %v\nboard %v\ntable %v", i, flip, err, p.GameBoard, p.Table)
			}
		}
	}
}

// TestMirrorOnly pins the AllowFlip semantics on an L and a J: they match
// only when mirroring is allowed.
func TestMirrorOnly(t *testing.T) {
	p := Puzzle{
		GameBoard: [][]int{
			{0, 1, 1},
			{0, 1, 1},
			{0, 0, 1},
		},
		Table: [][]int{
			{0, 1, 0},
			{0, 1, 0},
			{1, 1, 0},
		},
	}
	for _, flip := range []bool{false, true} {
		res, err := Solve(context.Background(), p, Options{AllowFlip: flip})
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if flip {
			want = 4
		}
		if res.Filled != want || referenceSolve(p.GameBoard, p.Table, flip) != want {
			t.Errorf("flip=%v: Filled %d, want %d", flip, res.Filled, want)
		}
		if err := checkResult(p, Options{AllowFlip: flip}, res); err != nil {
			t.Error(err)
		}
	}
}

// TestHashCollisions makes every shape hash collide (all table entries 1,
// so a hash is just the cell count) and checks that the exact
// verification still sorts pieces and holes into the right classes.
func TestHashCollisions(t *testing.T) {
	savedA, savedB, savedSide := hashA, hashB, smallSide
	defer func() { hashA, hashB, smallSide = savedA, savedB, savedSide }()
	smallSide = 0 // small groups would take the exact bitmap path
	for i := range hashA {
		hashA[i], hashB[i] = 1, 1
	}
	rng := rand.New(rand.NewPCG(7, 84021))
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
