package sliding

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/puzzleq/puzzleq/internal/testgen"
)

// Flags of the 4×4 benchmarks (go test -bench Korf -args -sliding.table).
var (
	korfTable = flag.Bool("sliding.table", false,
		"BenchmarkKorf100: print a per-instance table (id, optimal, nodes, CPU time)")
	hard80 = flag.Bool("sliding.hard80", false,
		"BenchmarkHardest80: run it (about 1.1 G nodes, about 85 s of CPU)")
)

// solveInstance runs IDA* on a 4×4 board with heuristic h and checks the
// length. It returns the nodes searched.
func solveInstance(tb testing.TB, h *heuristic, board [][]int, want int) int64 {
	p, z := pack(board)
	path, nodes, err := idaStar(context.Background(), h, p, z, Options{MaxNodes: 1 << 40})
	if err != nil {
		tb.Fatal(err)
	}
	if want >= 0 && len(path) != want {
		tb.Fatalf("%s: %d moves, want %d", boardString(board), len(path), want)
	}
	end, err := replay(board, path)
	if err != nil || !isGoal(end) {
		tb.Fatalf("%s: path %q does not reach the goal (%v)", boardString(board), path, err)
	}
	return nodes
}

// BenchmarkKorf100 solves Korf's 100 random instances optimally, one after
// the other, with the 6-6-3 databases and the reflected lookup (built
// before the timer starts). Run it on one core:
//
//	GOMAXPROCS=1 go test -run '^$' -bench Korf100 -benchtime 1x ./solvers/sliding/ -args -sliding.table
//
// nodes/op is the total of IDA* nodes (every generated node, the roots
// included, all iterations) and cpu-s/op the process CPU time of the 100
// solves; with -sliding.table it prints id, optimal length, nodes and CPU
// time per instance.
func BenchmarkKorf100(b *testing.B) {
	all := loadKorf(b)
	h, err := heuristicFor(context.Background(), 4, 4)
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	var cpu int64
	type row struct {
		id, opt int
		nodes   int64
		cpu     time.Duration
	}
	var rows []row
	for b.Loop() {
		total, rows = 0, rows[:0]
		c0 := int64(testgen.ProcessCPU())
		for _, in := range all {
			c1 := int64(testgen.ProcessCPU())
			n := solveInstance(b, h, in.board, in.optimal)
			total += n
			rows = append(rows, row{in.id, in.optimal, n, time.Duration(int64(testgen.ProcessCPU()) - c1)})
		}
		cpu = int64(testgen.ProcessCPU()) - c0
	}
	b.ReportMetric(float64(total), "nodes/op")
	b.ReportMetric(float64(cpu)/1e9, "cpu-s/op")
	b.ReportMetric(float64(total)/(float64(cpu)/1e9)/1e6, "Mnodes/cpu-s")
	if *korfTable {
		var sb strings.Builder
		tw := tabwriter.NewWriter(&sb, 0, 0, 1, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "id\toptimal\tnodes\tcpu ms\t")
		for _, r := range rows {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%.1f\t\n", r.id, r.opt, r.nodes, float64(r.cpu)/1e6)
		}
		tw.Flush()
		fmt.Fprint(os.Stdout, sb.String())
	}
}

// BenchmarkManhattanVsPDB solves the 10 easiest Korf instances (by the
// Manhattan node counts of the check file) with IDA* and the Manhattan
// distance (15 single-tile databases, searched by idaStarManhattan), and
// with the 6-6-3 databases plus reflection. It reports the nodes and CPU
// time of each and the ratios Manhattan/PDB.
func BenchmarkManhattanVsPDB(b *testing.B) {
	easy := easiestKorf(loadKorf(b), 10)
	pd, err := heuristicFor(context.Background(), 4, 4)
	if err != nil {
		b.Fatal(err)
	}
	md := manhattanHeuristic(4, 4)
	var mdNodes, pdNodes, mdCPU, pdCPU int64
	for b.Loop() {
		mdNodes, pdNodes = 0, 0
		c0 := int64(testgen.ProcessCPU())
		for _, in := range easy {
			mdNodes += solveInstance(b, md, in.board, in.optimal)
		}
		c1 := int64(testgen.ProcessCPU())
		for _, in := range easy {
			pdNodes += solveInstance(b, pd, in.board, in.optimal)
		}
		c2 := int64(testgen.ProcessCPU())
		mdCPU, pdCPU = c1-c0, c2-c1
	}
	var want int64
	for _, in := range easy {
		want += in.mdNodes
	}
	b.ReportMetric(float64(mdNodes), "md-nodes")
	b.ReportMetric(float64(want), "md-nodes-checkfile")
	b.ReportMetric(float64(pdNodes), "pdb-nodes")
	b.ReportMetric(float64(mdCPU)/1e6, "md-cpu-ms")
	b.ReportMetric(float64(pdCPU)/1e6, "pdb-cpu-ms")
	b.ReportMetric(float64(mdNodes)/float64(pdNodes), "node-ratio")
	b.ReportMetric(float64(mdCPU)/float64(max(pdCPU, 1)), "cpu-ratio")
}

