package sliding_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/puzzleq/puzzleq/solvers/sliding"
)

func ExampleSolve() {
	p := sliding.Puzzle{Board: [][]int{
		{1, 0, 3},
		{4, 2, 5},
		{7, 8, 6},
	}}
	res, err := sliding.Solve(context.Background(), p, sliding.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Moves, res.Solvable, res.Path)

	// Swapping two tiles makes the goal unreachable; the parity rule says
	// so without a search.
	p.Board[2][0], p.Board[2][1] = 8, 7
	res, _ = sliding.Solve(context.Background(), p, sliding.Options{})
	fmt.Println(res.Moves, res.Solvable, res.Path == "")
	// Output:
	// 3 true DRD
	// -1 false true
}

func ExampleParseBOJ1525() {
	in := "3 6 0\n8 1 2\n7 4 5\n"
	p, err := sliding.ParseBOJ1525(strings.NewReader(in))
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := sliding.Solve(context.Background(), p, sliding.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := sliding.FormatBOJ1525(os.Stdout, res); err != nil {
		fmt.Println(err)
	}
	// Output:
	// -1
}

func ExampleParseBOJ1525_error() {
	_, err := sliding.ParseBOJ1525(strings.NewReader("1 0 3\n4 2 5\n7 8\n"))
	fmt.Println(err)
	// Output:
	// line 3: row 3: expected 3 numbers, got 2
}

func ExampleFormatBOJ1525() {
	p, _ := sliding.ParseBOJ1525(strings.NewReader("1 0 3\n4 2 5\n7 8 6\n"))
	res, _ := sliding.Solve(context.Background(), p, sliding.Options{})
	_ = sliding.FormatBOJ1525(os.Stdout, res)
	// Output:
	// 3
}

// A 3×4 board is solved by IDA* with pattern databases; the Progress
// callback sees each new bound of the search.
func ExampleSolve_search() {
	p := sliding.Puzzle{Board: [][]int{
		{1, 2, 3, 4},
		{5, 6, 0, 8},
		{9, 10, 7, 11},
	}}
	bounds := 0
	res, err := sliding.Solve(context.Background(), p, sliding.Options{
		MaxNodes: 1_000_000,
		Progress: func(bound int, nodes int64) { bounds++ },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Moves, res.Path, bounds > 0)
	// Output:
	// 2 DR true
}

// A worker loads (or builds and saves) every pattern database once at
// start, so that no request pays for a build.
func ExamplePreload() {
	dir := filepath.Join(os.TempDir(), "puzzleq-sliding-pdb")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Println(err)
		return
	}
	if err := sliding.Preload(context.Background(), dir); err != nil {
		fmt.Println("pattern databases:", err) // still usable in memory
	}
	fmt.Printf("%.1f MiB of pattern databases\n", float64(sliding.PDBMemory())/(1<<20))
}
