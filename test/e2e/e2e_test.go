package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

const sample8 = `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`

// localResult solves a request in-process, for comparison.
func localResult(t *testing.T, req string) string {
	t.Helper()
	p, err := puzzle.Decode([]byte(req))
	if err != nil {
		t.Fatalf("local decode %s: %v", req, err)
	}
	res, err := p.Solve(context.Background())
	if err != nil {
		t.Fatalf("local solve %s: %v", req, err)
	}
	return string(res)
}

// randomSliding returns a random 3x3 request; seeds give distinct puzzles.
func randomSliding(rng *rand.Rand) string {
	perm := rng.Perm(9)
	rows := make([]string, 3)
	for r := range 3 {
		rows[r] = fmt.Sprintf("[%d,%d,%d]", perm[3*r], perm[3*r+1], perm[3*r+2])
	}
	return fmt.Sprintf(`{"kind":"sliding","puzzle":{"board":[%s]}}`, strings.Join(rows, ","))
}

func randomSweep(rng *rand.Rand, n, m int, dens float64) string {
	rows := make([]string, n)
	for i := range rows {
		b := make([]byte, m)
		for j := range b {
			b[j] = '.'
			if rng.Float64() < dens {
				b[j] = '*'
			}
		}
		rows[i] = `"` + string(b) + `"`
	}
	rows[0] = `"` + "." + strings.Trim(rows[0], `"`)[1:] + `"`
	return fmt.Sprintf(`{"kind":"sweep","puzzle":{"board":[%s]}}`, strings.Join(rows, ","))
}

func TestSingleTaskLifecycleAndCache(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 1, nil)

	code, body, hdr := s.DoH("POST", "/v1/tasks", sample8)
	if code != http.StatusAccepted {
		t.Fatalf("submit: %d %s", code, body)
	}
	tk := decode[apitype.Task](t, body)
	if hdr.Get("Location") != "/v1/tasks/"+tk.ID || len(tk.ID) != 32 || tk.Kind != "sliding" || tk.CreatedAt == nil {
		t.Fatalf("bad 202: location %q, %+v", hdr.Get("Location"), tk)
	}
	done := s.WaitTask(tk.ID, 10*time.Second)
	if done.State != apitype.TaskStateCompleted || string(done.Result) != `{"moves":3,"solvable":true,"path":"DRD"}` ||
		done.Cached || done.Attempts != 1 || done.StartedAt == nil || done.CompletedAt == nil || done.Error != nil {
		t.Fatalf("completed task: %+v %s", done, done.Result)
	}
	queuedBefore := s.Queued(tasks.QueueCheap)

	// The same puzzle again is a cache hit: 200, completed, nothing queued.
	hit := s.Submit(sample8, http.StatusOK)
	if !hit.Cached || hit.State != apitype.TaskStateCompleted || string(hit.Result) != string(done.Result) || hit.ID == tk.ID {
		t.Fatalf("cache hit: %+v", hit)
	}
	if q := s.Queued(tasks.QueueCheap); q != queuedBefore {
		t.Fatalf("a cache hit enqueued work: queue went from %d to %d", queuedBefore, q)
	}
	// An equivalent request spelt differently hits the same cache entry.
	alt := s.Submit(`{"puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"kind":"sliding","options":{}}`, http.StatusOK)
	if !alt.Cached {
		t.Fatalf("canonical form missed the cache: %+v", alt)
	}
	// A fill request with allow_flip is a different puzzle from one without.
	fillReq := `{"kind":"fill","puzzle":{"game_board":[[0,0,1],[1,1,1]],"table":[[1,1,0],[0,0,0]]}}`
	a := s.WaitTask(s.Submit(fillReq, http.StatusAccepted).ID, 10*time.Second)
	b := s.Submit(strings.Replace(fillReq, `}}`, `},"options":{"allow_flip":true}}`, 1), http.StatusAccepted)
	if a.State != apitype.TaskStateCompleted || b.Cached {
		t.Fatalf("allow_flip must change the cache key: %+v %+v", a, b)
	}

	for _, tc := range []struct {
		path string
		code int
	}{
		{"/v1/tasks/" + strings.Repeat("0", 32), http.StatusNotFound},
		{"/v1/tasks/not-an-id", http.StatusNotFound},
		{"/v1/tasks/" + tk.ID + "?wait=2m", http.StatusBadRequest},
		{"/v1/tasks/" + tk.ID + "?wait=soon", http.StatusBadRequest},
		{"/v1/nope", http.StatusNotFound},
	} {
		code, b := s.Do("GET", tc.path, nil)
		if code != tc.code {
			t.Errorf("GET %s: %d, want %d (%s)", tc.path, code, tc.code, b)
		}
		if e := decode[apitype.ErrorBody](t, b); e.Error.Code == "" || e.Error.Message == "" {
			t.Errorf("GET %s: error body without code or message: %s", tc.path, b)
		}
	}
	if code, b := s.Do("DELETE", "/v1/tasks/"+tk.ID, nil); code != http.StatusConflict {
		t.Errorf("cancel of a finished task: %d %s", code, b)
	}
}

