package puzzle_test

import (
	"context"
	"fmt"

	"github.com/puzzleq/puzzleq/puzzle"
)

func ExampleDecode() {
	p, err := puzzle.Decode([]byte(`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`))
	if err != nil {
		panic(err)
	}
	res, err := p.Solve(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println(p.Kind(), string(res))

	_, err = puzzle.Decode([]byte(`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2],[7,8,6]]}}`))
	fmt.Println(err)
	// Output:
	// sliding {"moves":3,"solvable":true,"path":"DRD"}
	// row 2: expected 3 numbers, got 2
}
