package sliding

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/solvers"
)

// BenchmarkRandomShapes solves random solvable boards (uniform over the
// reachable arrangements: random walks of 1,000 moves) of each searched
// shape other than 4×4, with a budget of 300 M nodes per board. It
// reports the mean nodes and CPU time per board and how many boards ran
// out of budget.
func BenchmarkRandomShapes(b *testing.B) {
	for _, s := range [][2]int{{2, 5}, {2, 6}, {3, 4}, {2, 7}, {3, 5}, {2, 8}} {
		b.Run(fmt.Sprintf("%dx%d", s[0], s[1]), func(b *testing.B) {
			if _, err := heuristicFor(context.Background(), s[0], s[1]); err != nil {
				b.Fatal(err)
			}
			const boards = 5
			var nodes, cpu int64
			over, moves := 0, 0
			for b.Loop() {
				nodes, cpu, over, moves = 0, 0, 0, 0
				rng := newRand(uint64(s[0]*100 + s[1]))
				for range boards {
					board := randomWalk(rng, s[0], s[1], 1000)
					p, z := pack(board)
					c0 := int64(testgen.ProcessCPU())
					path, n, err := solveSearch(context.Background(), p, z, s[0], s[1], Options{MaxNodes: 300_000_000})
					cpu += int64(testgen.ProcessCPU()) - c0
					nodes += n
					if errors.Is(err, solvers.ErrBudgetExceeded) {
						over++
						continue
					}
					if err != nil {
						b.Fatal(err)
					}
					moves += len(path)
				}
			}
			b.ReportMetric(float64(nodes)/boards, "nodes/board")
			b.ReportMetric(float64(cpu)/1e6/boards, "cpu-ms/board")
			b.ReportMetric(float64(moves)/float64(max(boards-over, 1)), "moves/board")
			b.ReportMetric(float64(over), "over-budget")
		})
	}
}
