package fill_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/puzzleq/puzzleq/solvers/fill"
)

func ExampleSolve() {
	p := fill.Puzzle{
		GameBoard: [][]int{
			{1, 1, 0},
			{1, 1, 0},
			{0, 0, 0},
		},
		Table: [][]int{
			{1, 1, 1},
			{0, 0, 1},
			{0, 0, 1},
		},
	}
	res, err := fill.Solve(context.Background(), p, fill.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("filled:", res.Filled)
	for _, pl := range res.Placements {
		fmt.Println("rotation:", pl.Rotation)
		for i := range pl.Piece {
			fmt.Println(pl.Piece[i], "->", pl.Hole[i])
		}
	}
	// Output:
	// filled: 5
	// rotation: 90
	// [0 0] -> [0 2]
	// [0 1] -> [1 2]
	// [0 2] -> [2 2]
	// [1 2] -> [2 1]
	// [2 2] -> [2 0]
}

func ExampleParseP84021() {
	in := `{"game_board": [[0,0,0],[1,1,0],[1,1,1]], "table": [[1,1,1],[1,0,0],[0,0,0]]}`
	p, err := fill.ParseP84021(strings.NewReader(in))
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := fill.Solve(context.Background(), p, fill.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	// The L fits only when mirrored, which the original problem forbids.
	_ = fill.FormatP84021(os.Stdout, res)
	res, _ = fill.Solve(context.Background(), p, fill.Options{AllowFlip: true})
	_ = fill.FormatP84021(os.Stdout, res)

	_, err = fill.ParseP84021(strings.NewReader(`{"game_board": [[0,2]], "table": [[1,1]]}`))
	fmt.Println(err)
	// Output:
	// 0
	// 4
	// game_board row 1, column 2: value 2 is not 0 or 1
}
