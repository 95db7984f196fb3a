package puzzle_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/puzzle"
)

// benchBatchBody is a POST /v1/batches body of n items, a third of each
// kind, in the shapes the load tests send: 3×3 sliding boards, 5×5 sweep
// boards and 6×6 fill puzzles.
func benchBatchBody(n int) []byte {
	slides := []string{"[[1,0,3],[4,2,5],[7,8,6]]", "[[8,1,3],[4,0,2],[7,6,5]]", "[[0,1,2],[3,4,5],[6,7,8]]"}
	var b strings.Builder
	b.WriteString(`{"tasks":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		switch i % 3 {
		case 0:
			fmt.Fprintf(&b, `{"kind":"sliding","puzzle":{"board":%s}}`, slides[i/3%len(slides)])
		case 1:
			fmt.Fprintf(&b, `{"kind":"sweep","puzzle":{"board":["**...",".....","....*","..*..","....."]},"options":{"max_nodes":%d}}`, 1000+i)
		default:
			b.WriteString(`{"kind":"fill","puzzle":{"game_board":[[1,1,0,0,1,0],[0,0,1,0,1,0],[0,1,1,0,0,1],[1,1,0,1,1,1],[1,0,0,0,1,0],[0,1,1,1,0,0]],` +
				`"table":[[1,0,0,1,1,0],[1,0,1,0,1,0],[0,1,1,0,1,1],[0,0,1,0,0,0],[1,1,0,1,1,0],[0,1,0,0,0,0]]},"options":{"allow_flip":false}}`)
		}
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// BenchmarkDecodeBatch10k decodes and validates a 10,000-item batch body
// as POST /v1/batches does, envelope and items. cpu-ns/op is the process
// CPU time per op (garbage collection included), which a loaded machine
// inflates less than ns/op. See docs/performance.md.
func BenchmarkDecodeBatch10k(b *testing.B) {
	body := benchBatchBody(10000)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	cpu0 := int64(testgen.ProcessCPU())
	for b.Loop() {
		reqs, err := puzzle.DecodeBatch(body, 10000)
		if err != nil || len(reqs) != 10000 {
			b.Fatalf("%d requests, %v", len(reqs), err)
		}
	}
	b.ReportMetric(float64(int64(testgen.ProcessCPU())-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkDecodeTask decodes and validates a POST /v1/tasks body: a
// 15-puzzle with a node budget.
func BenchmarkDecodeTask(b *testing.B) {
	body := []byte(`{"kind":"sliding","puzzle":{"board":[[15,14,8,12],[10,11,9,13],[2,6,5,1],[3,7,4,0]]},"options":{"max_nodes":5000000}}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	cpu0 := int64(testgen.ProcessCPU())
	for b.Loop() {
		if _, err := puzzle.Decode(body); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(int64(testgen.ProcessCPU())-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkDecodePayload8 decodes an 8-puzzle's canonical payload, as the
// worker does for every batch item: the fast path's case.
func BenchmarkDecodePayload8(b *testing.B) {
	data := []byte(`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{}}`)
	b.ReportAllocs()
	for range b.N {
		if _, err := puzzle.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}
