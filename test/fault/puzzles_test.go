//go:build fault

package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/app"
	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers/sweep"
)

// workerLimits are the limits of a worker started with no settings of
// its own: the local search gets their node budget, not the solver's
// smaller default, so that a board a worker solves never fails here.
var workerLimits = app.DefaultLimits()

// solveLocal is the exact result JSON the API must serve for req.
func solveLocal(t *testing.T, req string) []byte {
	p, err := puzzle.Decode([]byte(req))
	if err != nil {
		t.Fatalf("decode %.100s: %v", req, err)
	}
	res, err := p.WithMaxNodes(workerLimits.MaxNodes[p.Kind()]).Solve(context.Background())
	if err != nil {
		t.Fatalf("solve %.100s locally: %v", req, err)
	}
	return compact(res)
}

// eightPuzzles returns n distinct solvable 3x3 sliding requests, drawn
// with seed.
func eightPuzzles(n int, seed int64) []string { return testgen.EightPuzzles(n, seed) }

// slowSweeps returns the 8 rotations and reflections of
// internal/app/testdata/slow_sweep.txt, the slowest of 3,000 random open
// 30x30 boards when it was chosen (0.5 s then; 30-70 ms for today's
// solver, the heaviest boards we have). The cache key is the board as
// given, so the 8 are 8 distinct tasks of the same difficulty.
func slowSweeps(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../internal/app/testdata/slow_sweep.txt")
	if err != nil {
		t.Fatal(err)
	}
	rows := strings.Fields(string(b))
	var out []string
	seen := map[string]bool{}
	g := rows
	for range 2 {
		for range 4 {
			g = rotate(g)
			r := sweepRequest(g)
			if !seen[r] {
				seen[r] = true
				out = append(out, r)
			}
		}
		g = mirror(g)
	}
	return out
}

// judgeSweeps reads sweep boards in judge format (Baekjoon 9944) as
// requests, dropping repeats.
func judgeSweeps(t *testing.T, files ...string) []string {
	t.Helper()
	var out []string
	seen := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pzs, err := sweep.ParseBOJ9944(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, pz := range pzs {
			if r := sweepRequest(pz.Board); !seen[r] {
				seen[r] = true
				out = append(out, r)
			}
		}
	}
	return out
}

// corpusSweeps returns the sweep judge corpus boards (1-50 ms each) as
// requests, sorted for a stable order.
func corpusSweeps(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob("../../solvers/sweep/testdata/corpus/*.txt")
	sort.Strings(files)
	return judgeSweeps(t, files...)
}

func sweepRequest(rows []string) string {
	b, _ := json.Marshal(rows)
	return `{"kind":"sweep","puzzle":{"board":` + string(b) + `}}`
}

// rotate turns a grid a quarter clockwise.
func rotate(g []string) []string {
	h, w := len(g), len(g[0])
	out := make([]string, w)
	for c := 0; c < w; c++ {
		var sb strings.Builder
		for r := h - 1; r >= 0; r-- {
			sb.WriteByte(g[r][c])
		}
		out[c] = sb.String()
	}
	return out
}

// mirror flips a grid left to right.
func mirror(g []string) []string {
	out := make([]string, len(g))
	for i, row := range g {
		b := []byte(row)
		for l, r := 0, len(b)-1; l < r; l, r = l+1, r-1 {
			b[l], b[r] = b[r], b[l]
		}
		out[i] = string(b)
	}
	return out
}
