//go:build unix

package worker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// BenchmarkUnitWorker measures what a worker spends on cheap items, the
// bulk of a large batch (issue 11): a batch of 8-puzzles is staged and
// committed in chunks of 64 and of 512 items (CHUNK_SIZE's default) as
// the API does, and every unit runs
// through the real Handler.ProcessTask on the real store, feeding the
// queue after each unit as cmd/worker does. asynq's dequeue is stood in
// for by popping the pending list. It reports the worker's CPU per item
// (process CPU time while units run: this process is the worker) and
// redis-server's per item (its own user and system CPU, from INFO cpu),
// since wall time on a shared machine measures the neighbours.
func BenchmarkUnitWorker(b *testing.B) {
	for _, stride := range []int{64, 512} {
		b.Run(fmt.Sprintf("chunk=%d", stride), func(b *testing.B) { benchUnitWorker(b, stride) })
	}
}

func benchUnitWorker(b *testing.B, stride int) {
	const (
		items = 4096
		depth = 32 // FEED_DEPTH's default
	)
	f := newUnitFixture(b)
	client := asynq.NewClientFromRedisClient(f.rdb)
	b.Cleanup(func() { client.Close() })
	h := worker.NewHandler(f.store, nil, testLimits(), worker.NewMetrics(prometheus.NewRegistry()), nil)
	h.SetFeed(f.store, depth)
	rng := rand.New(rand.NewPCG(1, 2))
	reqs := make([][]byte, items)
	for i := range reqs {
		t := rng.Perm(9)
		reqs[i] = fmt.Appendf(nil, `{"kind":"sliding","puzzle":{"board":[[%d,%d,%d],[%d,%d,%d],[%d,%d,%d]]}}`,
			t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8])
	}
	pending := asynqdata.PendingKey(tasks.QueueBulk)
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
		if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, depth, depth); err != nil {
			b.Fatal(err)
		}
		usec0 := redisCPU(b, f)
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
		redisUsec += redisCPU(b, f) - usec0
		bt, err := f.store.GetBatch(f.ctx, id)
		if err != nil || !bt.Done() || units != items/stride {
			b.Fatalf("batch %s after %d units: %+v %v", id, units, bt, err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu)/float64(b.N*items), "cpu-ns/item")
	b.ReportMetric(float64(redisUsec)/float64(b.N*items), "redis-cpu-ns/item")
}

// redisCPU returns the CPU time (user + system) f's redis-server has
// used, in nanoseconds, from INFO cpu (getrusage, microseconds).
func redisCPU(b *testing.B, f *unitFixture) int64 {
	b.Helper()
	info, err := f.rdb.Info(f.ctx, "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_user" && k != "used_cpu_sys") {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %v", k, err)
		}
		total += x
	}
	return int64(total * 1e9)
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
