package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// BenchmarkSingleTaskScripts is a single task's two scripts, submit and
// finish, as the API and a worker call them, one task after another on a
// real Redis. Besides the client's time it reports what Redis spent
// running each (INFO commandstats, usec per EVALSHA): Redis is the one
// shared process, and these two are the service's own share of a single
// task's Redis time (issue 12; asynq's dequeue and done are the rest).
// BenchmarkPipelineFloorScripts in cmd/loadgen measures the pipeline
// floor's two scripts, which do only what the hops need, the same way.
//
//	go test -run '^$' -bench SingleTaskScripts -benchtime 5000x ./internal/store/
func BenchmarkSingleTaskScripts(b *testing.B) {
	srv, err := redistest.Launch()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Stop)
	rdb := srv.Client(b)
	ctx := context.Background()
	s := store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	if err := s.LoadScripts(ctx); err != nil {
		b.Fatal(err)
	}
	p, err := puzzle.Decode([]byte(`{"kind":"sliding","puzzle":{"board":[[8,6,7],[2,5,4],[3,0,1]]}}`))
	if err != nil {
		b.Fatal(err)
	}
	result, err := p.Solve(ctx)
	if err != nil {
		b.Fatal(err)
	}
	limits := tasks.Limits{Deadline: map[puzzle.Kind]time.Duration{p.Kind(): time.Minute}}
	// Distinct cache keys, as distinct puzzles have: a finish writes a
	// new entry, and a submit misses.
	key := func(i int) string { return fmt.Sprintf("%s-%d", p.Key(), i) }
	submit := func(i int) string {
		id := fmt.Sprintf("%032x", i)
		q, err := asynqdata.Solve(id, "", p, tasks.QueueInteractive, limits, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: id, Kind: string(p.Kind()), CacheKey: key(i), Enqueue: q}, 0); err != nil {
			b.Fatal(err)
		}
		return id
	}
	finish := func(i int, id string) {
		st, err := s.Finish(ctx, []worker.Transition{{ID: id, State: apitype.TaskStateCompleted, Result: result, Unstarted: true}}, []string{key(i)})
		if err != nil || st[0] != apitype.TaskStatePending {
			b.Fatalf("finish %s: %v %v", id, st, err)
		}
	}
	var n int
	b.Run("submit", func(b *testing.B) {
		before := redistest.ScriptUsec(b, rdb)
		for b.Loop() {
			submit(n)
			n++
		}
		b.ReportMetric((redistest.ScriptUsec(b, rdb)-before)/float64(b.N), "redis-us/op")
	})
	ids := make([]string, 0, n)
	for i := range n {
		ids = append(ids, fmt.Sprintf("%032x", i))
	}
	b.Run("finish", func(b *testing.B) {
		if b.N > len(ids) {
			b.Skipf("run submit first with at least as many iterations (%d < %d)", len(ids), b.N)
		}
		before := redistest.ScriptUsec(b, rdb)
		i := 0
		for b.Loop() {
			finish(i, ids[i])
			i++
		}
		b.ReportMetric((redistest.ScriptUsec(b, rdb)-before)/float64(b.N), "redis-us/op")
	})
}
