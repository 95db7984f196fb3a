package fill

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/testgen"
)

var (
	benchMu     sync.Mutex
	benchInputs = map[int]Puzzle{}
)

// benchPuzzle builds an n×n instance from a seeded RNG: both grids are
// tiled with polyominoes (1 to 6 cells) drawn from a pool of 30 random
// shapes and turned at random, so there are many pieces and holes of many
// shapes and most pieces have a congruent hole. Inputs are cached so that
// -count=5 does not rebuild them.
func benchPuzzle(n int) Puzzle {
	benchMu.Lock()
	defer benchMu.Unlock()
	if p, ok := benchInputs[n]; ok {
		return p
	}
	rng := rand.New(rand.NewPCG(uint64(n), 84021))
	var pool [][][2]int
	for range 30 {
		pool = append(pool, randomShape(rng, 1+rng.IntN(6)))
	}
	p := Puzzle{
		GameBoard: placeShapes(rng, n, n, pool, 0.6, false, 0),
		Table:     placeShapes(rng, n, n, pool, 0.6, false, 1),
	}
	benchInputs[n] = p
	return p
}

// measure runs f in b.Loop and reports, besides ns/op, the thread CPU
// time per op (cpu-ns/op) and per cell. The goroutine is locked to its
// thread so that the thread's CPU clock covers exactly the loop.
func measure(b *testing.B, cells int, f func()) {
	b.ReportAllocs()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c0 := testgen.ThreadCPU()
	for b.Loop() {
		f()
	}
	cpu := float64(testgen.ThreadCPU() - c0)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*cells), "ns/cell")
	b.ReportMetric(cpu/float64(b.N), "cpu-ns/op")
	b.ReportMetric(cpu/float64(b.N*cells), "cpu-ns/cell")
}

func BenchmarkSolve(b *testing.B) {
	ctx := context.Background()
	p := benchPuzzle(50)
	solve := func(p Puzzle) func() {
		return func() {
			if _, err := Solve(ctx, p, Options{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("ours/50x50", func(b *testing.B) { measure(b, 50*50, solve(p)) })
	b.Run("reference/50x50", func(b *testing.B) {
		measure(b, 50*50, func() { referenceSolve(p.GameBoard, p.Table, false) })
	})
	for _, n := range []int{100, 250, 500, 1000} {
		p := benchPuzzle(n)
		b.Run(fmt.Sprintf("ours/%d", n), func(b *testing.B) { measure(b, n*n, solve(p)) })
	}
}

// TestBenchInputs keeps the benchmark inputs honest: ours and the
// reference agree on them, and they have plenty of pieces and holes.
func TestBenchInputs(t *testing.T) {
	p := benchPuzzle(50)
	res, err := Solve(context.Background(), p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := referenceSolve(p.GameBoard, p.Table, false); res.Filled != want {
		t.Fatalf("Filled %d, reference %d", res.Filled, want)
	}
	if err := checkResult(p, Options{}, res); err != nil {
		t.Fatal(err)
	}
	holes, pieces := len(refFindBlock(p.GameBoard, 0)), len(refFindBlock(p.Table, 1))
	t.Logf("50x50: %d holes, %d pieces, %d placements, %d cells filled", holes, pieces, len(res.Placements), res.Filled)
	if len(res.Placements) < 100 {
		t.Errorf("only %d placements", len(res.Placements))
	}
}

// BenchmarkSpeedup interleaves the two solvers on the 50×50 input, 100
// runs of ours per run of the reference (about equal time each), so that
// both see the same load on a shared machine, and reports how many times
// faster ours is in wall time (x-wall) and thread CPU time (x-cpu). One
// op is one reference run plus 100 of ours.
func BenchmarkSpeedup(b *testing.B) {
	ctx := context.Background()
	p := benchPuzzle(50)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var oursWall, refWall, oursCPU, refCPU time.Duration
	const k = 100
	for b.Loop() {
		w0, c0 := time.Now(), testgen.ThreadCPU()
		for range k {
			if _, err := Solve(ctx, p, Options{}); err != nil {
				b.Fatal(err)
			}
		}
		w1, c1 := time.Now(), testgen.ThreadCPU()
		referenceSolve(p.GameBoard, p.Table, false)
		w2, c2 := time.Now(), testgen.ThreadCPU()
		oursWall += w1.Sub(w0)
		oursCPU += c1 - c0
		refWall += w2.Sub(w1)
		refCPU += c2 - c1
	}
	b.ReportMetric(float64(refWall)*k/float64(oursWall), "x-wall")
	if oursCPU > 0 {
		b.ReportMetric(float64(refCPU)*k/float64(oursCPU), "x-cpu")
	}
	b.ReportMetric(float64(oursCPU)/float64(b.N*k), "ours-cpu-ns/op")
	b.ReportMetric(float64(refCPU)/float64(b.N), "ref-cpu-ns/op")
}
