//go:build unix

package tasks_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// BenchmarkUnitWorker measures what a worker spends on cheap items, the
// bulk of a large batch (issue 11): a batch of 8-puzzles is staged and
// committed in 64-item chunks as the API does, and every unit runs
// through the real Handler.ProcessTask on the real store, feeding the
// queue after each unit as cmd/worker does. asynq's dequeue is stood in
// for by popping the pending list. It reports the worker's CPU per item
// (process CPU time while units run: this process is the worker) and
// Redis's per item (INFO commandstats usec, every command, scripts' inner
// commands included), since wall time on a shared machine measures the
// neighbours.
func BenchmarkUnitWorker(b *testing.B) {
	const (
		items  = 4096
		stride = 64
		depth  = 32 // FEED_DEPTH's default
	)
	f := newUnitFixture(b)
	client := asynq.NewClientFromRedisClient(f.rdb)
	b.Cleanup(func() { client.Close() })
	h := tasks.NewHandler(f.store, nil, testLimits(), tasks.NewMetrics(prometheus.NewRegistry()), nil)
	h.SetFeed(f.store, client, depth)
	rng := rand.New(rand.NewPCG(1, 2))
	reqs := make([][]byte, items)
	for i := range reqs {
		t := rng.Perm(9)
		reqs[i] = fmt.Appendf(nil, `{"kind":"sliding","puzzle":{"board":[[%d,%d,%d],[%d,%d,%d],[%d,%d,%d]]}}`,
			t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8])
	}
	pending := tasks.PendingListKey(tasks.QueueBulk)
	var cpu, redisUsec int64
	b.ResetTimer()
	for n := range b.N {
		b.StopTimer()
		id := fmt.Sprintf("%032x", n)
		w := f.store.NewBatchWriter(id, stride)
		for _, r := range reqs {
			p, err := puzzle.Decode(r)
			if err != nil {
				b.Fatal(err)
			}
			if err := w.Add(f.ctx, store.StagedItem{Kind: p.Kind(), Request: p.Payload(), Own: !p.Cheap(), Timeout: time.Minute}); err != nil {
				b.Fatal(err)
			}
		}
		if err := w.Close(f.ctx); err != nil {
			b.Fatal(err)
		}
		if err := f.store.CommitBatch(f.ctx, w, store.CommitBatch{ID: id}); err != nil {
			b.Fatal(err)
		}
		// The API's feed after its commit.
		if _, err := tasks.FeedQueue(f.ctx, f.store, client, tasks.QueueBulk, depth, depth); err != nil {
			b.Fatal(err)
		}
		usec0 := redisCommandUsec(b, f)
		cpu0 := processCPU()
		b.StartTimer()
		units := 0
		for ; ; units++ {
			tid, err := f.rdb.RPop(f.ctx, pending).Result()
			if err != nil {
				break // the queue ran dry: every unit ran, or the feed failed (checked below)
			}
			bid, unit, _ := strings.Cut(tid, ":")
			t, err := tasks.NewUnitTask(tasks.UnitRef{BatchID: bid, Unit: unit, Timeout: time.Minute}, tasks.QueueBulk)
			if err != nil {
				b.Fatal(err)
			}
			if err := h.ProcessTask(context.Background(), t); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		cpu += processCPU() - cpu0
		redisUsec += redisCommandUsec(b, f) - usec0
		bt, err := f.store.GetBatch(f.ctx, id)
		if err != nil || !bt.Done() || units != items/stride {
			b.Fatalf("batch %s after %d units: %+v %v", id, units, bt, err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu)/float64(b.N*items), "cpu-ns/item")
	b.ReportMetric(float64(redisUsec)/float64(b.N*items), "redis-usec/item")
}

// redisCommandUsec sums the usec of every command in f's Redis INFO
// commandstats.
func redisCommandUsec(b *testing.B, f *unitFixture) int64 {
	b.Helper()
	info, err := f.rdb.Info(f.ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(strings.TrimSpace(line), ",usec=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		var u int64
		fmt.Sscan(v, &u)
		total += u
	}
	return total
}

// processCPU returns the CPU time (user + system) the process has used, in
// nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkExpensiveItems measures what the gate costs a batch's
// expensive items (issue 12): a batch of 64 distinct 15-puzzles a few
// moves from the goal (each its own unit, solved in microseconds, so the
// queue's and the store's work is what is measured) runs through
// Handler.ProcessTask on the real store, ungated (every item solves as
// it comes: main before issue 12's batch gate) and gated (peek, admit,
// finish through the solve's leases). Their cache entries are deleted
// between runs, so every item solves. It reports the worker's CPU, Redis's
// CPU and Redis commands (scripts' inner commands included) per item.
func BenchmarkExpensiveItems(b *testing.B) {
	const items = 64
	rng := rand.New(rand.NewPCG(3, 4))
	seen := map[string]bool{}
	var reqs []string
	var cacheKeys []string
	for len(reqs) < items {
		r := board15Walk(rng, 4+rng.IntN(8))
		p, err := puzzle.Decode([]byte(r))
		if err != nil {
			b.Fatal(err)
		}
		if seen[r] || p.Cheap() {
			continue
		}
		seen[r] = true
		reqs = append(reqs, r)
		cacheKeys = append(cacheKeys, "pq:cache:"+p.Key())
	}
	for _, gated := range []bool{false, true} {
		name := "ungated"
		if gated {
			name = "gated"
		}
		b.Run(name, func(b *testing.B) {
			f := newUnitFixture(b)
			client := asynq.NewClientFromRedisClient(f.rdb)
			b.Cleanup(func() { client.Close() })
			h := tasks.NewHandler(f.store, nil, testLimits(), tasks.NewMetrics(prometheus.NewRegistry()), nil)
			h.SetFeed(f.store, client, 2*items)
			if gated {
				h.SetGate(f.store, func() int { return 4 })
			}
			pending := tasks.PendingListKey(tasks.QueueBulk)
			var cpu, redisUsec, calls int64
			b.ResetTimer()
			for n := range b.N {
				b.StopTimer()
				id := fmt.Sprintf("%032x", n)
				w := f.store.NewBatchWriter(id, 64)
				for _, r := range reqs {
					p, err := puzzle.Decode([]byte(r))
					if err != nil {
						b.Fatal(err)
					}
					if err := w.Add(f.ctx, store.StagedItem{Kind: p.Kind(), Request: p.Payload(), Own: !p.Cheap(), Timeout: time.Minute}); err != nil {
						b.Fatal(err)
					}
				}
				if err := f.store.CommitBatch(f.ctx, w, store.CommitBatch{ID: id, Owner: "k"}); err != nil {
					b.Fatal(err)
				}
				if _, err := tasks.FeedQueue(f.ctx, f.store, client, tasks.QueueBulk, 2*items, 2*items); err != nil {
					b.Fatal(err)
				}
				usec0, calls0 := redisCommandStats(b, f)
				cpu0 := processCPU()
				b.StartTimer()
				units := 0
				for ; ; units++ {
					tid, err := f.rdb.RPop(f.ctx, pending).Result()
					if err != nil {
						break
					}
					bid, unit, _ := strings.Cut(tid, ":")
					t, err := tasks.NewUnitTask(tasks.UnitRef{BatchID: bid, Unit: unit, Timeout: time.Minute}, tasks.QueueBulk)
					if err != nil {
						b.Fatal(err)
					}
					if err := h.ProcessTask(context.Background(), t); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				cpu += processCPU() - cpu0
				usec1, calls1 := redisCommandStats(b, f)
				redisUsec += usec1 - usec0
				calls += calls1 - calls0
				bt, err := f.store.GetBatch(f.ctx, id)
				if err != nil || !bt.Done() || units != items || bt.Counts["completed"] != items {
					b.Fatalf("batch %s after %d units: %+v %v", id, units, bt, err)
				}
				if err := f.rdb.Del(f.ctx, cacheKeys...).Err(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(cpu)/float64(b.N*items), "cpu-ns/item")
			b.ReportMetric(float64(redisUsec)/float64(b.N*items), "redis-usec/item")
			b.ReportMetric(float64(calls)/float64(b.N*items), "redis-cmds/item")
		})
	}
}

// redisCommandStats sums the usec and calls of every command in f's
// Redis INFO commandstats (the INFO call itself included, once).
func redisCommandStats(b *testing.B, f *unitFixture) (usec, calls int64) {
	b.Helper()
	info, err := f.rdb.Info(f.ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		c, rest, _ := strings.Cut(rest, ",usec=")
		u, _, _ := strings.Cut(rest, ",")
		var cv, uv int64
		fmt.Sscan(c, &cv)
		fmt.Sscan(u, &uv)
		calls += cv
		usec += uv
	}
	return usec, calls
}

// board15Walk returns a 15-puzzle whose blank took n random steps from
// the goal.
func board15Walk(rng *rand.Rand, n int) string {
	var b [4][4]int
	for i := range 16 {
		b[i/4][i%4] = (i + 1) % 16
	}
	r, c := 3, 3
	for range n {
		d := [][2]int{{0, 1}, {0, -1}, {1, 0}, {-1, 0}}[rng.IntN(4)]
		nr, nc := r+d[0], c+d[1]
		if nr < 0 || nr > 3 || nc < 0 || nc > 3 {
			continue
		}
		b[r][c], b[nr][nc] = b[nr][nc], 0
		r, c = nr, nc
	}
	return fmt.Sprintf(`{"kind":"sliding","puzzle":{"board":%s}}`, strings.ReplaceAll(fmt.Sprint(b), " ", ","))
}
