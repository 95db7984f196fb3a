//go:build fault

// Package fault is puzzleq's fault-injection suite. It builds cmd/api and
// cmd/worker, runs them as real processes against a real redis-server, and
// injects the faults production will see: a worker killed with SIGKILL, a
// worker stopped with SIGTERM under load, Redis killed and restarted from
// its AOF, Redis stalled right after an enqueue, duplicate task delivery, a 100,000-task load and a storm of
// long polls. Every scenario checks the final state of every task against
// the local solver. Faults aimed at running work come while every worker
// slot runs a 15-puzzle of known length (hard_test.go), and the scenario
// checks afterwards that it did, so none can pass with nothing in flight.
//
// The suite is behind the "fault" build tag so `go test ./...` skips it:
//
//	go test -tags fault ./test/fault/ -v -timeout 15m
//
// TestFault orders and bounds its cases itself (see there), so the suite
// raises go test's -parallel to what that needs (minParallel).
//
// A process's log is printed when its test fails; to keep every log of a
// run, passed cases' too (which component re-drove a task, say), set
// PUZZLEQ_KEEP_LOGS to a directory (stacktest.KeepLogsEnv).
//
// docs/guarantees.md states what it holds and what it measures.
package fault
