package sweep

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/testgen"
)

var (
	benchSet = flag.String("sweep.set", "hard30", "BenchmarkSet: the corpus set to solve")
	benchRef = flag.Bool("sweep.ref", false, "BenchmarkSet: also run the reference, board by board between runs of ours")
)

// loadSet reads one corpus set and its answers. It reads the files
// directly so that this benchmark can be copied into an older build and
// compared with the current one on the same boards.
func loadSet(b *testing.B, set string) (boards [][]string, want []int) {
	in, err := os.ReadFile(filepath.Join(corpusDir, set+".txt"))
	if err != nil {
		b.Fatal(err)
	}
	ans, err := os.ReadFile(filepath.Join(corpusDir, set+".ans"))
	if err != nil {
		b.Fatal(err)
	}
	ps, err := ParseBOJ9944(bytes.NewReader(in))
	if err != nil {
		b.Fatal(err)
	}
	for i, line := range strings.Split(strings.TrimSpace(string(ans)), "\n") {
		var k, w int
		if _, err := fmt.Sscanf(line, "Case %d: %d", &k, &w); err != nil || k != i+1 {
			b.Fatalf("%s.ans line %d: %q", set, i+1, line)
		}
		want = append(want, w)
	}
	for _, p := range ps {
		boards = append(boards, p.Board)
	}
	if len(boards) != len(want) {
		b.Fatalf("%s: %d boards, %d answers", set, len(boards), len(want))
	}
	return boards, want
}

// BenchmarkSet solves every board of one corpus set (-sweep.set) per op
// and reports thread CPU per op, nodes and nodes per CPU-second. With
// -sweep.ref it also runs the plain reference once per board per op,
// right after ours on the same board, and reports the ratio of the two
// CPU times (x-cpu) and the reference's CPU. Run with GOMAXPROCS=1 and
// -benchtime 1x when the reference is on: it takes minutes.
func BenchmarkSet(b *testing.B) {
	boards, want := loadSet(b, *benchSet)
	b.ReportAllocs()
	ctx := context.Background()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ours, ref time.Duration
	var nodes int64
	boardOurs := make([]time.Duration, len(boards))
	boardRef := make([]time.Duration, len(boards))
	boardNodes := make([]int64, len(boards))
	for i := 0; i < b.N; i++ {
		nodes = 0
		for j, bd := range boards {
			c0 := testgen.ThreadCPU()
			r, n, err := solveCount(ctx, Puzzle{Board: bd}, Options{}, tuning{})
			el := testgen.ThreadCPU() - c0
			ours += el
			boardOurs[j] += el
			boardNodes[j] = n
			nodes += n
			if err != nil || r.Moves != want[j] {
				b.Fatalf("board %d: got %d (%v), want %d", j+1, r.Moves, err, want[j])
			}
			if *benchRef {
				c0 := testgen.ThreadCPU()
				if got, _ := refSolve(bd, 0); got != want[j] {
					b.Fatalf("board %d: reference %d, corpus %d", j+1, got, want[j])
				}
				el := testgen.ThreadCPU() - c0
				ref += el
				boardRef[j] += el
			}
		}
	}
	for j := range boards {
		line := fmt.Sprintf("board %2d: %7d nodes, ours %8.3f cpu-ms", j+1, boardNodes[j], float64(boardOurs[j].Microseconds())/1000/float64(b.N))
		if *benchRef {
			line += fmt.Sprintf(", reference %8.0f cpu-ms, x%.0f", float64(boardRef[j].Milliseconds())/float64(b.N), float64(boardRef[j])/float64(boardOurs[j]))
		}
		b.Log(line)
	}
	b.ReportMetric(float64(ours.Microseconds())/1000/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(nodes), "nodes/op")
	if ours > 0 {
		b.ReportMetric(float64(nodes)*float64(b.N)/ours.Seconds(), "nodes/cpu-s")
	}
	if *benchRef {
		b.ReportMetric(float64(ref.Milliseconds())/float64(b.N), "ref-cpu-ms/op")
		if ours > 0 {
			b.ReportMetric(float64(ref)/float64(ours), "x-cpu")
		}
	}
}
