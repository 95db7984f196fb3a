package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// BenchmarkParking measures what GET /v1/status and each scrape of
// puzzleq_waiting cost to count the runs waiting for a solver slot
// (Store.Parking), with n runs of one key parked in the retry set, as a
// batch of n hard boards leaves them:
//
//	go test ./internal/store/ -run '^$' -bench Parking -count 3
func BenchmarkParking(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			rdb := redistest.Start(b).Client(b)
			s := store.New(rdb, store.Options{Prefix: "bp:", TaskTTL: time.Hour, ResultTTL: time.Hour})
			ctx := context.Background()
			const queue = "bulk"
			run := func(i int) worker.SlotRun {
				id := fmt.Sprint("t", i)
				return worker.SlotRun{Slot: "item-" + id, Owner: "k1", Solve: "s-" + id, CacheKey: "c-" + id, Queue: queue, AsynqID: id}
			}
			if a, err := s.AdmitSlot(ctx, run(0), 1); err != nil || a.Verdict != worker.VerdictRun {
				b.Fatalf("first run: %+v, %v", a, err)
			}
			p := rdb.Pipeline()
			for i := 1; i <= n; i++ {
				if a, err := s.AdmitSlot(ctx, run(i), 1); err != nil || a.Verdict != worker.VerdictWait {
					b.Fatalf("run %d: %+v, %v", i, a, err)
				}
				p.ZAdd(ctx, asynqdata.RetryKey(queue), redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: fmt.Sprint("t", i)})
			}
			if _, err := p.Exec(ctx); err != nil {
				b.Fatal(err)
			}
			cpu0 := redisCPU(b, rdb)
			for b.Loop() {
				got, err := s.Parking(ctx, queue)
				if err != nil || got.ByQueue[queue] != n {
					b.Fatalf("parking %+v, %v; want %d", got.ByQueue, err, n)
				}
			}
			b.ReportMetric((redisCPU(b, rdb)-cpu0)*1e6/float64(b.N), "redis-µs/op")
		})
	}
}
