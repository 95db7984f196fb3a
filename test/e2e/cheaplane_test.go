package e2e_test

import (
	"encoding/json"
	"math/rand"
	"net/http"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestCheapWorkPassesASearchHoldingEverySlot: a worker with one solver
// slot runs an 80-move 15-puzzle, which takes a minute of CPU and more,
// and a batch of more such boards fills the solvers' bulk queue to
// FEED_DEPTH behind it, the rest waiting in the feed. Single 8-puzzles
// and a 20-item batch of them, submitted while the search runs, all
// finish while it still runs: they run on the cheap lane's slots
// (CHEAP_CONCURRENCY), fed from the cheap lane's feed, not behind the
// searches. Each lands on the cheap lane's queues.
func TestCheapWorkPassesASearchHoldingEverySlot(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 1, map[string]string{"WORKER_CONCURRENCY": "1", "CHUNK_SIZE": "8", "FEED_DEPTH": "1"})
	w := s.Workers[0]
	hard := s.Submit(hardest80, http.StatusAccepted)
	t.Cleanup(func() { s.Do("DELETE", "/v1/tasks/"+hard.ID, nil) })
	deadline := time.Now().Add(time.Minute)
	for w.Cancels().Running() != 1 || s.WaitTask(hard.ID, 0).State != apitype.TaskStateActive {
		if time.Now().After(deadline) {
			t.Fatalf("the search never started: %+v", s.WaitTask(hard.ID, 0))
		}
		time.Sleep(5 * time.Millisecond)
	}
	hardRaw := make([]json.RawMessage, 4)
	for i := range hardRaw {
		hardRaw[i] = json.RawMessage(hardest80)
	}
	code, b := s.Do("POST", "/v1/batches", map[string]any{"tasks": hardRaw})
	if code != http.StatusAccepted {
		t.Fatalf("batch of searches: %d %s", code, b)
	}
	hardBatch := decode[apitype.BatchCreated](t, b).ID
	t.Cleanup(func() { s.Do("DELETE", "/v1/batches/"+hardBatch, nil) })

	rng := rand.New(rand.NewSource(31))
	for i := range 10 {
		req := randomSliding(rng)
		code, b := s.Do("POST", "/v1/tasks?wait=30s", req)
		tk := decode[apitype.Task](t, b)
		if code != http.StatusOK || tk.State != apitype.TaskStateCompleted || string(tk.Result) != localResult(t, req) {
			t.Fatalf("single %d behind the search: %d %s", i, code, b)
		}
	}
	raw := make([]json.RawMessage, 20)
	reqs := make([]string, len(raw))
	for i := range raw {
		reqs[i] = randomSliding(rng)
		raw[i] = json.RawMessage(reqs[i])
	}
	code, b = s.Do("POST", "/v1/batches", map[string]any{"tasks": raw})
	if code != http.StatusAccepted {
		t.Fatalf("batch: %d %s", code, b)
	}
	id := decode[apitype.BatchCreated](t, b).ID
	code, b = s.Do("GET", "/v1/batches/"+id+"?wait=30s&limit=100", nil)
	bt := decode[apitype.Batch](t, b)
	if code != http.StatusOK || !bt.Done || bt.Counts.Completed != len(raw) {
		t.Fatalf("batch behind the search: %d done=%v counts=%+v", code, bt.Done, bt.Counts)
	}
	for i, tk := range bt.Tasks {
		if string(tk.Result) != localResult(t, reqs[i]) {
			t.Fatalf("batch item %d: %s", i, tk.Result)
		}
	}
	// All of it finished while the search still held the solver slot.
	if st := s.WaitTask(hard.ID, 0).State; st != apitype.TaskStateActive || w.Cancels().Running() != 1 {
		t.Fatalf("the search is %s (%d running): the cheap work was not shown to pass it", st, w.Cancels().Running())
	}
	if n := s.Queued(tasks.QueueCheap); n != 10 {
		t.Errorf("%d tasks went through the cheap lane's singles queue, want the 10 singles", n)
	}
	if n := s.Queued(tasks.QueueCheapBulk); n != 3 {
		t.Errorf("%d units went through the cheap lane's bulk queue, want the batch's 3 chunks", n)
	}
	if n := s.Queued(tasks.QueueInteractive); n != 1 {
		t.Errorf("the solvers' singles queue took %d tasks, want the search alone", n)
	}
	if bt := decode[apitype.Batch](t, must200(t, s, "/v1/batches/"+hardBatch)); bt.Counts.Completed != 0 {
		t.Errorf("the searches' batch has %d items done: the test did not hold the solver slot", bt.Counts.Completed)
	}
}

// TestMixedBatchUnitsTakeTheirLanes: a batch of cheap items with
// expensive ones among them runs its chunks' units of cheap items in the
// cheap lane and each expensive item, in a unit of its own, on the solver
// slots; every item is solved right.
func TestMixedBatchUnitsTakeTheirLanes(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 1, map[string]string{"CHUNK_SIZE": "4"})
	rng := rand.New(rand.NewSource(32))
	var reqs []string
	for i := range 12 {
		if i%4 == 3 {
			reqs = append(reqs, randomSweep(rng, 4, 4, 0.2)) // a search: its own unit
		} else {
			reqs = append(reqs, randomSliding(rng))
		}
	}
	raw := make([]json.RawMessage, len(reqs))
	for i := range reqs {
		raw[i] = json.RawMessage(reqs[i])
	}
	code, b := s.Do("POST", "/v1/batches", map[string]any{"tasks": raw})
	if code != http.StatusAccepted {
		t.Fatalf("batch: %d %s", code, b)
	}
	id := decode[apitype.BatchCreated](t, b).ID
	code, b = s.Do("GET", "/v1/batches/"+id+"?wait=60s&limit=100", nil)
	bt := decode[apitype.Batch](t, b)
	if code != http.StatusOK || !bt.Done || bt.Counts.Completed != len(reqs) {
		t.Fatalf("batch: %d done=%v counts=%+v", code, bt.Done, bt.Counts)
	}
	for i, tk := range bt.Tasks {
		if string(tk.Result) != localResult(t, reqs[i]) {
			t.Fatalf("item %d: %s", i, tk.Result)
		}
	}
	if n := s.Queued(tasks.QueueCheapBulk); n != 3 {
		t.Errorf("%d units went through the cheap lane's bulk queue, want the 3 chunks' units of cheap items", n)
	}
	if n := s.Queued(tasks.QueueBulk); n != 3 {
		t.Errorf("%d units went through the solvers' bulk queue, want the 3 sweeps' own units", n)
	}
}

// must200 GETs path and returns the body of its 200.
func must200(t *testing.T, s *stacktest.Stack, path string) []byte {
	t.Helper()
	code, b := s.Do("GET", path, nil)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, b)
	}
	return b
}
