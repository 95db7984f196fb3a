package sliding

import (
	"bufio"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/puzzleq/puzzleq/solvers"
)

func TestSolveSamples(t *testing.T) {
	tests := []struct {
		name  string
		board [][]int
		want  Result
	}{
		{"official sample", [][]int{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}}, Result{3, true, "DRD"}},
		{"official unsolvable", [][]int{{3, 6, 0}, {8, 1, 2}, {7, 4, 5}}, Result{-1, false, ""}},
		{"goal", [][]int{{1, 2, 3}, {4, 5, 6}, {7, 8, 0}}, Result{0, true, ""}},
		{"one move", [][]int{{1, 2, 3}, {4, 5, 6}, {7, 0, 8}}, Result{1, true, "R"}},
		{"hardest 3x3 a", [][]int{{8, 6, 7}, {2, 5, 4}, {3, 0, 1}}, Result{Moves: 31, Solvable: true}},
		{"hardest 3x3 b", [][]int{{6, 4, 7}, {8, 5, 0}, {3, 2, 1}}, Result{Moves: 31, Solvable: true}},
		{"2x2", [][]int{{0, 1}, {3, 2}}, Result{Moves: 2, Solvable: true, Path: "RD"}},
		{"2x2 unsolvable", [][]int{{2, 1}, {3, 0}}, Result{-1, false, ""}},
		{"2x3 goal", [][]int{{1, 2, 3}, {4, 5, 0}}, Result{0, true, ""}},
		{"3x2 one move", [][]int{{1, 2}, {3, 0}, {5, 4}}, Result{1, true, "D"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Solve(t.Context(), Puzzle{Board: tc.board}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Moves != tc.want.Moves || got.Solvable != tc.want.Solvable ||
				(tc.want.Path != "" && got.Path != tc.want.Path) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			checkAgainst(t, tc.board, tc.want.Moves)
		})
	}
}

// TestSamplePathIsUnique shows that the sample's DRD does not depend on the
// tie-break order: it is the only shortest path. It counts shortest paths
// by walking the table in every direction that keeps to distance d-1.
func TestSamplePathIsUnique(t *testing.T) {
	b, blank := pack([][]int{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}})
	tb := tableFor(3, 3)
	var paths []string
	var walk func(s tileSeq, blank int, prefix string)
	walk = func(s tileSeq, blank int, prefix string) {
		i := tb.index(s, blank)
		d := tb.dist[i]
		if d == 0 {
			paths = append(paths, prefix)
			return
		}
		for k, to := range tb.nb[blank] {
			if to < 0 {
				continue
			}
			ns, j := tb.neighbourIndex(s, blank, i, int(to))
			if tb.dist[j] == d-1 {
				walk(ns, int(to), prefix+string(walkOrder[k].name))
			}
		}
	}
	walk(toSeq(b, blank), blank, "")
	if len(paths) != 1 || paths[0] != "DRD" {
		t.Fatalf("shortest paths %q, want only DRD", paths)
	}
}

// TestPathIsLexicographicallySmallest checks the documented tie-break on
// every board of the small shapes: the path equals the smallest shortest
// path found by brute force over all move strings of that length.
func TestPathIsLexicographicallySmallest(t *testing.T) {
	letters := "DLRU" // alphabetical
	undo := map[byte]byte{'D': 'U', 'U': 'D', 'L': 'R', 'R': 'L'}
	var smallest func(b [][]int, depth int, prefix string) (string, bool)
	smallest = func(b [][]int, depth int, prefix string) (string, bool) {
		if depth == 0 {
			return prefix, isGoal(b)
		}
		for _, l := range []byte(letters) {
			// A shortest path never undoes its previous move.
			if len(prefix) > 0 && prefix[len(prefix)-1] == undo[l] {
				continue
			}
			nb, err := replay(b, string(l))
			if err != nil {
				continue
			}
			if p, ok := smallest(nb, depth-1, prefix+string(l)); ok {
				return p, true
			}
		}
		return "", false
	}
	checked := 0
	for _, s := range [][2]int{{2, 2}, {2, 3}, {3, 2}} {
		for n := 0; n < 200; n++ {
			b := randomBoard(newRand(uint64(n)), s[0], s[1])
			res, err := Solve(t.Context(), Puzzle{Board: b}, Options{})
			if err != nil || !res.Solvable || res.Moves > 15 {
				continue // brute force is 3^moves
			}
			want, ok := smallest(b, res.Moves, "")
			if !ok || res.Path != want {
				t.Fatalf("%s: path %q, smallest shortest path %q", boardString(b), res.Path, want)
			}
			checked++
		}
	}
	if checked < 40 {
		t.Fatalf("only %d boards checked", checked)
	}
	t.Logf("%d boards checked", checked)
}

