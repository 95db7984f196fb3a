package sweep

import (
	"context"
	"math/rand"
	"strings"
	"testing"
)

// refSolve is the textbook algorithm, kept deliberately plain: from every
// empty cell, try every sequence of rolls with no pruning at all, and keep
// the fewest rolls among games that end stuck with every cell visited.
// maxNodes > 0 aborts (ok=false) after that many rolls, so that corpus
// generation can drop boards the plain search cannot finish.
func refSolve(board []string, maxNodes int64) (moves int, ok bool) {
	moves, _, ok = refSolveNodes(board, maxNodes)
	return moves, ok
}

// refSolveNodes is refSolve that also reports the rolls it tried.
func refSolveNodes(board []string, maxNodes int64) (moves int, nodes int64, ok bool) {
	r := &refState{n: len(board), m: len(board[0]), best: -1, maxNodes: maxNodes}
	r.seen = make([][]bool, r.n)
	for i := range board {
		r.seen[i] = make([]bool, r.m)
	}
	reset := func() {
		for i := range board {
			for j := 0; j < r.m; j++ {
				r.seen[i][j] = board[i][j] == '*'
			}
		}
	}
	for i := range board {
		for j := 0; j < r.m; j++ {
			if board[i][j] != '.' {
				continue
			}
			reset()
			r.seen[i][j] = true
			r.roll(i, j, 0)
			if r.aborted {
				return 0, r.nodes, false
			}
		}
	}
	return r.best, r.nodes, true
}

// refFrom is the reference's search from the one start cell (i, j).
func refFrom(board []string, i, j int) int {
	r := &refState{n: len(board), m: len(board[0]), best: -1}
	r.seen = make([][]bool, r.n)
	for a := range board {
		r.seen[a] = make([]bool, r.m)
		for b := 0; b < r.m; b++ {
			r.seen[a][b] = board[a][b] == '*'
		}
	}
	r.seen[i][j] = true
	r.roll(i, j, 0)
	return r.best
}

type refState struct {
	n, m     int
	seen     [][]bool
	best     int
	nodes    int64
	maxNodes int64
	aborted  bool
}

var refDirs = [4][2]int{{-1, 0}, {1, 0}, {0, -1}, {0, 1}}

func (r *refState) open(i, j int) bool {
	return i >= 0 && i < r.n && j >= 0 && j < r.m && !r.seen[i][j]
}

func (r *refState) roll(i, j, moves int) {
	r.nodes++
	if r.maxNodes > 0 && r.nodes > r.maxNodes {
		r.aborted = true
		return
	}
	stuck := true
	for _, d := range refDirs {
		if r.open(i+d[0], j+d[1]) {
			stuck = false
		}
	}
	if stuck {
		for _, row := range r.seen {
			for _, v := range row {
				if !v {
					return
				}
			}
		}
		if r.best < 0 || moves < r.best {
			r.best = moves
		}
		return
	}
	for _, d := range refDirs {
		if !r.open(i+d[0], j+d[1]) {
			continue
		}
		x, y := i, j
		for r.open(x+d[0], y+d[1]) {
			x, y = x+d[0], y+d[1]
			r.seen[x][y] = true
		}
		r.roll(x, y, moves+1)
		for x != i || y != j {
			r.seen[x][y] = false
			x, y = x-d[0], y-d[1]
		}
		if r.aborted {
			return
		}
	}
}

// replay checks a claimed game with its own simple simulator: every roll
// must move at least one cell, the ball must end stuck, every empty cell
// must be visited, and the number of rolls must equal res.Moves.
func replay(board []string, res Result) string {
	if res.Moves < 0 {
		if res.Start != nil || res.Path != "" {
			return "answer -1 with a start or path"
		}
		return ""
	}
	n, m := len(board), len(board[0])
	if len(res.Start) != 2 {
		return "start is not [row, col]"
	}
	i, j := res.Start[0], res.Start[1]
	if i < 0 || i >= n || j < 0 || j >= m || board[i][j] != '.' {
		return "start is not an empty cell"
	}
	seen := make([][]bool, n)
	for a := range seen {
		seen[a] = make([]bool, m)
		for b := 0; b < m; b++ {
			seen[a][b] = board[a][b] == '*'
		}
	}
	seen[i][j] = true
	open := func(a, b int) bool { return a >= 0 && a < n && b >= 0 && b < m && !seen[a][b] }
	if len(res.Path) != res.Moves {
		return "path length differs from moves"
	}
	for _, ch := range res.Path {
		di, dj := 0, 0
		switch ch {
		case 'U':
			di = -1
		case 'D':
			di = 1
		case 'L':
			dj = -1
		case 'R':
			dj = 1
		default:
			return "bad direction " + string(ch)
		}
		if !open(i+di, j+dj) {
			return "roll " + string(ch) + " does not move"
		}
		for open(i+di, j+dj) {
			i, j = i+di, j+dj
			seen[i][j] = true
		}
	}
	for _, d := range refDirs {
		if open(i+d[0], j+d[1]) {
			return "ball is not stuck at the end"
		}
	}
	for a := range seen {
		for b := range seen[a] {
			if !seen[a][b] {
				return "a cell is never visited"
			}
		}
	}
	return ""
}

