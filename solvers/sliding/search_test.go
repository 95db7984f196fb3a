package sliding

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/solvers"
)

// goalGrid returns the goal board of an R×C shape.
func goalGrid(rows, cols int) [][]int {
	b := make([][]int, rows)
	for r := range b {
		b[r] = make([]int, cols)
		for c := range b[r] {
			b[r][c] = (r*cols + c + 1) % (rows * cols)
		}
	}
	return b
}

// randomWalk returns the board reached from the goal by a walk of length
// moves of the blank that never undoes its previous move, with the
// independent simulator replay.
func randomWalk(rng *rand.Rand, rows, cols, length int) [][]int {
	b := goalGrid(rows, cols)
	undo := map[byte]byte{'D': 'U', 'U': 'D', 'L': 'R', 'R': 'L'}
	var last byte
	for done := 0; done < length; {
		m := "DLRU"[rng.IntN(4)]
		if last != 0 && m == undo[last] {
			continue
		}
		nb, err := replay(b, string(m))
		if err != nil {
			continue
		}
		b, last = nb, m
		done++
	}
	return b
}

// gridKey is a board as an array, for the maps of boundedBFS.
type gridKey [maxCells]int8

// boundedBFS is an oracle independent of the package's code: a
// bidirectional breadth-first search over boards as arrays, to depth
// ceil(limit/2) from the board and floor(limit/2) from the goal. It returns
// the exact distance when it is at most limit, else -1.
func boundedBFS(board [][]int, limit int) int {
	rows, cols := len(board), len(board[0])
	var start, goal gridKey
	for r, row := range board {
		for c, v := range row {
			start[r*cols+c] = int8(v)
			goal[r*cols+c] = int8((r*cols + c + 1) % (rows * cols))
		}
	}
	ball := func(from gridKey, depth int) map[gridKey]int {
		seen := map[gridKey]int{from: 0}
		frontier := []gridKey{from}
		for d := 1; d <= depth; d++ {
			var next []gridKey
			for _, s := range frontier {
				z := slices.Index(s[:], 0)
				r, c := z/cols, z%cols
				for _, dd := range [4][2]int{{1, 0}, {-1, 0}, {0, 1}, {0, -1}} {
					nr, nc := r+dd[0], c+dd[1]
					if nr < 0 || nr >= rows || nc < 0 || nc >= cols {
						continue
					}
					t := s
					t[z], t[nr*cols+nc] = t[nr*cols+nc], 0
					if _, ok := seen[t]; !ok {
						seen[t] = d
						next = append(next, t)
					}
				}
			}
			frontier = next
		}
		return seen
	}
	a := ball(start, (limit+1)/2)
	b := ball(goal, limit/2)
	best := -1
	for s, da := range a {
		if db, ok := b[s]; ok && (best < 0 || da+db < best) {
			best = da + db
		}
	}
	return best
}

// searchShapesUnderTest lists every shape solved by search. Under -race,
// where building databases is several times slower, only the shapes with
// the cheapest databases are kept (the database code is the same for all);
// 4×4 in particular needs about 6.5 s of CPU for its two six-tile databases.
func searchShapesUnderTest() [][2]int {
	if raceEnabled {
		return [][2]int{{2, 5}, {5, 2}, {2, 6}, {3, 4}, {4, 3}}
	}
	return [][2]int{{2, 5}, {5, 2}, {2, 6}, {6, 2}, {3, 4}, {4, 3}, {2, 7}, {7, 2}, {2, 8}, {8, 2}, {3, 5}, {5, 3}, {4, 4}}
}

