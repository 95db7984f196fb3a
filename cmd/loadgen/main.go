// Command loadgen measures puzzleq end to end: it drives the HTTP API with
// distinct 8-puzzles and reports submit rate, completion rate and latency
// percentiles (submit to result) per scenario.
//
// Unless -server is given, loadgen starts its own stack in this one
// process: a redis-server child on a free loopback port, the API
// (app.NewAPI with REDIS_URL) and -workers in-process workers
// (app.NewWorker). All traffic goes to 127.0.0.1.
//
// Scenarios (-scenario, comma-separated, default all):
//
//	single      one task at a time on an idle system (target p50 < 25ms)
//	throughput  -clients closed-loop clients for -duration or -tasks tasks
//	raw-asynq   the same load of no-op tasks on bare asynq (the ceiling);
//	            throughput is reported as a percentage of it (floor
//	            35%, aim 50%)
//	pipeline-floor  the same load on a single task's hops with none of the
//	            service's code (pipefloor.go); throughput is also reported
//	            as a percentage of it
//	cache       throughput of submissions answered from the result cache
//	batch       one -batch-size batch: time to 202 (< 1s) and to done (< 3s)
//	pickup      idle pickup latency and idle Redis commands/s for each
//	            -pickup-intervals TASK_CHECK_INTERVAL
//
// Usage:
//
//	go run ./cmd/loadgen [-scenario all] [-workers 1] [-clients 32] [-duration 10s] [-json]
//	go run ./cmd/loadgen -serve-floor 127.0.0.1:PORT -floor-redis 127.0.0.1:PORT
//
// -serve-floor serves, instead, the floor that the cache scenario is held
// against: a bare net/http server making one Lua round trip per request
// (floor.go). Run the cache scenario with -server against it and against
// a separate API process.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "loadgen: %v\n", err)
		stop()
		os.Exit(1)
	}
}
