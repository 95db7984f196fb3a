package sweep

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Regenerate the corpus with
//
//	go test -run=TestGenerateCorpus -sweep.gen -timeout=30m ./solvers/sweep/
//
// It is deterministic given the seeds below, except that boards are kept
// only if the reference finishes within refGenNodes rolls.
var (
	genCorpus = flag.Bool("sweep.gen", false, "regenerate testdata/corpus with answers from the reference")
	genSet    = flag.String("sweep.genset", "", "with -sweep.gen, regenerate only this set")
)

const corpusDir = "testdata/corpus"

// corpusSets names the corpus files, in the order benchmarks report them.
var corpusSets = []string{"random", "hard", "heavy", "built", "open", "hard30"}

// refGenNodes caps the reference per board during generation: a few
// seconds of plain search on this hardware, so the whole corpus stays a
// couple of minutes for the reference benchmark.
const refGenNodes = 40_000_000

// refHard30Nodes caps the reference on the "hard30" set: up to about a
// minute of plain search per board.
const refHard30Nodes = 600_000_000

// refHeavyNodes is the cap for the "heavy" set, which exists to hold
// boards that take the reference seconds (at most about 15 here).
const refHeavyNodes = 200_000_000

type corpusBoard struct {
	set   string
	index int // 1-based case number in its file
	board []string
	want  int
}

func loadCorpus(t testing.TB) []corpusBoard {
	t.Helper()
	var out []corpusBoard
	for _, set := range corpusSets {
		in, err := os.ReadFile(filepath.Join(corpusDir, set+".txt"))
		if err != nil {
			t.Fatal(err)
		}
		ans, err := os.ReadFile(filepath.Join(corpusDir, set+".ans"))
		if err != nil {
			t.Fatal(err)
		}
		ps, err := ParseBOJ9944(bytes.NewReader(in))
		if err != nil {
			t.Fatalf("%s.txt: %v", set, err)
		}
		lines := strings.Split(strings.TrimSpace(string(ans)), "\n")
		if len(lines) != len(ps) {
			t.Fatalf("%s: %d boards but %d answers", set, len(ps), len(lines))
		}
		for i, p := range ps {
			var k, want int
			if _, err := fmt.Sscanf(lines[i], "Case %d: %d", &k, &want); err != nil || k != i+1 {
				t.Fatalf("%s.ans line %d: %q", set, i+1, lines[i])
			}
			out = append(out, corpusBoard{set: set, index: i + 1, board: p.Board, want: want})
		}
	}
	return out
}

func (b corpusBoard) name() string {
	return fmt.Sprintf("%s-%02d-%dx%d", b.set, b.index, len(b.board), len(b.board[0]))
}

// TestCorpus checks the committed answers, which came from the reference.
func TestCorpus(t *testing.T) {
	for _, b := range loadCorpus(t) {
		res, err := Solve(context.Background(), Puzzle{Board: b.board}, Options{})
		if err != nil {
			t.Fatalf("%s: %v", b.name(), err)
		}
		if res.Moves != b.want {
			t.Errorf("%s: got %d, want %d", b.name(), res.Moves, b.want)
		}
		if msg := replay(b.board, res); msg != "" {
			t.Errorf("%s: %s", b.name(), msg)
		}
	}
}