// TestSearchRandomWalks solves boards made by random walks from the goal on
// every searched shape: short walks against the bidirectional BFS, longer
// ones for moves <= walk length with the same parity and a path the
// independent replay takes to the goal.
func TestSearchRandomWalks(t *testing.T) {
	rng := newRand(16)
	for _, s := range searchShapesUnderTest() {
		rows, cols := s[0], s[1]
		checked := 0
		for _, length := range []int{0, 1, 2, 5, 9, 12, 14, 16, 20, 30, 40, 60} {
			if raceEnabled && length > 30 {
				continue
			}
			for range 2 {
				b := randomWalk(rng, rows, cols, length)
				if length <= 16 || (length <= 20 && !raceEnabled && rows*cols < 16) {
					checkAgainst(t, b, boundedBFS(b, length))
					checked++
					continue
				}
				res, err := Solve(t.Context(), Puzzle{Board: b}, Options{})
				if err != nil {
					t.Fatalf("%dx%d %s: %v", rows, cols, boardString(b), err)
				}
				if !res.Solvable || res.Moves > length || (length-res.Moves)%2 != 0 {
					t.Fatalf("%dx%d %s: walk of %d, got %+v", rows, cols, boardString(b), length, res)
				}
				checkAgainst(t, b, res.Moves) // path replay
				checked++
			}
		}
		t.Logf("%dx%d: %d boards", rows, cols, checked)
	}
}

// TestSearchTwentyMoves4x4 compares 4×4 walks of 18 to 20 moves with the
// bidirectional BFS (the PDB heuristic must not overshoot anywhere).
func TestSearchTwentyMoves4x4(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("4×4 databases are slow to build under -race; skipped in -short")
	}
	rng := newRand(20)
	for i := range 6 {
		b := randomWalk(rng, 4, 4, 18+i%3)
		checkAgainst(t, b, boundedBFS(b, 18+i%3))
	}
}

// TestTranspose checks that transposing a board maps the goal to the goal
// and preserves solvability, and that a transposed path replays.
func TestTranspose(t *testing.T) {
	for _, s := range [][2]int{{5, 2}, {4, 3}, {5, 3}, {8, 2}, {2, 3}} {
		rows, cols := s[0], s[1]
		n := rows * cols
		if g, z := transpose(goalBoard(n), rows, cols); g != goalBoard(n) || z != n-1 {
			t.Fatalf("%dx%d: goal transposes to %x, blank %d", rows, cols, uint64(g), z)
		}
		rng := newRand(uint64(n))
		for range 50 {
			b := randomBoard(rng, rows, cols)
			p, z := pack(b)
			tp, tz := transpose(p, rows, cols)
			if solvable(p, z, rows, cols) != solvable(tp, tz, cols, rows) {
				t.Fatalf("%dx%d %s: transposing changes solvability", rows, cols, boardString(b))
			}
		}
	}
}

// TestParityExhaustive compares the parity rule with reachability by a BFS
// from the goal (over arrays, independent of the table code) for every
// arrangement of every shape of at most 9 cells: 2×2, 2×3, 3×2, 2×4, 4×2
// and 3×3 (362,880 arrangements; 3×3 is skipped under -race).
func TestParityExhaustive(t *testing.T) {
	shapes := [][2]int{{2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}, {3, 3}}
	if raceEnabled {
		shapes = shapes[:5]
	}
	for _, s := range shapes {
		rows, cols := s[0], s[1]
		n := rows * cols
		reach := boundedBFSBall(rows, cols)
		perm := make([]int, n)
		for i := range perm {
			perm[i] = i
		}
		count, solv := 0, 0
		var rec func(k int)
		rec = func(k int) {
			if k == n {
				var key gridKey
				var p packed
				blank := 0
				for i, v := range perm {
					key[i] = int8(v)
					p |= packed(v) << (4 * uint(i))
					if v == 0 {
						blank = i
					}
				}
				_, ok := reach[key]
				if solvable(p, blank, rows, cols) != ok {
					t.Fatalf("%dx%d %v: parity rule %v, reachable %v", rows, cols, perm, !ok, ok)
				}
				count++
				if ok {
					solv++
				}
				return
			}
			for i := k; i < n; i++ {
				perm[k], perm[i] = perm[i], perm[k]
				rec(k + 1)
				perm[k], perm[i] = perm[i], perm[k]
			}
		}
		rec(0)
		if solv*2 != count {
			t.Fatalf("%dx%d: %d of %d reachable, want half", rows, cols, solv, count)
		}
		t.Logf("%dx%d: %d arrangements, %d reachable", rows, cols, count, solv)
	}
}

