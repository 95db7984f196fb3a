package sweep_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/puzzleq/puzzleq/solvers/sweep"
)

func ExampleSolve() {
	p := sweep.Puzzle{Board: []string{
		"..",
		"*.",
		"*.",
	}}
	r, err := sweep.Solve(context.Background(), p, sweep.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Moves, r.Start, r.Path)
	// Output: 2 [0 0] RD
}

func ExampleParseBOJ9944() {
	in := "5 5\n**...\n.....\n....*\n..*..\n.....\n3 4\n****\n*...\n*..*\n"
	puzzles, err := sweep.ParseBOJ9944(strings.NewReader(in))
	if err != nil {
		fmt.Println(err)
		return
	}
	var results []sweep.Result
	for _, p := range puzzles {
		r, err := sweep.Solve(context.Background(), p, sweep.Options{})
		if err != nil {
			fmt.Println(err)
			return
		}
		results = append(results, r)
	}
	if err := sweep.FormatBOJ9944(os.Stdout, results); err != nil {
		fmt.Println(err)
	}
	// Output:
	// Case 1: 10
	// Case 2: 3
}

func ExampleParseBOJ9944_error() {
	_, err := sweep.ParseBOJ9944(strings.NewReader("2 5\n.....\n....\n"))
	fmt.Println(err)
	// Output: line 3: expected 5 characters, got 4
}