func TestGenerateCorpus(t *testing.T) {
	if !*genCorpus {
		t.Skip("pass -sweep.gen to regenerate the corpus")
	}
	if err := os.MkdirAll(corpusDir, 0o755); err != nil {
		t.Fatal(err)
	}
	gens := map[string]struct {
		want     int
		minNodes int64 // keep only boards that make the reference work this much
		make     func(rng *rand.Rand) []string
	}{
		"random": {14, 0, func(rng *rand.Rand) []string {
			n, m := 3+rng.Intn(28), 3+rng.Intn(28)
			return randomBoard(rng, n, m, 0.05+0.25*rng.Float64())
		}},
		"hard": {14, 60_000, func(rng *rand.Rand) []string {
			n, m := 6+rng.Intn(13), 6+rng.Intn(13)
			return hardBoard(rng, n, m, 0.05+0.25*rng.Float64())
		}},
		// Boards that take the reference seconds, whatever their answer:
		// the bulk of its benchmark time.
		"heavy": {8, 40_000_000, func(rng *rand.Rand) []string {
			n, m := 18+rng.Intn(13), 18+rng.Intn(13)
			return hardBoard(rng, n, m, 0.05+0.2*rng.Float64())
		}},
		"built": {12, 0, func(rng *rand.Rand) []string {
			n, m := 5+rng.Intn(26), 5+rng.Intn(26)
			return builtBoard(rng, randomBoard(rng, n, m, 0.1*rng.Float64()))
		}},
		// 30x30 boards that take the reference seconds to a minute: in
		// turn boards without dead ends (hardBoard), plain random boards
		// and boards built from a random game (so solvable, with long
		// corridors). At most a quarter may be decided before any search
		// (by the parity or dead-end rule); the rest make our search
		// work. hard30.ref keeps the reference's nodes and time.
		"hard30": {12, 20_000_000, func(rng *rand.Rand) []string {
			switch rng.Intn(3) {
			case 0:
				return hardBoard(rng, 30, 30, 0.07+0.1*rng.Float64())
			case 1:
				return randomBoard(rng, 30, 30, 0.06+0.12*rng.Float64())
			}
			return builtBoard(rng, randomBoard(rng, 30, 30, 0.04*rng.Float64()))
		}},
		"open": {10, 0, func(rng *rand.Rand) []string {
			n, m := 2+rng.Intn(29), 2+rng.Intn(29)
			if rng.Intn(3) == 0 {
				return randomBoard(rng, n, m, 0)
			}
			return randomBoard(rng, n, m, 0.03*rng.Float64())
		}},
	}
	seeds := map[string]int64{"random": 1000, "hard": 1001, "built": 1002, "open": 1003, "heavy": 1004, "hard30": 1005}
	for _, set := range corpusSets {
		if *genSet != "" && set != *genSet {
			continue
		}
		g := gens[set]
		rng := rand.New(rand.NewSource(seeds[set]))
		var ps []Puzzle
		var rs []Result
		var total time.Duration
		deadline := time.Now().Add(150 * time.Second)
		limit := int64(refGenNodes)
		if set == "heavy" {
			deadline = time.Now().Add(400 * time.Second)
			limit = refHeavyNodes
		}
		var refLog bytes.Buffer
		rootDecided := 0
		if set == "hard30" {
			deadline = time.Now().Add(900 * time.Second)
			limit = refHard30Nodes
		}
		for tries := 0; len(ps) < g.want && tries < 5000 && time.Now().Before(deadline); tries++ {
			b := g.make(rng)
			if Validate(Puzzle{Board: b}) != nil {
				continue
			}
			if set == "hard30" && rootDecided >= g.want/4 {
				if _, n, _ := solveCount(context.Background(), Puzzle{Board: b}, Options{}, tuning{}); n == 0 {
					continue
				}
			}
			t0 := time.Now()
			want, nodes, ok := refSolveNodes(b, limit)
			el := time.Since(t0)
			if !ok {
				t.Logf("%s: dropped a %dx%d board, reference too slow", set, len(b), len(b[0]))
				continue
			}
			// Keep -1 boards, but not too many of them: the interesting
			// answers are the positive ones.
			if nodes < g.minNodes {
				continue
			}
			if want < 0 && countMinus(rs) >= g.want/2 && set != "heavy" && set != "hard30" {
				continue
			}
			got, err := Solve(context.Background(), Puzzle{Board: b}, Options{})
			if err != nil || got.Moves != want {
				t.Fatalf("solver disagrees with reference on\n%s\ngot %v %v want %d", strings.Join(b, "\n"), got.Moves, err, want)
			}
			total += el
			if _, n, _ := solveCount(context.Background(), Puzzle{Board: b}, Options{}, tuning{}); n == 0 {
				rootDecided++
			}
			fmt.Fprintf(&refLog, "Case %d: %d nodes %d time %.2fs\n", len(ps)+1, want, nodes, el.Seconds())
			ps = append(ps, Puzzle{Board: b})
			rs = append(rs, Result{Moves: want})
			t.Logf("%s %d: %dx%d answer %d reference %v", set, len(ps), len(b), len(b[0]), want, el)
		}
		var in, ans bytes.Buffer
		for _, p := range ps {
			fmt.Fprintf(&in, "%d %d\n%s\n", len(p.Board), len(p.Board[0]), strings.Join(p.Board, "\n"))
		}
		if err := FormatBOJ9944(&ans, rs); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(corpusDir, set+".txt"), in.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(corpusDir, set+".ans"), ans.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		if set == "hard30" {
			fmt.Fprintf(&refLog, "total: %.1fs\n", total.Seconds())
			if err := os.WriteFile(filepath.Join(corpusDir, set+".ref"), refLog.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%s: %d boards, reference total %v", set, len(ps), total)
	}
}

func countMinus(rs []Result) int {
	k := 0
	for _, r := range rs {
		if r.Moves < 0 {
			k++
		}
	}
	return k
}

// hardBoard fills every empty cell with at most one empty neighbour until
// none is left, then keeps only the largest connected region: what is left
// has no dead ends, which is where plain backtracking branches the most.
func hardBoard(rng *rand.Rand, n, m int, density float64) []string {
	g := toGrid(randomBoard(rng, n, m, density))
	empty := func(i, j int) bool { return i >= 0 && i < n && j >= 0 && j < m && g[i][j] == '.' }
	for changed := true; changed; {
		changed = false
		for i := 0; i < n; i++ {
			for j := 0; j < m; j++ {
				if g[i][j] != '.' {
					continue
				}
				deg := 0
				for _, d := range refDirs {
					if empty(i+d[0], j+d[1]) {
						deg++
					}
				}
				if deg <= 1 {
					g[i][j] = '*'
					changed = true
				}
			}
		}
	}
	// Largest region by flood fill.
	label := make([][]int, n)
	for i := range label {
		label[i] = make([]int, m)
	}
	best, bestSize, next := 0, 0, 0
	for i := 0; i < n; i++ {
		for j := 0; j < m; j++ {
			if g[i][j] != '.' || label[i][j] != 0 {
				continue
			}
			next++
			size := 0
			stack := [][2]int{{i, j}}
			label[i][j] = next
			for len(stack) > 0 {
				c := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				size++
				for _, d := range refDirs {
					a, b := c[0]+d[0], c[1]+d[1]
					if empty(a, b) && label[a][b] == 0 {
						label[a][b] = next
						stack = append(stack, [2]int{a, b})
					}
				}
			}
			if size > bestSize {
				best, bestSize = next, size
			}
		}
	}
	for i := 0; i < n; i++ {
		for j := 0; j < m; j++ {
			if g[i][j] == '.' && label[i][j] != best {
				g[i][j] = '*'
			}
		}
	}
	if bestSize == 0 {
		g[0][0] = '.'
	}
	return fromGrid(g)
}

// builtBoard plays random rolls on b from a random empty cell until the
// ball is stuck, then turns every unvisited cell into an obstacle, so the
// result is solvable in at most that many rolls.
func builtBoard(rng *rand.Rand, b []string) []string {
	g := toGrid(b)
	n, m := len(g), len(g[0])
	var cells [][2]int
	for i := range g {
		for j := range g[i] {
			if g[i][j] == '.' {
				cells = append(cells, [2]int{i, j})
			}
		}
	}
	c := cells[rng.Intn(len(cells))]
	seen := make([][]bool, n)
	for i := range seen {
		seen[i] = make([]bool, m)
	}
	open := func(i, j int) bool { return i >= 0 && i < n && j >= 0 && j < m && g[i][j] == '.' && !seen[i][j] }
	i, j := c[0], c[1]
	seen[i][j] = true
	for {
		var dirs [][2]int
		for _, d := range refDirs {
			if open(i+d[0], j+d[1]) {
				dirs = append(dirs, d)
			}
		}
		if len(dirs) == 0 {
			break
		}
		d := dirs[rng.Intn(len(dirs))]
		for open(i+d[0], j+d[1]) {
			i, j = i+d[0], j+d[1]
			seen[i][j] = true
		}
	}
	for a := range g {
		for b := range g[a] {
			if !seen[a][b] {
				g[a][b] = '*'
			}
		}
	}
	return fromGrid(g)
}

func toGrid(b []string) [][]byte {
	g := make([][]byte, len(b))
	for i, r := range b {
		g[i] = []byte(r)
	}
	return g
}

func fromGrid(g [][]byte) []string {
	b := make([]string, len(g))
	for i, r := range g {
		b[i] = string(r)
	}
	return b
}