func TestCancelPendingTaskNeverRuns(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, nil)
	tk := s.Submit(`{"kind":"sweep","puzzle":{"board":["...",".*.","..."]}}`, http.StatusAccepted)
	code, b := s.Do("DELETE", "/v1/tasks/"+tk.ID, nil)
	if c := decode[apitype.Task](t, b); code != http.StatusOK || c.State != apitype.TaskStateCanceled {
		t.Fatalf("cancel: %d %s", code, b)
	}
	// A second cancel (a retry whose answer was lost) answers as the
	// first did.
	if code, b := s.Do("DELETE", "/v1/tasks/"+tk.ID, nil); code != http.StatusOK || decode[apitype.Task](t, b).State != apitype.TaskStateCanceled {
		t.Fatalf("second cancel: %d %s, want 200 and the canceled task", code, b)
	}
	// Now a worker drains the queue; the canceled task must not run.
	s.AddWorker(nil)
	deadline := time.Now().Add(5 * time.Second)
	for s.Queued("interactive") > 0 {
		info := s.Running("interactive")
		if info == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	got := s.WaitTask(tk.ID, 0)
	if got.State != apitype.TaskStateCanceled || got.Attempts != 0 || got.Result != nil && string(got.Result) != "null" || got.Error == nil || got.Error.Code != "canceled" {
		t.Fatalf("canceled task ran or changed: %+v", got)
	}
}

