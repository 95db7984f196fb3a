package main

import (
	"os"
	"strconv"
	"time"

	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// startStack starts puzzleq inside this process (internal/stacktest): a
// redis-server child, the API and o.workers workers, logging to stderr.
func startStack(o *options) (*stacktest.Stack, error) {
	st, err := stacktest.Launch(stacktest.Options{
		Env:    map[string]string{"LOG_LEVEL": o.logLevel, "LOG_FORMAT": "text", "SHUTDOWN_TIMEOUT": "5s"},
		LogOut: os.Stderr,
	})
	if err != nil {
		return nil, err
	}
	if err := startWorkers(st, o.workers, o.concurrency, o.cheapConc, o.checkInterval); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// startWorkers starts n workers of the given concurrency (0: GOMAXPROCS),
// cheap lane's concurrency (0: the default) and task check interval;
// pickup restarts them with other intervals.
func startWorkers(st *stacktest.Stack, n, concurrency, cheap int, interval time.Duration) error {
	env := map[string]string{"WORKER_CONCURRENCY": strconv.Itoa(concurrency), "TASK_CHECK_INTERVAL": interval.String()}
	if cheap > 0 {
		env["CHEAP_CONCURRENCY"] = strconv.Itoa(cheap)
	}
	for range n {
		if _, err := st.StartWorker(env); err != nil {
			return err
		}
	}
	return nil
}
