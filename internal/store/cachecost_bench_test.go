package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/puzzle"
)

// BenchmarkCacheCost8Puzzle decides whether batch 8-puzzles are worth
// caching (docs/batches.md, "Stored once"): it sets what a solve costs
// against what a cache lookup for the same item costs, per item, for a
// chunk of 64 items as a worker would handle them. The cache would be
// worth it only if a lookup cost less than the solve it saves; Redis's
// own CPU counts, since Redis is the one shared process.
//
//	go test -run '^$' -bench CacheCost8Puzzle -benchtime 2000x ./internal/store/
func BenchmarkCacheCost8Puzzle(b *testing.B) {
	const chunk = 64
	rng := rand.New(rand.NewPCG(1, 2))
	var ps []*puzzle.Parsed
	for len(ps) < 4096 {
		perm := rng.Perm(9)
		board := fmt.Sprintf(`{"kind":"sliding","puzzle":{"board":[[%d,%d,%d],[%d,%d,%d],[%d,%d,%d]]}}`,
			perm[0], perm[1], perm[2], perm[3], perm[4], perm[5], perm[6], perm[7], perm[8])
		p, err := puzzle.Decode([]byte(board))
		if err != nil {
			b.Fatal(err)
		}
		ps = append(ps, p)
	}
	ctx := context.Background()
	if _, err := ps[0].Solve(ctx); err != nil { // builds the table once, outside the timing
		b.Fatal(err)
	}

	b.Run("solve", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			for k := range chunk {
				if _, err := ps[(i*chunk+k)%len(ps)].Solve(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunk), "ns/item")
	})

	srv, err := redistest.Launch()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Stop)
	rdb := srv.Client(b)
	prefix := fmt.Sprintf("bench:%d:", time.Now().UnixNano())
	keys := make([]string, len(ps))
	results := make([]json.RawMessage, len(ps))
	for i, p := range ps {
		keys[i] = prefix + "cache:" + p.Key()
		r, err := p.Solve(ctx)
		if err != nil {
			b.Fatal(err)
		}
		results[i] = r
	}
	chunkKeys := func(i int) []string {
		out := make([]string, chunk)
		for k := range chunk {
			out[k] = keys[(i*chunk+k)%len(keys)]
		}
		return out
	}
	b.Run("hit_mget", func(b *testing.B) {
		pipe := rdb.Pipeline()
		for i, k := range keys {
			pipe.Set(ctx, k, []byte(results[i]), time.Hour)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		cpu0 := redisCPU(b, rdb)
		for i := 0; b.Loop(); i++ {
			if _, err := rdb.MGet(ctx, chunkKeys(i)...).Result(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunk), "ns/item")
		b.ReportMetric((redisCPU(b, rdb)-cpu0)*1e6/float64(b.N*chunk), "redis-µs/item")
	})
	b.Run("miss_mget_set", func(b *testing.B) {
		cpu0 := redisCPU(b, rdb)
		for i := 0; b.Loop(); i++ {
			ks := chunkKeys(i)
			if err := rdb.Del(ctx, ks...).Err(); err != nil {
				b.Fatal(err)
			}
			if _, err := rdb.MGet(ctx, ks...).Result(); err != nil {
				b.Fatal(err)
			}
			pipe := rdb.Pipeline()
			for k, key := range ks {
				pipe.Set(ctx, key, []byte(results[(i*chunk+k)%len(results)]), time.Hour)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunk), "ns/item")
		b.ReportMetric((redisCPU(b, rdb)-cpu0)*1e6/float64(b.N*chunk), "redis-µs/item")
	})
}

// redisCPU is redis-server's CPU time so far, in seconds (INFO cpu).
func redisCPU(b *testing.B, rdb *redis.Client) float64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += f
		}
	}
	return total
}