func TestBatchLifecycleMixedKinds(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 2, map[string]string{"CHUNK_SIZE": "16"})
	rng := rand.New(rand.NewSource(2))
	var reqs []string
	for i := range 300 {
		switch i % 3 {
		case 0:
			reqs = append(reqs, randomSliding(rng))
		case 1:
			reqs = append(reqs, randomSweep(rng, 2+rng.Intn(5), 2+rng.Intn(5), 0.2))
		default:
			reqs = append(reqs, testgen.Fill(rng, 2+rng.Intn(6)))
		}
	}
	reqs = append(reqs, sample8, sample8) // duplicates inside one batch
	raw := make([]json.RawMessage, len(reqs))
	for i, r := range reqs {
		raw[i] = json.RawMessage(r)
	}
	code, b, hdr := s.DoH("POST", "/v1/batches", map[string]any{"tasks": raw})
	if code != http.StatusAccepted {
		t.Fatalf("batch: %d %s", code, b)
	}
	created := decode[apitype.BatchCreated](t, b)
	if created.Total != len(reqs) || len(created.TaskIDs) != len(reqs) || hdr.Get("Location") != "/v1/batches/"+created.ID {
		t.Fatalf("created: %+v", created)
	}
	// A 503 is the API saying a Redis call outran its limit (a loaded
	// machine: the race tests and the cluster stages run beside this);
	// a client asks again, and so does the test, a few times.
	code, b = s.Do("GET", "/v1/batches/"+created.ID+"?wait=60s&limit=1000", nil)
	for try := 1; code == http.StatusServiceUnavailable && try < 5; try++ {
		t.Logf("batch wait, try %d: %d %.300s; asking again", try, code, b)
		time.Sleep(time.Second)
		code, b = s.Do("GET", "/v1/batches/"+created.ID+"?wait=60s&limit=1000", nil)
	}
	got := decode[apitype.Batch](t, b)
	if code != 200 || !got.Done || got.Counts.Completed != len(reqs) || got.Counts.Pending+got.Counts.Active+got.Counts.Failed != 0 {
		t.Fatalf("batch after wait: %d done=%v counts=%v %.300s", code, got.Done, got.Counts, b)
	}
	if len(got.Tasks) != len(reqs) || got.NextCursor != nil {
		t.Fatalf("items: %d, next %v", len(got.Tasks), got.NextCursor)
	}
	for i, tk := range got.Tasks {
		if tk.ID != created.TaskIDs[i] || tk.BatchID == nil || *tk.BatchID != created.ID {
			t.Fatalf("item %d out of order or unlinked: %+v", i, tk)
		}
		if want := localResult(t, reqs[i]); string(tk.Result) != want {
			t.Fatalf("item %d (%s): result %s, want %s", i, reqs[i], tk.Result, want)
		}
	}
	// Paging with cursor and limit walks the same items in order.
	var paged []string
	cursor := ""
	for page := 0; page < 100; page++ {
		code, b := s.Do("GET", "/v1/batches/"+created.ID+"?limit=64"+cursor, nil)
		p := decode[apitype.Batch](t, b)
		if code != 200 {
			t.Fatalf("page: %d %s", code, b)
		}
		for _, tk := range p.Tasks {
			paged = append(paged, tk.ID)
		}
		if p.NextCursor == nil {
			break
		}
		cursor = "&cursor=" + *p.NextCursor
	}
	if strings.Join(paged, ",") != strings.Join(created.TaskIDs, ",") {
		t.Fatalf("paging returned %d ids, not the submission order", len(paged))
	}
	// A JSON batch's output is one result per line, like solve --format json.
	code, b = s.Do("GET", "/v1/batches/"+created.ID+"/output", nil)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if code != 200 || len(lines) != len(reqs) || lines[0] != localResult(t, reqs[0]) {
		t.Fatalf("output: %d, %d lines", code, len(lines))
	}
	if code, _ := s.Do("DELETE", "/v1/batches/"+created.ID, nil); code != http.StatusConflict {
		t.Errorf("cancel of a finished batch: %d", code)
	}
	if code, _ := s.Do("GET", "/v1/batches/"+strings.Repeat("a", 32), nil); code != 404 {
		t.Errorf("unknown batch: %d", code)
	}
}

func TestJudgeTextBatchOutput(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 1, nil)
	for _, tc := range []struct{ format, in, want string }{
		{"boj1525", "1 0 3\n4 2 5\n7 8 6\n", "3\n"},
		{"boj1525", "3 6 0\n8 1 2\n7 4 5\n", "-1\n"},
		{"boj9944", "5 5\n**...\n.....\n....*\n..*..\n.....\n3 4\n****\n*...\n*..*\n", "Case 1: 10\nCase 2: 3\n"},
		{"p84021", `{"game_board":[[1,1,0,0,1,0],[0,0,1,0,1,0],[0,1,1,0,0,1],[1,1,0,1,1,1],[1,0,0,0,1,0],[0,1,1,1,0,0]],"table":[[1,0,0,1,1,0],[1,0,1,0,1,0],[0,1,1,0,1,1],[0,0,1,0,0,0],[1,1,0,1,1,0],[0,1,0,0,0,0]]}`, "14\n"},
	} {
		code, b := s.Do("POST", "/v1/batches?format="+tc.format, tc.in)
		if code != http.StatusAccepted {
			t.Fatalf("%s: %d %s", tc.format, code, b)
		}
		id := decode[apitype.BatchCreated](t, b).ID
		code, b = s.Do("GET", "/v1/batches/"+id+"/output?wait=30s", nil)
		if code != 200 || string(b) != tc.want {
			t.Errorf("%s output: %d %q, want %q", tc.format, code, b, tc.want)
		}
	}
}