// BenchmarkHardest80 solves an 80-move board, one of the 17 hardest
// 15-puzzle positions: "0 12 9 13 / 15 11 10 14 / 3 7 2 5 / 4 8 6 1" taken
// as it stands in our goal (see TestKorf80 for why not converted). It
// runs only with -sliding.hard80: about 1.1 G nodes.
func BenchmarkHardest80(b *testing.B) {
	if !*hard80 {
		b.Skip("run with -args -sliding.hard80 (about 85 s of CPU)")
	}
	h, err := heuristicFor(context.Background(), 4, 4)
	if err != nil {
		b.Fatal(err)
	}
	var nodes, cpu int64
	for b.Loop() {
		c0 := int64(testgen.ProcessCPU())
		nodes = solveInstance(b, h, hardest80(), 80)
		cpu = int64(testgen.ProcessCPU()) - c0
	}
	b.ReportMetric(float64(nodes), "nodes/op")
	b.ReportMetric(float64(cpu)/1e9, "cpu-s/op")
}

// BenchmarkPDBBuild builds the databases of each searched shape from
// scratch (bypassing the cache); cpu-s/op is the process CPU time and
// table-B the bytes kept.
func BenchmarkPDBBuild(b *testing.B) {
	for _, s := range searchShapes {
		b.Run(fmt.Sprintf("%dx%d", s.rows, s.cols), func(b *testing.B) {
			var size int64
			cpu0 := int64(testgen.ProcessCPU())
			for b.Loop() {
				size = 0
				for _, g := range s.groups {
					p, err := buildPDB(context.Background(), s.rows, s.cols, g)
					if err != nil {
						b.Fatal(err)
					}
					size += int64(len(p.data))
				}
			}
			b.ReportMetric(float64(int64(testgen.ProcessCPU())-cpu0)/1e9/float64(b.N), "cpu-s/op")
			b.ReportMetric(float64(size), "table-B")
		})
	}
}

// BenchmarkPDBLoad reads the 4×4 databases back from files (written once
// before the timer starts), SHA-256 check included: what Preload costs a
// worker that finds its cache directory filled.
func BenchmarkPDBLoad(b *testing.B) {
	h, err := heuristicFor(context.Background(), 4, 4)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	for _, p := range h.groups {
		if err := writePDB(dir, p); err != nil {
			b.Fatal(err)
		}
	}
	cpu0 := int64(testgen.ProcessCPU())
	for b.Loop() {
		for _, p := range h.groups {
			if _, ok := readPDB(dir, 4, 4, p.tiles); !ok {
				b.Fatal("file does not verify")
			}
		}
	}
	b.ReportMetric(float64(int64(testgen.ProcessCPU())-cpu0)/1e6/float64(b.N), "cpu-ms/op")
}

// BenchmarkKorf100NoReflect is BenchmarkKorf100 without the reflected
// lookup (the same three databases, the normal sum only), to measure what
// the reflection saves.
func BenchmarkKorf100NoReflect(b *testing.B) {
	all := loadKorf(b)
	h, err := heuristicFor(context.Background(), 4, 4)
	if err != nil {
		b.Fatal(err)
	}
	plain := newHeuristic(4, 4, h.groups, false)
	var total, cpu int64
	for b.Loop() {
		total = 0
		c0 := int64(testgen.ProcessCPU())
		for _, in := range all {
			total += solveInstance(b, plain, in.board, in.optimal)
		}
		cpu = int64(testgen.ProcessCPU()) - c0
	}
	b.ReportMetric(float64(total), "nodes/op")
	b.ReportMetric(float64(cpu)/1e9, "cpu-s/op")
}

