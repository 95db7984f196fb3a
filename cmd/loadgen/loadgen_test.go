package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/redistest"
)

// TestScenarios runs every scenario at a tiny size against a real
// redis-server and checks that every submitted task is accounted for.
func TestScenarios(t *testing.T) {
	if _, err := os.Stat(redistest.Binary()); err != nil {
		t.Skipf("redis-server not found at %s", redistest.Binary())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	args := []string{"-json", "-single-n", "5", "-clients", "4", "-duration", "1s", "-tasks", "20",
		"-batch-size", "50", "-pickup-intervals", "20ms,5ms", "-pickup-samples", "3", "-pickup-idle", "200ms"}
	if err := run(ctx, args, &out); err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("decode the JSON report: %v\n%s", err, out.Bytes())
	}
	got := map[string]*Result{}
	for _, r := range rep.Results {
		got[r.Scenario] = r
	}
	want := map[string]int{"single": 10, "throughput": 0, "raw-asynq": 0, "pipeline-floor": 0, "cache": 0, "batch": 50, "pickup": 6}
	for name, n := range want {
		r := got[name]
		if r == nil {
			t.Errorf("%s: no result", name)
			continue
		}
		if r.Skipped != "" || r.Errors != 0 || r.Failed != 0 {
			t.Errorf("%s: skipped %q, %d errors (%s), %d failed", name, r.Skipped, r.Errors, r.FirstError, r.Failed)
		}
		if r.Submitted == 0 || r.Completed != r.Submitted {
			t.Errorf("%s: %d submitted, %d completed: tasks lost", name, r.Submitted, r.Completed)
		}
		if n > 0 && r.Submitted != n {
			t.Errorf("%s: %d submitted, want %d", name, r.Submitted, n)
		}
		if (name == "throughput" || name == "raw-asynq" || name == "pipeline-floor" || name == "cache") && r.Submitted > 20 {
			t.Errorf("%s: %d submitted, more than -tasks 20", name, r.Submitted)
		}
	}
	if p := got["pickup"]; p != nil && len(p.Pickup) != 3 {
		t.Errorf("pickup: %d rows, want none, 20ms and 5ms", len(p.Pickup))
	}
	if b := got["batch"]; b != nil && (b.Batch == nil || b.Batch.Counts.Completed != 50) {
		t.Errorf("batch: figures %+v", b.Batch)
	}
	if r := got["throughput"]; r != nil && (r.PercentOfRaw == nil || r.PercentOfPipelineFloor == nil) {
		t.Errorf("throughput: a percentage of raw asynq (%v) or of the pipeline floor (%v) is missing", r.PercentOfRaw, r.PercentOfPipelineFloor)
	}
	if r := got["pipeline-floor"]; r != nil && r.PercentOfRaw == nil {
		t.Errorf("pipeline-floor: no percentage of raw asynq")
	}
}

// TestPool checks the pool holds every solvable 8-puzzle and hands each
// out once.
func TestPool(t *testing.T) {
	p := newPool(1)
	if len(p.boards) != 181440 {
		t.Fatalf("%d solvable boards, want 181440", len(p.boards))
	}
	seen := map[[9]int8]bool{}
	for _, b := range p.boards[:1000] {
		if seen[b] {
			t.Fatalf("board %v handed out twice", b)
		}
		seen[b] = true
	}
}

// TestServerMustBeLoopback checks -server only accepts this machine.
func TestServerMustBeLoopback(t *testing.T) {
	for _, u := range []string{"http://example.com", "http://10.0.0.1:8080", "ftp://127.0.0.1"} {
		if _, err := parseOptions([]string{"-server", u}, &bytes.Buffer{}); err == nil {
			t.Errorf("-server %s accepted", u)
		}
	}
	if _, err := parseOptions([]string{"-server", "http://127.0.0.1:8080/"}, &bytes.Buffer{}); err != nil {
		t.Errorf("-server 127.0.0.1: %v", err)
	}
}