// boundedBFSBall returns every board reachable from the goal of a small
// shape, by a plain BFS over arrays.
func boundedBFSBall(rows, cols int) map[gridKey]struct{} {
	var goal gridKey
	for i := 0; i < rows*cols; i++ {
		goal[i] = int8((i + 1) % (rows * cols))
	}
	seen := map[gridKey]struct{}{goal: {}}
	queue := []gridKey{goal}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		z := slices.Index(s[:], 0)
		r, c := z/cols, z%cols
		for _, dd := range [4][2]int{{1, 0}, {-1, 0}, {0, 1}, {0, -1}} {
			nr, nc := r+dd[0], c+dd[1]
			if nr < 0 || nr >= rows || nc < 0 || nc >= cols {
				continue
			}
			u := s
			u[z], u[nr*cols+nc] = u[nr*cols+nc], 0
			if _, ok := seen[u]; !ok {
				seen[u] = struct{}{}
				queue = append(queue, u)
			}
		}
	}
	return seen
}

// TestParityLargeShapes checks the parity rule on the searched shapes:
// random walks are solvable, and swapping two tiles of one makes it
// unsolvable (answered at once with -1).
func TestParityLargeShapes(t *testing.T) {
	rng := newRand(7)
	for _, s := range [][2]int{{2, 5}, {5, 2}, {2, 6}, {3, 4}, {4, 3}, {2, 7}, {2, 8}, {8, 2}, {3, 5}, {5, 3}, {4, 4}} {
		// Unsolvable boards are answered before any database is needed.
		for range 20 {
			b := randomWalk(rng, s[0], s[1], 200)
			p, z := pack(b)
			if !solvable(p, z, s[0], s[1]) || !naiveSolvable(b) {
				t.Fatalf("%dx%d %s: walk board judged unsolvable", s[0], s[1], boardString(b))
			}
			// Swap two tiles (not the blank).
			var cells [][2]int
			for r, row := range b {
				for c, v := range row {
					if v != 0 {
						cells = append(cells, [2]int{r, c})
					}
				}
			}
			a, c := cells[0], cells[len(cells)-1]
			b[a[0]][a[1]], b[c[0]][c[1]] = b[c[0]][c[1]], b[a[0]][a[1]]
			res, err := Solve(t.Context(), Puzzle{Board: b}, Options{MaxNodes: 1})
			if err != nil || res.Moves != -1 || res.Solvable || res.Path != "" {
				t.Fatalf("%dx%d %s: swapped board gives %+v, %v", s[0], s[1], boardString(b), res, err)
			}
		}
	}
}

// korfInstance is one of Korf's 100 random 15-puzzle instances, converted
// to our goal (testdata/korf100_goal_1to15_blank_last.tsv).
type korfInstance struct {
	id, optimal int
	board       [][]int
	mdNodes     int64 // IDA*+Manhattan nodes generated, from the check file
}

// loadKorf reads the 100 instances and the Manhattan node counts.
func loadKorf(tb testing.TB) []korfInstance {
	tb.Helper()
	read := func(name string) [][]string {
		f, err := os.Open(filepath.Join("testdata", name))
		if err != nil {
			tb.Fatal(err)
		}
		defer f.Close()
		var rows [][]string
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			rows = append(rows, strings.Split(sc.Text(), "\t"))
		}
		return rows
	}
	var out []korfInstance
	for _, r := range read("korf100_goal_1to15_blank_last.tsv") {
		id, _ := strconv.Atoi(r[0])
		opt, _ := strconv.Atoi(r[2])
		tiles := strings.Fields(r[1])
		b := make([][]int, 4)
		for i := range b {
			b[i] = make([]int, 4)
			for j := range b[i] {
				b[i][j], _ = strconv.Atoi(tiles[i*4+j])
			}
		}
		out = append(out, korfInstance{id: id, optimal: opt, board: b})
	}
	for i, r := range read("korf100_ida_manhattan_check.tsv") {
		id, _ := strconv.Atoi(r[0])
		nodes, _ := strconv.ParseInt(r[3], 10, 64)
		if id != out[i].id {
			tb.Fatalf("check file row %d is instance %d, want %d", i, id, out[i].id)
		}
		out[i].mdNodes = nodes
	}
	if len(out) != 100 {
		tb.Fatalf("%d instances, want 100", len(out))
	}
	return out
}