func randomBoard(rng *rand.Rand, n, m int, density float64) []string {
	for {
		b := make([]string, n)
		any := false
		for i := range b {
			row := make([]byte, m)
			for j := range row {
				if rng.Float64() < density {
					row[j] = '*'
				} else {
					row[j] = '.'
					any = true
				}
			}
			b[i] = string(row)
		}
		if any {
			return b
		}
	}
}

func checkAgainstReference(t *testing.T, board []string, tn tuning) {
	t.Helper()
	want, _ := refSolve(board, 0)
	got, err := solve(context.Background(), Puzzle{Board: board}, Options{}, tn)
	if err != nil {
		t.Fatalf("board\n%s\nerror %v", strings.Join(board, "\n"), err)
	}
	if got.Moves != want {
		t.Fatalf("board\n%s\ngot %d, reference %d (tuning %+v)", strings.Join(board, "\n"), got.Moves, want, tn)
	}
	if msg := replay(board, got); msg != "" {
		t.Fatalf("board\n%s\nresult %+v: %s", strings.Join(board, "\n"), got, msg)
	}
}

func TestMatchesReferenceOnTraps(t *testing.T) {
	cases := []struct {
		board []string
		want  int
	}{
		{[]string{"."}, 0},
		{[]string{"*.*"}, 0},
		{[]string{".*."}, -1},
		{[]string{"..", "*.", "*."}, 2},
		{[]string{"**...", ".....", "....*", "..*..", "....."}, 10},
		{[]string{"****", "****", "...."}, 1},
		{[]string{"...."}, 1},
		{[]string{".", ".", "."}, 1},
		{[]string{"..", ".."}, 3},
		{[]string{".*", "*."}, -1},
		{[]string{"...", ".*.", "..."}, 4},
		{[]string{".*.", "...", ".*."}, -1},
	}
	for _, tc := range cases {
		want, _ := refSolve(tc.board, 0)
		if want != tc.want {
			t.Fatalf("reference says %d for %q, table says %d", want, tc.board, tc.want)
		}
		checkAgainstReference(t, tc.board, tuning{})
	}
}

// TestMatchesReference compares with the plain search on random small
// boards, with every pruning on and with each one off, since each must
// preserve the optimum on its own.
func TestMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewSource(9944))
	tunings := []tuning{{}, {noConnectivity: true}, {noDeadEnds: true}, {noBound: true}, {noSymmetry: true}, {noOrdering: true}, {alwaysFlood: true}, {noParity: true}, {noBlocks: true}}
	count := 2400
	if testing.Short() {
		count = 300
	}
	for k := 0; k < count; k++ {
		var n, m int
		switch k % 6 {
		case 0:
			n, m = 1, 1+rng.Intn(12)
		case 1:
			n, m = 1+rng.Intn(12), 1
		default:
			n, m = 1+rng.Intn(5), 1+rng.Intn(6)
		}
		density := []float64{0, 0.05, 0.1, 0.2, 0.3, 0.5}[rng.Intn(6)]
		board := randomBoard(rng, n, m, density)
		checkAgainstReference(t, board, tunings[k%len(tunings)])
	}
}

