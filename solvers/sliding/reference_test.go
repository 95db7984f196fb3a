package sliding

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// referenceBFS is a plain port of the textbook solution (Python, seed
// 000): a BFS from the start board over boards written as strings, with a
// map from board to moves. It is generalised from 3×3 to R×C with one
// digit per cell (at most 10 cells) and is deliberately left unoptimised:
// it is the oracle the table method is checked against, and the baseline
// of BenchmarkQuery.
func referenceBFS(board [][]int) int {
	rows, cols := len(board), len(board[0])
	var sb strings.Builder
	for _, row := range board {
		for _, v := range row {
			sb.WriteByte(byte('0' + v))
		}
	}
	start := sb.String()
	var gb strings.Builder
	for v := 1; v < rows*cols; v++ {
		gb.WriteByte(byte('0' + v))
	}
	gb.WriteByte('0')
	target := gb.String()

	dx := []int{1, -1, 0, 0}
	dy := []int{0, 0, 1, -1}
	visited := map[string]int{start: 0}
	queue := []string{start}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		if v == target {
			return visited[v]
		}
		pos := strings.IndexByte(v, '0')
		x0, y0 := pos/cols, pos%cols
		for i := range 4 {
			x, y := x0+dx[i], y0+dy[i]
			if x < 0 || x >= rows || y < 0 || y >= cols {
				continue
			}
			next := []byte(v)
			next[pos], next[x*cols+y] = next[x*cols+y], next[pos]
			ns := string(next)
			if _, ok := visited[ns]; !ok {
				visited[ns] = visited[v] + 1
				queue = append(queue, ns)
			}
		}
	}
	return -1
}

// replay plays path on a copy of board with its own move rules (not the
// package's packed boards) and returns the final board, or an error when a
// move is not a letter U, D, L, R or leaves the board.
func replay(board [][]int, path string) ([][]int, error) {
	b := make([][]int, len(board))
	r0, c0 := -1, -1
	for i, row := range board {
		b[i] = append([]int(nil), row...)
		for j, v := range row {
			if v == 0 {
				r0, c0 = i, j
			}
		}
	}
	for k, m := range []byte(path) {
		r, c := r0, c0
		switch m {
		case 'U':
			r--
		case 'D':
			r++
		case 'L':
			c--
		case 'R':
			c++
		default:
			return nil, fmt.Errorf("move %d: bad letter %q", k+1, m)
		}
		if r < 0 || r >= len(b) || c < 0 || c >= len(b[0]) {
			return nil, fmt.Errorf("move %d (%c) leaves the board", k+1, m)
		}
		b[r0][c0], b[r][c] = b[r][c], 0
		r0, c0 = r, c
	}
	return b, nil
}

// isGoal reports whether b is 1, 2, ..., n-1 with the blank last.
func isGoal(b [][]int) bool {
	n := len(b) * len(b[0])
	k := 0
	for _, row := range b {
		for _, v := range row {
			k++
			if v != k%n {
				return false
			}
		}
	}
	return true
}

// randomBoard returns a uniformly random arrangement of 0..R*C-1; about
// half of them are unsolvable.
func randomBoard(rng *rand.Rand, rows, cols int) [][]int {
	perm := rng.Perm(rows * cols)
	b := make([][]int, rows)
	for i := range b {
		b[i] = perm[i*cols : (i+1)*cols]
	}
	return b
}

// boardString renders a board as "1 0 3 / 4 2 5 / 7 8 6" for messages.
func boardString(b [][]int) string {
	rows := make([]string, len(b))
	for i, row := range b {
		rows[i] = strings.Trim(fmt.Sprint(row), "[]")
	}
	return strings.Join(rows, " / ")
}

// checkAgainst checks Solve on board against the reference answer want:
// same moves and solvability, and a path that an independent replay takes
// to the goal in exactly Moves steps.
func checkAgainst(t testing.TB, board [][]int, want int) {
	t.Helper()
	got, err := Solve(t.Context(), Puzzle{Board: board}, Options{})
	if err != nil {
		t.Fatalf("%s: Solve: %v", boardString(board), err)
	}
	if got.Moves != want || got.Solvable != (want >= 0) {
		t.Fatalf("%s: got moves %d solvable %v, reference %d", boardString(board), got.Moves, got.Solvable, want)
	}
	if want < 0 {
		if got.Path != "" {
			t.Fatalf("%s: unsolvable but path %q", boardString(board), got.Path)
		}
		return
	}
	if len(got.Path) != got.Moves {
		t.Fatalf("%s: path %q has %d moves, want %d", boardString(board), got.Path, len(got.Path), got.Moves)
	}
	end, err := replay(board, got.Path)
	if err != nil {
		t.Fatalf("%s: path %q: %v", boardString(board), got.Path, err)
	}
	if !isGoal(end) {
		t.Fatalf("%s: path %q ends at %s", boardString(board), got.Path, boardString(end))
	}
}

// TestReferenceProperty compares Solve with the textbook BFS on random
// boards of every supported shape, solvable and not.
func TestReferenceProperty(t *testing.T) {
	n33 := 20 // the reference takes about 0.2 s per 3×3 board (1 s or more under -race)
	if testing.Short() || raceEnabled {
		n33 = 4
	}
	shapes := []struct{ rows, cols, count int }{
		{2, 2, 600},
		{2, 3, 700},
		{3, 2, 700},
		{3, 3, n33},
		{2, 4, 20},
		{4, 2, 20},
	}
	rng := rand.New(rand.NewPCG(1525, 2026))
	total, solvableCount := 0, 0
	for _, s := range shapes {
		for range s.count {
			b := randomBoard(rng, s.rows, s.cols)
			want := referenceBFS(b)
			checkAgainst(t, b, want)
			total++
			if want >= 0 {
				solvableCount++
			}
		}
	}
	if total < 2000 {
		t.Fatalf("only %d instances", total)
	}
	t.Logf("%d random boards, %d solvable", total, solvableCount)
}

// TestExhaustiveSmallShapes checks every arrangement of the small shapes
// (24 for 2×2, 720 for 2×3 and 3×2) against the reference: this covers
// the parity rule and the ranking in full for those shapes.
func TestExhaustiveSmallShapes(t *testing.T) {
	for _, s := range [][2]int{{2, 2}, {2, 3}, {3, 2}} {
		rows, cols := s[0], s[1]
		n := rows * cols
		perm := make([]int, n)
		for i := range perm {
			perm[i] = i
		}
		count := 0
		var rec func(k int)
		rec = func(k int) {
			if k == n {
				b := make([][]int, rows)
				for i := range b {
					b[i] = append([]int(nil), perm[i*cols:(i+1)*cols]...)
				}
				checkAgainst(t, b, referenceBFS(b))
				count++
				return
			}
			for i := k; i < n; i++ {
				perm[k], perm[i] = perm[i], perm[k]
				rec(k + 1)
				perm[k], perm[i] = perm[i], perm[k]
			}
		}
		rec(0)
		t.Logf("%dx%d: %d boards", rows, cols, count)
	}
}

// newRand returns a deterministic generator for test boards.
func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 1525)) }