// TestDistanceDistribution3x3 checks the whole 3×3 table against the
// published distribution (testdata/8puzzle_distance_distribution.tsv,
// OEIS A089473): 181,440 states, maximum 31, exact counts per distance.
func TestDistanceDistribution3x3(t *testing.T) {
	f, err := os.Open("testdata/8puzzle_distance_distribution.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[int]int{}
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	sum := 0
	for sc.Scan() {
		d, n, ok := strings.Cut(sc.Text(), "\t")
		if !ok {
			t.Fatalf("bad line %q", sc.Text())
		}
		di, err1 := strconv.Atoi(d)
		ni, err2 := strconv.Atoi(n)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad line %q", sc.Text())
		}
		want[di] = ni
		sum += ni
	}
	if sum != 181440 || len(want) != 32 {
		t.Fatalf("reference file: %d states, %d distances", sum, len(want))
	}
	tb := tableFor(3, 3)
	if len(tb.dist) != 181440 {
		t.Fatalf("table has %d entries, want 181440", len(tb.dist))
	}
	got := map[int]int{}
	for _, d := range tb.dist {
		got[int(d)]++ // an unseen entry (255) shows up as a wrong key
	}
	for d := range 256 {
		if got[d] != want[d] {
			t.Errorf("distance %d: %d states, want %d", d, got[d], want[d])
		}
	}
}

// TestCommittedBoards checks Solve on the benchmark boards against the
// moves the reference BFS recorded in testdata/boards_3x3.tsv.
func TestCommittedBoards(t *testing.T) {
	boards, moves := loadBoards(t)
	for i, b := range boards {
		checkAgainst(t, b, moves[i])
	}
}

// loadBoards reads testdata/boards_3x3.tsv: 100 solvable 3×3 boards and
// their moves as computed by referenceBFS.
func loadBoards(tb testing.TB) ([][][]int, []int) {
	tb.Helper()
	data, err := os.ReadFile("testdata/boards_3x3.tsv")
	if err != nil {
		tb.Fatal(err)
	}
	var boards [][][]int
	var moves []int
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if strings.HasPrefix(line, "#") || strings.HasPrefix(line, "tiles") {
			continue
		}
		tiles, m, _ := strings.Cut(line, "\t")
		p, err := ParseBOJ1525(strings.NewReader(strings.Join(strings.Fields(tiles)[0:3], " ") + "\n" +
			strings.Join(strings.Fields(tiles)[3:6], " ") + "\n" + strings.Join(strings.Fields(tiles)[6:9], " ")))
		if err != nil {
			tb.Fatalf("%q: %v", line, err)
		}
		mi, err := strconv.Atoi(m)
		if err != nil {
			tb.Fatalf("%q: %v", line, err)
		}
		boards = append(boards, p.Board)
		moves = append(moves, mi)
	}
	if len(boards) != 100 {
		tb.Fatalf("%d boards, want 100", len(boards))
	}
	return boards, moves
}

// TestTableOtherShapes builds the tables of the 8-cell shapes (2×4, 4×2),
// which Solve also answers by table, checks that every entry is reached,
// and checks a few boards against the reference.
func TestTableOtherShapes(t *testing.T) {
	for _, s := range [][2]int{{2, 4}, {4, 2}} {
		rows, cols := s[0], s[1]
		tb := buildTable(rows, cols)
		if len(tb.dist) != 20160 {
			t.Fatalf("%dx%d: %d entries", rows, cols, len(tb.dist))
		}
		for _, d := range tb.dist {
			if d == unseen {
				t.Fatalf("%dx%d: unreached entry", rows, cols)
			}
		}
		rng := newRand(uint64(rows))
		for range 10 {
			b := randomBoard(rng, rows, cols)
			want := referenceBFS(b)
			p, blank := pack(b)
			if solvable(p, blank, rows, cols) != (want >= 0) {
				t.Fatalf("%s: parity rule disagrees with reference %d", boardString(b), want)
			}
			if got := tb.dist[tb.index(toSeq(p, blank), blank)]; want >= 0 && int(got) != want {
				t.Fatalf("%s: table %d, reference %d", boardString(b), got, want)
			}
		}
	}
}

func TestTableSize(t *testing.T) {
	for _, s := range [][2]int{{2, 2}, {2, 3}, {3, 2}, {3, 3}} {
		tb := tableFor(s[0], s[1])
		t.Logf("%dx%d: %d bytes", s[0], s[1], len(tb.dist))
	}
	if n := len(tableFor(3, 3).dist); n >= 1<<20 {
		t.Fatalf("3x3 table is %d bytes, want under 1 MB", n)
	}
}

func TestSolveCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := Solve(ctx, Puzzle{Board: [][]int{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}}}, Options{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// Validation comes first: a bad board reports the board, not ctx.
	_, err = Solve(ctx, Puzzle{}, Options{})
	var ie *solvers.InputError
	if !errors.As(err, &ie) {
		t.Fatalf("err = %v, want *solvers.InputError", err)
	}
}