// TestFloodSkipLosesNothing checks the claim behind skipping the flood
// fill: if a skipped roll could have split the free cells, the full
// flood would prune there and search fewer nodes. Equal node counts on
// every board mean the skip never hid a split.
func TestFloodSkipLosesNothing(t *testing.T) {
	rng := rand.New(rand.NewSource(99))
	var boards [][]string
	for k := 0; k < 300; k++ {
		boards = append(boards, randomBoard(rng, 1+rng.Intn(8), 1+rng.Intn(8), 0.3*rng.Float64()))
	}
	for _, cb := range loadCorpus(t) {
		boards = append(boards, cb.board)
	}
	for _, b := range boards {
		_, n1, err1 := solveCount(context.Background(), Puzzle{Board: b}, Options{}, tuning{})
		_, n2, err2 := solveCount(context.Background(), Puzzle{Board: b}, Options{}, tuning{alwaysFlood: true})
		if err1 != nil || err2 != nil || n1 != n2 {
			t.Fatalf("board %q: %d nodes skipping floods, %d always flooding (%v, %v)", b, n1, n2, err1, err2)
		}
	}
}

// TestSymmetricBoards targets the symmetry reduction, which random
// boards rarely exercise: obstacles are mirrored (or rotated) so that the
// board has the symmetry, and answers are compared with the reference.
func TestSymmetricBoards(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	symmetric := 0
	for k := 0; k < 400; k++ {
		n := 1 + rng.Intn(5)
		m := 1 + rng.Intn(6)
		if k%2 == 0 {
			m = n
		}
		g := toGrid(randomBoard(rng, n, m, 0.25*rng.Float64()))
		block := func(i, j int) {
			if g[i][j] == '*' {
				return
			}
			g[i][j] = '*'
		}
		for i := 0; i < n; i++ {
			for j := 0; j < m; j++ {
				if g[i][j] != '*' {
					continue
				}
				switch k % 4 {
				case 0: // 90-degree rotations (square)
					block(j, n-1-i)
					block(n-1-i, m-1-j)
					block(m-1-j, i)
				case 1: // left-right mirror
					block(i, m-1-j)
				case 2: // transpose (square)
					block(j, i)
				case 3: // both mirrors
					block(i, m-1-j)
					block(n-1-i, j)
					block(n-1-i, m-1-j)
				}
			}
		}
		b := fromGrid(g)
		if Validate(Puzzle{Board: b}) != nil {
			continue
		}
		if len(newSearcher(context.Background(), Puzzle{Board: b}, Options{}, tuning{}).symmetries()) > 1 {
			symmetric++
		}
		checkAgainstReference(t, b, tuning{})
	}
	if symmetric < 200 {
		t.Fatalf("only %d boards had a symmetry", symmetric)
	}
}

// TestBlocksMatchReference targets the block-cut tree analysis: on random
// boards with narrow passages it must restrict the start cells, or find
// no game, on many of them, and the answers must still be the
// reference's.
func TestBlocksMatchReference(t *testing.T) {
	rng := rand.New(rand.NewSource(35))
	count := 1500
	if testing.Short() {
		count = 300
	}
	restricted, refused := 0, 0
	for k := 0; k < count; k++ {
		board := randomBoard(rng, 2+rng.Intn(5), 2+rng.Intn(6), 0.1+0.2*rng.Float64())
		s := newSearcher(context.Background(), Puzzle{Board: board}, Options{}, tuning{})
		if want, _ := refSolve(board, 0); want >= 0 {
			// A solvable board is connected, which blockStarts needs.
			starts, restrict, ok := s.blockStarts(new(blockScratch))
			if !ok {
				t.Fatalf("board %q has answer %d but the blocks say no game", board, want)
			}
			if restrict {
				restricted++
				res, err := Solve(context.Background(), Puzzle{Board: board}, Options{})
				if err != nil || res.Moves != want {
					t.Fatalf("board %q: got %d (%v), reference %d", board, res.Moves, err, want)
				}
				// No complete game starts on a cell the analysis left out.
				for i := range board {
					for j := range board[i] {
						if board[i][j] == '.' && starts[i+1]>>j&1 == 0 {
							if got := refFrom(board, i, j); got >= 0 {
								t.Fatalf("board %q: a %d-roll game starts at (%d, %d), which the blocks excluded", board, got, i, j)
							}
						}
					}
				}
			}
		} else if _, _, ok := s.blockStarts(new(blockScratch)); !ok {
			refused++
		}
		checkAgainstReference(t, board, tuning{})
		checkAgainstReference(t, board, tuning{noBlocks: true})
	}
	t.Logf("%d boards: starts restricted on %d solvable ones, no game found by the blocks on %d", count, restricted, refused)
	if restricted < count/20 || refused < count/20 {
		t.Fatalf("the analysis restricted %d and refused %d of %d boards: too few to test it", restricted, refused, count)
	}
}
