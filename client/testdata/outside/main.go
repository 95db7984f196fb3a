// Command outside is a module of its own that solves a puzzle with the
// puzzleq client, as a Go program outside this repository does: it
// builds the request from solvers/sliding's types and reads the answer as
// sliding.Result. It prints the moves and the path, and exits 1 on error.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/solvers/sliding"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: outside API_URL")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := client.New(os.Args[1])
	t, err := c.Solve(ctx, client.Sliding(sliding.Puzzle{Board: [][]int{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}}}, sliding.Options{}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	res, err := client.ResultOf[sliding.Result](t)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(res.Moves, res.Path)
}