func TestBatchCancelStopsPendingItems(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, nil)
	rng := rand.New(rand.NewSource(3))
	raw := make([]json.RawMessage, 40)
	for i := range raw {
		raw[i] = json.RawMessage(randomSliding(rng))
	}
	code, b := s.Do("POST", "/v1/batches", map[string]any{"tasks": raw})
	if code != 202 {
		t.Fatalf("%d %s", code, b)
	}
	id := decode[apitype.BatchCreated](t, b).ID
	code, b = s.Do("DELETE", "/v1/batches/"+id, nil)
	if code != 200 || !strings.Contains(string(b), `"canceled":40`) {
		t.Fatalf("cancel batch: %d %s", code, b)
	}
	s.AddWorker(nil)
	code, b = s.Do("GET", "/v1/batches/"+id+"?wait=5s", nil)
	got := decode[apitype.Batch](t, b)
	if !got.Done || got.Counts.Canceled != 40 || got.Counts.Completed != 0 {
		t.Fatalf("after cancel: %+v", got.Counts)
	}
	time.Sleep(300 * time.Millisecond) // give the worker time to (not) run them
	code, b = s.Do("GET", "/v1/batches/"+id+"?limit=1000", nil)
	for _, tk := range decode[apitype.Batch](t, b).Tasks {
		if tk.State != apitype.TaskStateCanceled || tk.Attempts != 0 {
			t.Fatalf("canceled item ran: %+v", tk)
		}
	}
	if code, b := s.Do("GET", "/v1/batches/"+id+"/output", nil); code != http.StatusConflict || !strings.Contains(string(b), "incomplete") {
		t.Fatalf("output of a canceled batch: %d %s", code, b)
	}
}

func TestSinglesOvertakeABulkBatch(t *testing.T) {
	t.Parallel()
	// One worker slot makes the order of service observable.
	s := stacktest.StartWith(t, 1, map[string]string{"WORKER_CONCURRENCY": "1", "REQUEST_TIMEOUT": "60s"})
	rng := rand.New(rand.NewSource(4))
	// Sweep items are queued one task each, so the batch is 1,000 queue
	// round trips long: long enough to be overtaken, cheap to submit.
	raw := make([]json.RawMessage, 1000)
	for i := range raw {
		raw[i] = json.RawMessage(randomSweep(rng, 6, 6, 0.15))
	}
	code, b := s.Do("POST", "/v1/batches", map[string]any{"tasks": raw})
	if code != 202 {
		t.Fatalf("%d %s", code, b)
	}
	bid := decode[apitype.BatchCreated](t, b).ID
	time.Sleep(50 * time.Millisecond) // the batch is now being worked on
	single := s.Submit(`{"kind":"sweep","puzzle":{"board":["....","..*.","...."]}}`, http.StatusAccepted)
	done := s.WaitTask(single.ID, 30*time.Second)
	code, b = s.Do("GET", "/v1/batches/"+bid, nil)
	bt := decode[apitype.Batch](t, b)
	if done.State != apitype.TaskStateCompleted {
		t.Fatalf("single: %+v", done)
	}
	t.Logf("single took %v; batch had %d of %d done", done.CompletedAt.Sub(*done.CreatedAt), bt.Counts.Completed, bt.Total)
	if bt.Done {
		t.Fatalf("the single waited for the whole batch")
	}
}

func TestConcurrentSubmitsOfOnePuzzle(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 2, nil)
	var wg sync.WaitGroup
	ids := make([]string, 20)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, b := s.Do("POST", "/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[8,6,7],[2,5,4],[3,0,1]]}}`)
			if code != 202 && code != 200 {
				t.Errorf("submit: %d %s", code, b)
				return
			}
			ids[i] = decode[apitype.Task](t, b).ID
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if tk := s.WaitTask(id, 10*time.Second); tk.State != apitype.TaskStateCompleted || !strings.Contains(string(tk.Result), `"moves":31`) {
			t.Fatalf("task %s: %+v %s", id, tk, tk.Result)
		}
	}
}

// hardest80 is one of the 17 hardest 15-puzzle positions, 80 moves from
// the goal (TestKorf80 in solvers/sliding; test/fault/hard_test.go's
// boards are steps along its solution). IDA* searches 1.1 G nodes for it,
// about a minute of CPU with the pattern databases (more under -race), so
// a solve of it is certainly still running seconds after it started: a
// test that cancels it needs no luck to catch it running.
const hardest80 = `{"kind":"sliding","puzzle":{"board":[[0,12,9,13],[15,11,10,14],[3,7,2,5],[4,8,6,1]]}}`

