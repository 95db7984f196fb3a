package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/redistest"
)

// BenchmarkPipelineFloorScripts is the pipeline floor's submit and
// finish scripts one task after another on a real Redis, with what Redis
// spent running each (redis-us/op): the least a single task's two
// scripts cost Redis, beside what the service's own two cost
// (BenchmarkSingleTaskScripts in internal/store, run the same way).
//
//	go test -run '^$' -bench PipelineFloorScripts -benchtime 5000x ./cmd/loadgen/
func BenchmarkPipelineFloorScripts(b *testing.B) {
	srv, err := redistest.Launch()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Stop)
	rdb := srv.Client(b)
	ctx := context.Background()
	msg := make([]byte, 160) // about asynq's message for an 8-puzzle
	n := 0
	b.Run("submit", func(b *testing.B) {
		before := redistest.ScriptUsec(b, rdb)
		for b.Loop() {
			id := fmt.Sprintf("%032x", n)
			n++
			now := time.Now()
			if err := pipeSubmitScript.Run(ctx, rdb,
				[]string{"pipe:task:" + id, "asynq:{" + pipeQueue + "}:t:" + id, "asynq:{" + pipeQueue + "}:pending", "asynq:queues"},
				now.UnixMilli(), pipeBody, msg, now.UnixNano(), id, pipeQueue).Err(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric((redistest.ScriptUsec(b, rdb)-before)/float64(b.N), "redis-us/op")
	})
	b.Run("finish", func(b *testing.B) {
		before := redistest.ScriptUsec(b, rdb)
		i := 0
		for b.Loop() {
			id := fmt.Sprintf("%032x", i)
			i++
			if err := pipeFinishScript.Run(ctx, rdb, []string{"pipe:task:" + id, "pipe:cache:" + id},
				time.Now().UnixMilli(), pipeResult, pipeChannel, id).Err(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric((redistest.ScriptUsec(b, rdb)-before)/float64(b.N), "redis-us/op")
	})
}
