package sliding

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/puzzleq/puzzleq/solvers"
)

// generalManhattan returns the single-tile databases of md without the
// manhattan mark, so that idaStar searches them with the general
// pattern-database search: the reference the specialised search must
// match node for node.
func generalManhattan(md *heuristic) *heuristic {
	return newHeuristic(md.rows, md.cols, md.groups, false)
}

// checkManhattanSearch solves board with the specialised Manhattan search
// and the general one over the same single-tile databases and checks that
// they return the same path and node count, that the length is want, and
// that the path replays to the goal.
func checkManhattanSearch(t *testing.T, md, gen *heuristic, board [][]int, want int) int64 {
	t.Helper()
	p, z := pack(board)
	path, nodes, err := idaStar(t.Context(), md, p, z, Options{MaxNodes: 1 << 40})
	if err != nil {
		t.Fatalf("%s: %v", boardString(board), err)
	}
	gpath, gnodes, err := idaStar(t.Context(), gen, p, z, Options{MaxNodes: 1 << 40})
	if err != nil {
		t.Fatalf("%s: general search: %v", boardString(board), err)
	}
	if path != gpath || nodes != gnodes {
		t.Fatalf("%s: path %q, %d nodes; general search %q, %d nodes", boardString(board), path, nodes, gpath, gnodes)
	}
	if len(path) != want {
		t.Fatalf("%s: %d moves, want %d", boardString(board), len(path), want)
	}
	end, err := replay(board, path)
	if err != nil || !isGoal(end) {
		t.Fatalf("%s: path %q does not reach the goal (%v)", boardString(board), path, err)
	}
	return nodes
}

// randomSolvable returns a uniformly random solvable board of a shape.
func randomSolvable(rng interface{ Perm(int) []int }, rows, cols int) [][]int {
	for {
		perm := rng.Perm(rows * cols)
		b := make([][]int, rows)
		for i := range b {
			b[i] = perm[i*cols : (i+1)*cols]
		}
		if p, z := pack(b); solvable(p, z, rows, cols) {
			return b
		}
	}
}

// TestManhattanSearch checks the specialised Manhattan search on
// thousands of random boards: uniformly random ones of the table shapes
// against the distance tables, of 10 to 12 cells against Solve (pattern
// databases), and random walks on 4×4; on every board it must return the
// path and node count of the general search with the same heuristic.
func TestManhattanSearch(t *testing.T) {
	type shape struct{ rows, cols, count, walk int }
	shapes := []shape{
		{2, 4, 400, 0}, {4, 2, 400, 0}, {3, 3, 1500, 0},
		{2, 5, 80, 0}, {5, 2, 80, 0}, {3, 4, 40, 0}, {4, 3, 40, 0},
		{4, 4, 300, 30},
	}
	if raceEnabled || testing.Short() {
		shapes = []shape{{2, 4, 100, 0}, {4, 2, 100, 0}, {3, 3, 300, 0}, {2, 5, 40, 0}, {3, 4, 10, 0}, {4, 4, 40, 30}}
	}
	rng := newRand(35)
	total := 0
	for _, s := range shapes {
		md := manhattanHeuristic(s.rows, s.cols)
		gen := generalManhattan(md)
		var nodes int64
		for i := range s.count {
			var b [][]int
			if s.walk > 0 {
				b = randomWalk(rng, s.rows, s.cols, s.walk+i%21)
			} else {
				b = randomSolvable(rng, s.rows, s.cols)
			}
			want := -1
			if s.rows*s.cols < 16 || !raceEnabled {
				want = referenceMoves(t, b)
			} else {
				// 4×4 under -race: the databases are too slow to build;
				// the general search's length is the reference.
				p, z := pack(b)
				gpath, _, err := idaStar(t.Context(), gen, p, z, Options{MaxNodes: 1 << 40})
				if err != nil {
					t.Fatal(err)
				}
				want = len(gpath)
			}
			nodes += checkManhattanSearch(t, md, gen, b, want)
			total++
		}
		t.Logf("%dx%d: %d boards, %d nodes", s.rows, s.cols, s.count, nodes)
	}
	t.Logf("%d boards", total)
}

// referenceMoves returns Solve's length for a solvable board: the
// distance table up to 9 cells, IDA* with pattern databases above.
func referenceMoves(t *testing.T, b [][]int) int {
	t.Helper()
	res, err := Solve(t.Context(), Puzzle{Board: b}, Options{})
	if err != nil || !res.Solvable {
		t.Fatalf("%s: Solve: %+v, %v", boardString(b), res, err)
	}
	return res.Moves
}

// TestManhattanSearchControl checks that the specialised search stops on
// the budget and on cancellation where the general one does, and reports
// the same progress.
func TestManhattanSearchControl(t *testing.T) {
	md := manhattanHeuristic(3, 4)
	gen := generalManhattan(md)
	b := randomWalk(newRand(5), 3, 4, 300)
	p, z := pack(b)
	for _, budget := range []int64{1, 1000, 4096, 4097, 50_000} {
		_, n1, err1 := idaStar(t.Context(), md, p, z, Options{MaxNodes: budget})
		_, n2, err2 := idaStar(t.Context(), gen, p, z, Options{MaxNodes: budget})
		if !errors.Is(err1, solvers.ErrBudgetExceeded) || fmt.Sprint(err1) != fmt.Sprint(err2) || n1 != n2 {
			t.Fatalf("budget %d: %d nodes, %v; general search %d nodes, %v", budget, n1, err1, n2, err2)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, n, err := idaStar(ctx, md, p, z, Options{})
	if !errors.Is(err, context.Canceled) || n > pollEvery+4 {
		t.Fatalf("cancelled: %d nodes, %v", n, err)
	}
	type call struct {
		bound int
		nodes int64
	}
	record := func(h *heuristic) []call {
		var calls []call
		if _, _, err := idaStar(t.Context(), h, p, z, Options{Progress: func(bound int, nodes int64) {
			calls = append(calls, call{bound, nodes})
		}}); err != nil {
			t.Fatal(err)
		}
		return calls
	}
	if c1, c2 := record(md), record(gen); !slices.Equal(c1, c2) || len(c1) == 0 {
		t.Fatalf("progress %v, general search %v", c1, c2)
	}
}