// TestCancelRunningSearch cancels a solve while the worker runs it. The
// board takes about a minute of CPU, so the solve is running when the
// DELETE comes, and the test asserts it: the worker's registry holds it,
// the record is active with search progress (nodes expanded, so IDA* is
// searching, past the pattern databases' first build in this process),
// and the DELETE answers 200, not 409 (ended). The solver must then stop
// within 100 ms, and the task end canceled, once, with no retry queued.
func TestCancelRunningSearch(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 1, nil)
	w := s.Workers[0]
	tk := s.Submit(hardest80, http.StatusAccepted)
	// Progress is written every 2^20 nodes; the first solve of a 4x4
	// board in this process builds the pattern databases first (6 s of
	// CPU, several times that under -race).
	deadline := time.Now().Add(5 * time.Minute)
	var running apitype.Task
	for {
		running = s.WaitTask(tk.ID, 0)
		if running.State == apitype.TaskStateActive && running.Progress != nil && running.Progress.Nodes > 0 && w.Cancels().Running() == 1 {
			break
		}
		if running.State.Terminal() || time.Now().After(deadline) {
			t.Fatalf("the search never ran: %+v (registry %d)", running, w.Cancels().Running())
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, b := s.Do("DELETE", "/v1/tasks/"+tk.ID, nil)
	if code != http.StatusOK {
		t.Fatalf("cancel of the running search (%d nodes expanded): %d %s, want 200", running.Progress.Nodes, code, b)
	}
	at := time.Now()
	for w.Cancels().Running() != 0 {
		if time.Since(at) > 2*time.Second {
			t.Fatal("the running solve did not stop")
		}
		time.Sleep(time.Millisecond)
	}
	stopped := time.Since(at)
	t.Logf("running search (bound %d, %d nodes) stopped %v after DELETE returned", running.Progress.Bound, running.Progress.Nodes, stopped)
	if stopped > 100*time.Millisecond && !raceEnabled {
		t.Errorf("solver saw the cancel after %v, want within 100ms", stopped)
	}
	time.Sleep(200 * time.Millisecond) // a retry, if one were scheduled, would show now
	got := s.WaitTask(tk.ID, 0)
	if got.State != apitype.TaskStateCanceled || got.Attempts != 1 || got.Error == nil || got.Error.Code != "canceled" || (len(got.Result) != 0 && string(got.Result) != "null") {
		t.Fatalf("after cancel: %+v", got)
	}
	if q := s.Running("interactive"); q != 0 {
		t.Fatalf("the canceled task is still queued (%d)", q)
	}
	if n, _ := s.RDB.ZCard(context.Background(), "asynq:{interactive}:retry").Result(); n != 0 {
		t.Fatalf("the canceled task was scheduled for retry")
	}
}

// recordState reads a task record's state straight from Redis.
func recordState(t *testing.T, s *stacktest.Stack, id string) apitype.TaskState {
	t.Helper()
	v, err := s.RDB.HGet(context.Background(), "pq:task:"+id, "state").Result()
	if err != nil {
		t.Fatalf("state of %s: %v", id, err)
	}
	return apitype.TaskState(v)
}

func TestSubmitAndWaitInOneRequest(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 1, nil)
	code, b, hdr := s.DoH("POST", "/v1/tasks?wait=10s", `{"kind":"sliding","puzzle":{"board":[[4,1,2],[5,0,3],[7,8,6]]}}`)
	tk := decode[apitype.Task](t, b)
	if code != http.StatusOK || tk.State != apitype.TaskStateCompleted || tk.Result == nil || hdr.Get("Location") != "/v1/tasks/"+tk.ID {
		t.Fatalf("submit and wait: %d %s", code, b)
	}
	if want := localResult(t, `{"kind":"sliding","puzzle":{"board":[[4,1,2],[5,0,3],[7,8,6]]}}`); string(tk.Result) != want {
		t.Fatalf("result %s, want %s", tk.Result, want)
	}
	if code, _ := s.Do("POST", "/v1/tasks?wait=forever", sample8); code != http.StatusBadRequest {
		t.Fatalf("bad wait: %d", code)
	}
	// No worker to finish it in time: 202 with the pending task.
	s2 := stacktest.StartWith(t, 0, nil)
	code, b, _ = s2.DoH("POST", "/v1/tasks?wait=200ms", sample8)
	if tk := decode[apitype.Task](t, b); code != http.StatusAccepted || tk.State != apitype.TaskStatePending {
		t.Fatalf("wait ran out: %d %s", code, b)
	}
}