// BenchmarkTableSets solves Korf's 100 with each 4×4 table set, 6-6-3
// then 7-8 (mapped from $PUZZLEQ_PDB78_DIR, skipped without it), so that
// -count N alternates the two in one run:
//
//	PUZZLEQ_PDB78_DIR=DIR GOMAXPROCS=1 go test -run '^$' -bench TableSets -benchtime 1x -count 5 ./solvers/sliding/
//
// nodes/op and cpu-s/op are per 100 instances. With -sliding.hard80 the
// 80-move board is solved too, once per set.
func BenchmarkTableSets(b *testing.B) {
	all := loadKorf(b)
	h663, err := heuristicFor(context.Background(), 4, 4)
	if err != nil {
		b.Fatal(err)
	}
	sets := []struct {
		name string
		h    func(b *testing.B) *heuristic
	}{
		{"663", func(*testing.B) *heuristic { return h663 }},
		{"78", func(b *testing.B) *heuristic { return use78(b) }},
	}
	for _, s := range sets {
		b.Run("korf100/"+s.name, func(b *testing.B) {
			h := s.h(b)
			var total, cpu int64
			for b.Loop() {
				total = 0
				c0 := testgen.ProcessCPU()
				for _, in := range all {
					total += solveInstance(b, h, in.board, in.optimal)
				}
				cpu = int64(testgen.ProcessCPU() - c0)
			}
			b.ReportMetric(float64(total), "nodes/op")
			b.ReportMetric(float64(cpu)/1e9, "cpu-s/op")
			b.ReportMetric(float64(total)/(float64(cpu)/1e9)/1e6, "Mnodes/cpu-s")
		})
	}
	if !*hard80 {
		return
	}
	for _, s := range sets {
		b.Run("hard80/"+s.name, func(b *testing.B) {
			h := s.h(b)
			var nodes, cpu int64
			for b.Loop() {
				c0 := testgen.ProcessCPU()
				nodes = solveInstance(b, h, hardest80(), 80)
				cpu = int64(testgen.ProcessCPU() - c0)
			}
			b.ReportMetric(float64(nodes), "nodes/op")
			b.ReportMetric(float64(cpu)/1e9, "cpu-s/op")
			b.ReportMetric(float64(nodes)/(float64(cpu)/1e9)/1e6, "Mnodes/cpu-s")
		})
	}
}

// BenchmarkManhattanEasiest solves the 10 and the 40 easiest of Korf's
// instances (by the Manhattan node counts of the check file) with IDA*
// and the Manhattan distance, as the searches of other programs that use
// it are measured (docs/performance-solvers.md):
//
//	GOMAXPROCS=1 taskset -c 1 sliding.test -test.run '^$' -test.bench ManhattanEasiest -test.benchtime 1x -test.count 5
//
// "md" is the specialised search idaStar runs for the Manhattan
// heuristic, "general" the pattern-database search over the same 15
// single-tile databases. With -sliding.table it prints id, nodes and CPU
// time per instance for each.
func BenchmarkManhattanEasiest(b *testing.B) {
	all := loadKorf(b)
	md := manhattanHeuristic(4, 4)
	for _, k := range []int{10, 40} {
		easy := easiestKorf(all, k)
		for _, v := range []struct {
			name string
			h    *heuristic
		}{{"md", md}, {"general", generalManhattan(md)}} {
			b.Run(fmt.Sprintf("%d/%s", k, v.name), func(b *testing.B) {
				var nodes, cpu int64
				var sb strings.Builder
				for b.Loop() {
					nodes = 0
					sb.Reset()
					c0 := int64(testgen.ProcessCPU())
					for _, in := range easy {
						c1 := int64(testgen.ProcessCPU())
						n := solveInstance(b, v.h, in.board, in.optimal)
						nodes += n
						fmt.Fprintf(&sb, "%d\t%d\t%.2f\n", in.id, n, float64(int64(testgen.ProcessCPU())-c1)/1e6)
					}
					cpu = int64(testgen.ProcessCPU()) - c0
				}
				b.ReportMetric(float64(nodes), "nodes/op")
				b.ReportMetric(float64(cpu)/1e9, "cpu-s/op")
				b.ReportMetric(float64(nodes)/(float64(cpu)/1e9)/1e6, "Mnodes/cpu-s")
				if *korfTable {
					fmt.Fprintf(os.Stdout, "id\tnodes\tcpu ms\n%s", sb.String())
				}
			})
		}
	}
}