// TestSolveConcurrent has many goroutines hit cold and warm tables at once;
// under -race it checks the lazy build.
func TestSolveConcurrent(t *testing.T) {
	boards, moves := loadBoards(t)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := g; i < len(boards); i += 8 {
				res, err := Solve(context.Background(), Puzzle{Board: boards[i]}, Options{})
				if err != nil || res.Moves != moves[i] {
					t.Errorf("board %d: %+v, %v; want %d", i, res, err, moves[i])
				}
			}
		})
	}
	wg.Wait()
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		board [][]int
		code  string
		field string
		msg   string
	}{
		{"nil board", nil, solvers.CodeInvalidPuzzle, "board", "board is empty"},
		{"empty first row", [][]int{{}, {1, 2}}, solvers.CodeInvalidPuzzle, "board[0]", "row 1 is empty"},
		{"short row", [][]int{{1, 2, 3}, {4, 5, 6}, {7, 0}}, solvers.CodeInvalidPuzzle, "board[2]", "row 3: expected 3 numbers, got 2"},
		{"long row", [][]int{{1, 2}, {3, 0, 4}}, solvers.CodeInvalidPuzzle, "board[1]", "row 2: expected 2 numbers, got 3"},
		{"one row", [][]int{{1, 2, 0}}, solvers.CodeInvalidPuzzle, "board", "board is 1x3, each side must be at least 2"},
		{"one column", [][]int{{1}, {0}}, solvers.CodeInvalidPuzzle, "board", "board is 2x1, each side must be at least 2"},
		{"4x5", [][]int{{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, {11, 12, 13, 14, 15}, {16, 17, 18, 19, 0}}, solvers.CodeTooLarge, "board", "board is 4x5 (20 cells), the limit is 16 cells (4x4, 3x5, 2x8)"},
		{"3x6", [][]int{{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}, {13, 14, 15, 16, 17, 0}}, solvers.CodeTooLarge, "board", "board is 3x6 (18 cells), the limit is 16 cells (4x4, 3x5, 2x8)"},
		{"2x9", [][]int{{1, 2, 3, 4, 5, 6, 7, 8, 9}, {10, 11, 12, 13, 14, 15, 16, 17, 0}}, solvers.CodeTooLarge, "board", "board is 2x9 (18 cells), the limit is 16 cells (4x4, 3x5, 2x8)"},
		{"5x5", [][]int{{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, {11, 12, 13, 14, 15}, {16, 17, 18, 19, 20}, {21, 22, 23, 24, 0}}, solvers.CodeTooLarge, "board", "board is 5x5 (25 cells), the limit is 16 cells (4x4, 3x5, 2x8)"},
		{"out of range", [][]int{{1, 2, 3}, {4, 5, 6}, {7, 9, 0}}, solvers.CodeInvalidPuzzle, "board[2][1]", "row 3, column 2: tile 9 is out of range 0..8"},
		{"negative", [][]int{{1, 2}, {-3, 0}}, solvers.CodeInvalidPuzzle, "board[1][0]", "row 2, column 1: tile -3 is out of range 0..3"},
		{"huge", [][]int{{1, 2}, {1 << 62, 0}}, solvers.CodeInvalidPuzzle, "board[1][0]", "row 2, column 1: tile 4611686018427387904 is out of range 0..3"},
		{"duplicate", [][]int{{1, 2, 3}, {4, 5, 6}, {7, 5, 0}}, solvers.CodeInvalidPuzzle, "board[2][1]", "row 3, column 2: tile 5 appears twice (tile 8 is missing)"},
		{"no blank", [][]int{{1, 2}, {3, 3}}, solvers.CodeInvalidPuzzle, "board[1][1]", "row 2, column 2: tile 3 appears twice (tile 0 is missing)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(Puzzle{Board: tc.board})
			var ie *solvers.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("err = %v, want *solvers.InputError", err)
			}
			if ie.Code != tc.code || ie.Field != tc.field || ie.Msg != tc.msg || ie.Line != 0 {
				t.Fatalf("got %+v, want code %q field %q msg %q", *ie, tc.code, tc.field, tc.msg)
			}
			if _, err := Solve(t.Context(), Puzzle{Board: tc.board}, Options{}); !errors.As(err, &ie) {
				t.Fatalf("Solve err = %v, want *solvers.InputError", err)
			}
		})
	}
	for _, ok := range [][][]int{
		{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}},
		{{3, 6, 0}, {8, 1, 2}, {7, 4, 5}}, // unsolvable but valid
		{{0, 1}, {2, 3}},
		{{0, 1, 2}, {3, 4, 5}},
		{{0, 1}, {2, 3}, {4, 5}},
		{{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}, {13, 14, 15, 0}},
		{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}, {13, 14, 0}},
		{{1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 11, 12, 13, 14, 15, 0}},
	} {
		if err := Validate(Puzzle{Board: ok}); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
}