// easiestKorf returns the k instances that IDA* with the Manhattan
// distance solves with the fewest nodes.
func easiestKorf(all []korfInstance, k int) []korfInstance {
	s := slices.Clone(all)
	slices.SortFunc(s, func(a, b korfInstance) int { return int(a.mdNodes - b.mdNodes) })
	return s[:k]
}

// TestKorfEasiest solves the five easiest of Korf's instances (by the
// Manhattan node counts) and checks the published optimal lengths.
func TestKorfEasiest(t *testing.T) {
	if raceEnabled {
		t.Skip("4×4 databases are slow to build under -race")
	}
	for _, in := range easiestKorf(loadKorf(t), 5) {
		res, err := Solve(t.Context(), Puzzle{Board: in.board}, Options{})
		if err != nil {
			t.Fatalf("#%d: %v", in.id, err)
		}
		if res.Moves != in.optimal {
			t.Fatalf("#%d: %d moves, optimal %d", in.id, res.Moves, in.optimal)
		}
		checkAgainst(t, in.board, in.optimal)
	}
}

// TestKorfParity checks that all 100 converted instances pass the parity
// rule, and that Korf's goal itself (blank first) does not: the two goals
// lie in different classes.
func TestKorfParity(t *testing.T) {
	for _, in := range loadKorf(t) {
		if p, z := pack(in.board); !solvable(p, z, 4, 4) {
			t.Fatalf("#%d unsolvable by the parity rule", in.id)
		}
	}
	p, z := pack([][]int{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}})
	if solvable(p, z, 4, 4) {
		t.Fatal("Korf's goal judged reachable from ours")
	}
}

// TestKorf80 settles which goal the 80-move position
// "0 12 9 13 15 11 10 14 3 7 2 5 4 8 6 1" belongs to. Taken as blank-first
// (Korf's goal) and converted as the data README says (rotate 180°,
// v → 16-v), it fails our parity rule: it has 79 inversions with the
// blank in the top row, odd for Korf's goal. As it stands it passes the
// rule for our goal (79 + 3 rows to the bottom is even), and IDA* solves
// it in 80 moves (BenchmarkHardest80). So it is listed for the goal
// 1..15 with the blank last, and the benchmark uses it unconverted.
func TestKorf80(t *testing.T) {
	korf := []int{0, 12, 9, 13, 15, 11, 10, 14, 3, 7, 2, 5, 4, 8, 6, 1}
	var conv [16]int
	for p, v := range korf {
		if v != 0 {
			v = 16 - v
		}
		conv[15-p] = v
	}
	var cp packed
	for i, v := range conv {
		cp |= packed(v) << (4 * uint(i))
	}
	if solvable(cp, 15, 4, 4) {
		t.Fatal("converted board passes the parity rule")
	}
	b := hardest80()
	p, z := pack(b)
	if !solvable(p, z, 4, 4) || inversions(p, 16) != 79 {
		t.Fatalf("%s: unsolvable or not 79 inversions", boardString(b))
	}
}

// hardest80 returns one of the 17 hardest 15-puzzle positions (80 moves
// to the goal 1..15 with the blank last).
func hardest80() [][]int {
	return [][]int{{0, 12, 9, 13}, {15, 11, 10, 14}, {3, 7, 2, 5}, {4, 8, 6, 1}}
}

