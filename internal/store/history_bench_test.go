package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
)

// BenchmarkHistoryRead measures a day's read of the history (GET
// /v1/history?minutes=1440), for one key and for all, with keys API keys
// that each ended work in every minute of the day, as their workers'
// flushes leave it:
//
//	go test ./internal/store/ -run '^$' -bench HistoryRead -count 3
func BenchmarkHistoryRead(b *testing.B) {
	for _, keys := range []int{10, 1000} {
		rdb := redistest.Start(b).Client(b)
		s := store.New(rdb, store.Options{Prefix: "bh:", TaskTTL: time.Hour, ResultTTL: time.Hour})
		ctx := context.Background()
		last := time.Now().Unix() / 60
		first := last - store.HistoryMaxMinutes + 1
		lat := make([]int64, len(store.LatencyBounds)+1)
		lat[3], lat[5] = 7, 1
		for m := first; m <= last; m++ {
			ds := make([]store.HistoryDelta, keys)
			for k := range ds {
				ds[k] = store.HistoryDelta{Minute: m, Owner: fmt.Sprint("key-", k), Completed: 100, Failed: 1, Latency: lat}
			}
			if err := s.AddHistory(ctx, fmt.Sprint("fill-", m), ds); err != nil {
				b.Fatal(err)
			}
		}
		for _, all := range []bool{false, true} {
			b.Run(fmt.Sprintf("keys=%d/all=%v", keys, all), func(b *testing.B) {
				cpu0 := redisCPU(b, rdb)
				for b.Loop() {
					h, err := s.History(ctx, "key-7", all, first, last)
					if err != nil || len(h) != store.HistoryMaxMinutes || h[0].Completed == 0 {
						b.Fatalf("read %d minutes, first %+v, %v", len(h), h[0], err)
					}
				}
				b.ReportMetric((redisCPU(b, rdb)-cpu0)*1e6/float64(b.N), "redis-µs/op")
			})
		}
	}
}
