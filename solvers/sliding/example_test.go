package sliding_test

import (
	"context"
	"fmt"
	"os"
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