func TestBudgetExceeded(t *testing.T) {
	b := randomWalk(newRand(5), 3, 4, 300)
	_, err := Solve(t.Context(), Puzzle{Board: b}, Options{MaxNodes: 1000})
	if !errors.Is(err, solvers.ErrBudgetExceeded) {
		t.Fatalf("err = %v, want ErrBudgetExceeded", err)
	}
	// The same board within the default budget.
	res, err := Solve(t.Context(), Puzzle{Board: b}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkAgainst(t, b, res.Moves)
}

func TestProgress(t *testing.T) {
	b := randomWalk(newRand(5), 3, 4, 300)
	var bounds []int
	var last int64
	calls := 0
	res, err := Solve(t.Context(), Puzzle{Board: b}, Options{Progress: func(bound int, nodes int64) {
		calls++
		if len(bounds) == 0 || bound != bounds[len(bounds)-1] {
			bounds = append(bounds, bound)
		}
		if nodes < last {
			t.Errorf("nodes went back from %d to %d", last, nodes)
		}
		last = nodes
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(bounds) == 0 || bounds[len(bounds)-1] != res.Moves || !slices.IsSorted(bounds) {
		t.Fatalf("bounds %v, moves %d", bounds, res.Moves)
	}
	t.Logf("%d moves, %d calls, bounds %v, %d nodes at the last call", res.Moves, calls, bounds, last)
}

func TestCancelPrompt(t *testing.T) {
	if raceEnabled {
		t.Skip("the 4×4 databases are slow to build under -race")
	}
	b := hardest80() // 1.1 G nodes of search, far beyond 50 ms
	// Build the databases outside the timing.
	if _, err := heuristicFor(t.Context(), 4, 4); err != nil {
		t.Fatal(err)
	}
	// On a loaded machine one attempt can lose the CPU for a while after
	// cancel; the best of three must be under 100 ms, every one under 1 s.
	best := time.Hour
	for attempt := range 3 {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			_, err := Solve(ctx, Puzzle{Board: b}, Options{})
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		t0 := time.Now()
		cancel()
		var err error
		select {
		case err = <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Solve did not return 5 s after cancel")
		}
		took := time.Since(t0)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled (board too easy?)", err)
		}
		if took > time.Second {
			t.Fatalf("attempt %d: returned %v after cancel", attempt, took)
		}
		t.Logf("attempt %d: returned %v after cancel", attempt, took)
		best = min(best, took)
	}
	if best > 100*time.Millisecond {
		t.Fatalf("returned %v after cancel at best", best)
	}
}

// TestPDBFileCache writes a database to a temporary directory, reads it
// back, then damages one byte: the damage is detected and loadOrBuild
// rebuilds and rewrites the file.
func TestPDBFileCache(t *testing.T) {
	dir := t.TempDir()
	tiles := []uint8{1, 2, 3, 6, 7}
	p, err := loadOrBuild(dir, 2, 5, tiles)
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, pdbFileName(2, 5, tiles))
	q, ok := readPDB(dir, 2, 5, tiles)
	if !ok || !slices.Equal(p.data, q.data) {
		t.Fatal("written database does not read back")
	}
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int{len(raw) - 1, len(raw) / 2, 3, 9} {
		bad := slices.Clone(raw)
		bad[off] ^= 0x10
		if err := os.WriteFile(name, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, ok := readPDB(dir, 2, 5, tiles); ok {
			t.Fatalf("byte %d damaged, file still accepted", off)
		}
		r, err := loadOrBuild(dir, 2, 5, tiles)
		if err != nil || !slices.Equal(r.data, p.data) {
			t.Fatalf("rebuild after damage: %v", err)
		}
		if again, _ := os.ReadFile(name); !slices.Equal(again, raw) {
			t.Fatalf("byte %d damaged: file not rewritten", off)
		}
	}
	if err := os.WriteFile(name, raw[:100], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := readPDB(dir, 2, 5, tiles); ok {
		t.Fatal("truncated file accepted")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("%d files in the cache, want 1 (temporary files left?)", len(entries))
	}
}

// TestPreload runs Preload into a temporary directory (building what Solve
// has not built yet and writing every file), then checks that every file
// verifies and PDBMemory reports the documented total.
func TestPreload(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("builds every database; slow under -race")
	}
	dir := t.TempDir()
	t0, c0 := time.Now(), int64(testgen.ProcessCPU())
	if err := Preload(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("Preload: %v wall, %v CPU (builds not yet done by other tests); "+
		"peak RSS %.1f MiB, heap in use %.1f MiB, PDBMemory %.1f MiB",
		time.Since(t0), time.Duration(int64(testgen.ProcessCPU())-c0), float64(testgen.ProcessMaxRSS())/(1<<20),
		float64(ms.HeapInuse)/(1<<20), float64(PDBMemory())/(1<<20))
	for _, s := range searchShapes {
		for _, g := range s.groups {
			if _, ok := readPDB(dir, s.rows, s.cols, g); !ok {
				t.Fatalf("%dx%d %v: no valid file", s.rows, s.cols, g)
			}
		}
	}
	if m := PDBMemory(); m != pdbMemoryTotal {
		t.Fatalf("PDBMemory = %d, documented %d", m, pdbMemoryTotal)
	}
	if err := Preload(t.Context(), dir); err != nil { // idempotent
		t.Fatal(err)
	}
}

// TestPreloadCancelled returns ctx.Err() at once when ctx is already
// done, without starting any build.
func TestPreloadCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := Preload(ctx, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

// TestSearchConcurrent has goroutines hit cold searched shapes at once;
// under -race it checks the lazy database builds.
func TestSearchConcurrent(t *testing.T) {
	shapes := [][2]int{{2, 5}, {5, 2}, {2, 6}, {3, 4}, {4, 3}}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			rng := newRand(uint64(100 + g))
			for i := range 6 {
				s := shapes[(g+i)%len(shapes)]
				b := randomWalk(rng, s[0], s[1], 25)
				res, err := Solve(context.Background(), Puzzle{Board: b}, Options{})
				if err != nil || !res.Solvable || res.Moves > 25 {
					t.Errorf("%dx%d %s: %+v, %v", s[0], s[1], boardString(b), res, err)
				}
			}
		})
	}
	wg.Wait()
}

// TestManhattanHeuristic checks that the single-tile databases are the
// Manhattan distance, and that the pattern databases dominate it, on
// random 3×4 boards (cheap to build).
func TestManhattanHeuristic(t *testing.T) {
	md := manhattanHeuristic(3, 4)
	h, err := heuristicFor(t.Context(), 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	rng := newRand(3)
	for range 200 {
		b := randomBoard(rng, 3, 4)
		var pos [maxCells]uint8
		want := 0
		for r, row := range b {
			for c, v := range row {
				pos[v] = uint8(r*4 + c)
				if v != 0 {
					want += abs(r-(v-1)/4) + abs(c-(v-1)%4)
				}
			}
		}
		got, pd := 0, 0
		for g := range md.groups {
			got += md.lookup(g, &pos)
		}
		for g := range h.groups {
			pd += h.lookup(g, &pos)
		}
		if got != want {
			t.Fatalf("%s: single-tile sum %d, Manhattan %d", boardString(b), got, want)
		}
		if pd < want {
			t.Fatalf("%s: pattern databases %d below Manhattan %d", boardString(b), pd, want)
		}
	}
}

// TestMain preloads the pattern databases from the directory named by
// $PUZZLEQ_SLIDING_PDB_DIR when it is set (creating it and the files on
// the first run), so that repeated test runs, on CI for instance, skip the
// 4×4 build (about 7 s of CPU) and load the files in milliseconds. Unset,
// the tests build what they need in memory.
func TestMain(m *testing.M) {
	if dir := os.Getenv("PUZZLEQ_SLIDING_PDB_DIR"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "sliding tests:", err)
			os.Exit(1)
		}
		if err := Preload(context.Background(), dir); err != nil {
			fmt.Fprintln(os.Stderr, "sliding tests: preload:", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}
