package sweep

import (
	"context"
	"math/rand"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/testgen"
)

// ablations switch off one technique at a time; "ours" has them all.
var ablations = []struct {
	name string
	t    tuning
}{
	{"ours", tuning{}},
	{"no-connectivity", tuning{noConnectivity: true}},
	{"no-deadends", tuning{noDeadEnds: true}},
	{"no-bound", tuning{noBound: true}},
	{"no-symmetry", tuning{noSymmetry: true}},
	{"no-ordering", tuning{noOrdering: true}},
	{"always-flood", tuning{alwaysFlood: true}},
	{"no-parity", tuning{noParity: true}},
	{"no-blocks", tuning{noBlocks: true}},
}

// ablationBudget keeps an ablation from running for hours: a board over
// it counts as failed and the benchmark reports how many did.
const ablationBudget = 20_000_000

// BenchmarkCorpus solves the whole committed corpus once per iteration,
// with our search, with each technique switched off, and with the plain
// reference, so that ratios come from one run on the same machine.
// Run with -benchtime=1x: the reference takes minutes.
func BenchmarkCorpus(b *testing.B) {
	boards := loadCorpus(b)
	for _, a := range ablations {
		b.Run(a.name, func(b *testing.B) {
			var nodes int64
			over := 0
			var slowest time.Duration
			slowName := ""
			cpu0 := testgen.ProcessCPU()
			for i := 0; i < b.N; i++ {
				nodes, over, slowest = 0, 0, 0
				for _, cb := range boards {
					t0 := time.Now()
					r, n, err := solveCount(context.Background(), Puzzle{Board: cb.board}, Options{MaxNodes: ablationBudget}, a.t)
					el := time.Since(t0)
					nodes += n
					if err != nil {
						over++
						continue
					}
					if r.Moves != cb.want {
						b.Fatalf("%s: got %d, want %d", cb.name(), r.Moves, cb.want)
					}
					if el > slowest {
						slowest, slowName = el, cb.name()
					}
				}
			}
			b.ReportMetric(float64((testgen.ProcessCPU()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
			b.ReportMetric(float64(nodes), "nodes/op")
			b.ReportMetric(float64(over), "over-budget")
			b.ReportMetric(float64(slowest.Microseconds())/1000, "slowest-ms")
			b.Logf("slowest board %s: %v", slowName, slowest)
		})
	}
	b.Run("reference", func(b *testing.B) {
		var slowest time.Duration
		slowName := ""
		cpu0 := testgen.ProcessCPU()
		for i := 0; i < b.N; i++ {
			for _, cb := range boards {
				t0 := time.Now()
				if got, _ := refSolve(cb.board, 0); got != cb.want {
					b.Fatalf("%s: reference %d, corpus %d", cb.name(), got, cb.want)
				}
				if el := time.Since(t0); el > slowest {
					slowest, slowName = el, cb.name()
				}
			}
		}
		b.ReportMetric(float64((testgen.ProcessCPU()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		b.ReportMetric(float64(slowest.Microseconds())/1000, "slowest-ms")
		b.Logf("slowest board %s: %v", slowName, slowest)
	})
}

// BenchmarkLarge runs the ablations on 30x30 boards the reference cannot
// finish (so answers are checked against the full search instead): half
// "hard" boards without dead ends, half boards built from a random game.
func BenchmarkLarge(b *testing.B) {
	rng := rand.New(rand.NewSource(30))
	var boards [][]string
	for k := 0; k < 20; k++ {
		if k%2 == 0 {
			boards = append(boards, hardBoard(rng, 30, 30, 0.02+0.1*rng.Float64()))
		} else {
			boards = append(boards, builtBoard(rng, randomBoard(rng, 30, 30, 0.03*rng.Float64())))
		}
	}
	want := make([]int, len(boards))
	for i, bd := range boards {
		r, err := Solve(context.Background(), Puzzle{Board: bd}, Options{})
		if err != nil {
			b.Fatal(err)
		}
		want[i] = r.Moves
	}
	for _, a := range ablations {
		b.Run(a.name, func(b *testing.B) {
			var nodes int64
			over := 0
			for i := 0; i < b.N; i++ {
				nodes, over = 0, 0
				for j, bd := range boards {
					r, n, err := solveCount(context.Background(), Puzzle{Board: bd}, Options{MaxNodes: ablationBudget}, a.t)
					nodes += n
					if err != nil {
						over++
						continue
					}
					if r.Moves != want[j] {
						b.Fatalf("board %d: got %d, want %d", j, r.Moves, want[j])
					}
				}
			}
			b.ReportMetric(float64(nodes), "nodes/op")
			b.ReportMetric(float64(over), "over-budget")
		})
	}
}
