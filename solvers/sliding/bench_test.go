package sliding

import (
	"context"
	"fmt"
	"testing"

	"github.com/puzzleq/puzzleq/internal/testgen"
)

// BenchmarkQuery compares one query by the table (Solve, through the
// public API, validation included) with one by the textbook per-query BFS,
// on the 100 committed solvable 3×3 boards of testdata/boards_3x3.tsv.
// One op answers all 100 boards, so both sides see the same mix however
// few iterations the slow side gets; ns/board is ns/op divided by 100. The
// table is built before the timer starts: its cost is BenchmarkTableBuild.
// cpu-ns/board is process CPU time per board (it includes the garbage
// collector's work, which the reference's map and strings cause).
func BenchmarkQuery(b *testing.B) {
	boards, moves := loadBoards(b)
	ctx := context.Background()
	b.Run("table", func(b *testing.B) {
		tableFor(3, 3)
		b.ReportAllocs()
		cpu0 := int64(testgen.ProcessCPU())
		for b.Loop() {
			for i, board := range boards {
				res, err := Solve(ctx, Puzzle{Board: board}, Options{})
				if err != nil || res.Moves != moves[i] {
					b.Fatalf("board %d: %+v, %v", i, res, err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(boards)), "ns/board")
		b.ReportMetric(float64(int64(testgen.ProcessCPU())-cpu0)/float64(b.N*len(boards)), "cpu-ns/board")
	})
	b.Run("reference", func(b *testing.B) {
		b.ReportAllocs()
		cpu0 := int64(testgen.ProcessCPU())
		for b.Loop() {
			for i, board := range boards {
				if got := referenceBFS(board); got != moves[i] {
					b.Fatalf("board %d: %d, want %d", i, got, moves[i])
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(boards)), "ns/board")
		b.ReportMetric(float64(int64(testgen.ProcessCPU())-cpu0)/float64(b.N*len(boards)), "cpu-ns/board")
	})
}

// BenchmarkQueryUnsolvable measures an unsolvable 3×3 board, answered by
// the parity rule alone (the reference would exhaust 181,440 states).
func BenchmarkQueryUnsolvable(b *testing.B) {
	p := Puzzle{Board: [][]int{{3, 6, 0}, {8, 1, 2}, {7, 4, 5}}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if res, err := Solve(ctx, p, Options{}); err != nil || res.Moves != -1 {
			b.Fatal(res, err)
		}
	}
}

// BenchmarkTableBuild builds each shape's table from scratch (bypassing
// the per-process cache). B/op is everything the build allocates (table
// plus BFS queue); table-B is the size of the table that is kept;
// cpu-ns/op is the process CPU time per build, steadier than ns/op when
// the machine is shared.
func BenchmarkTableBuild(b *testing.B) {
	for _, s := range [][2]int{{2, 2}, {2, 3}, {3, 2}, {3, 3}} {
		b.Run(fmt.Sprintf("%dx%d", s[0], s[1]), func(b *testing.B) {
			b.ReportAllocs()
			var t *table
			cpu0 := int64(testgen.ProcessCPU())
			for b.Loop() {
				t = buildTable(s[0], s[1])
			}
			b.ReportMetric(float64(int64(testgen.ProcessCPU())-cpu0)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(len(t.dist)), "table-B")
			b.ReportMetric(float64(len(t.dist)), "states")
		})
	}
}