func TestLargeSlidingBoardReportsProgress(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 1, nil)
	// A 2x8 board 82 moves from the goal: IDA* with pattern databases
	// searches it for about 0.3 s (several seconds under -race), reporting
	// each new bound; the record must show it while the task runs.
	board := [][]int{{14, 9, 10, 1, 5, 11, 8, 2}, {7, 15, 12, 3, 13, 0, 4, 6}}
	req := `{"kind":"sliding","puzzle":{"board":[[14,9,10,1,5,11,8,2],[7,15,12,3,13,0,4,6]]}}`
	tk := s.Submit(req, http.StatusAccepted)
	var running []byte
	for deadline := time.Now().Add(60 * time.Second); running == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		_, b := s.Do("GET", "/v1/tasks/"+tk.ID, nil)
		if m := decode[map[string]json.RawMessage](t, b); string(m["state"]) == `"active"` && string(m["progress"]) != "null" {
			running = m["progress"]
		} else if string(m["state"]) == `"completed"` {
			break
		}
	}
	if running == nil {
		t.Fatal("no progress was visible while the search ran")
	}
	t.Logf("progress while running: %s", running)
	var got apitype.Task
	code, b := s.Do("GET", "/v1/tasks/"+tk.ID+"?wait=60s", nil)
	if code != 200 || json.Unmarshal(b, &got) != nil || got.State != apitype.TaskStateCompleted {
		t.Fatalf("2x8 board: %d %s", code, b)
	}
	// Optimality is the solver's tests' business; here the answer must be
	// a real solution: replaying the path reaches the goal in that many
	// moves. (A second solve for comparison would double the test's cost.)
	var res struct {
		Moves int    `json:"moves"`
		Path  string `json:"path"`
	}
	json.Unmarshal(got.Result, &res)
	if !replaySliding(board, res.Path) || len(res.Path) != res.Moves || res.Moves <= 0 {
		t.Fatalf("result %s does not replay to the goal in %d moves", got.Result, res.Moves)
	}
	var p struct {
		Bound int   `json:"bound"`
		Nodes int64 `json:"nodes"`
	}
	raw := decode[map[string]json.RawMessage](t, b)["progress"]
	if err := json.Unmarshal(raw, &p); err != nil || p.Bound <= 0 {
		t.Fatalf("progress %s: %v", raw, err)
	}
	t.Logf("2x8 board: %s, last progress %s", got.Result, raw)
	// Large boards are searched one task each, never in a chunk.
	code, b = s.Do("POST", "/v1/batches", `{"tasks":[`+req+`,`+sample8+`]}`)
	if code != 202 {
		t.Fatalf("batch: %d %s", code, b)
	}
	code, b = s.Do("GET", "/v1/batches/"+decode[apitype.BatchCreated](t, b).ID+"?wait=60s", nil)
	if bt := decode[apitype.Batch](t, b); !bt.Done || bt.Counts.Completed != 2 {
		t.Fatalf("batch with a large board: %s", b)
	}
}

// replaySliding moves the blank along path and reports whether it ends on
// the goal (1..n-1, blank last).
func replaySliding(b [][]int, path string) bool {
	r, c := 0, 0
	for i := range b {
		for j := range b[i] {
			if b[i][j] == 0 {
				r, c = i, j
			}
		}
	}
	for _, m := range path {
		nr, nc := r, c
		switch m {
		case 'U':
			nr--
		case 'D':
			nr++
		case 'L':
			nc--
		case 'R':
			nc++
		default:
			return false
		}
		if nr < 0 || nr >= len(b) || nc < 0 || nc >= len(b[0]) {
			return false
		}
		b[r][c], b[nr][nc] = b[nr][nc], 0
		r, c = nr, nc
	}
	n := len(b) * len(b[0])
	for i := range b {
		for j := range b[i] {
			if want := (i*len(b[0]) + j + 1) % n; b[i][j] != want {
				return false
			}
		}
	}
	return true
}
