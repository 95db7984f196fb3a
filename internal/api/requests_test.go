package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// The tests in this file hold the API's answers to requests it must
// refuse, and its long polls, on a real Redis without workers.

const sample8 = `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`

// randomSliding returns a random 3x3 request; seeds give distinct puzzles.
func randomSliding(rng *rand.Rand) string {
	perm := rng.Perm(9)
	rows := make([]string, 3)
	for r := range 3 {
		rows[r] = fmt.Sprintf("[%d,%d,%d]", perm[3*r], perm[3*r+1], perm[3*r+2])
	}
	return fmt.Sprintf(`{"kind":"sliding","puzzle":{"board":[%s]}}`, strings.Join(rows, ","))
}

func TestBadRequestsNameTheField(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, map[string]string{"MAX_BODY_BYTES": "4096"})
	for _, tc := range []struct {
		name, body string
		status     int
		code       string
		field      string
	}{
		{"ragged sliding", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2],[7,8,6]]}}`, 400, "invalid_puzzle", "puzzle.board[1]"},
		{"unknown kind", `{"kind":"chess","puzzle":{}}`, 400, "invalid_request", "kind"},
		{"no puzzle", `{"kind":"sweep"}`, 400, "invalid_request", "puzzle"},
		{"wrong type", `{"kind":"sweep","puzzle":{"board":"....."}}`, 400, "invalid_request", "puzzle.board"},
		{"unknown field", `{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]},"optoins":{}}`, 400, "invalid_request", "optoins"},
		{"bad char", `{"kind":"sweep","puzzle":{"board":["..x"]}}`, 400, "invalid_puzzle", "puzzle.board[0]"},
		{"too big board", `{"kind":"sweep","puzzle":{"board":["` + strings.Repeat(".", 31) + `"]}}`, 400, "too_large", "puzzle.board"},
		{"truncated", `{"kind":"sliding","puzzle":{"board":[[1,0`, 400, "invalid_request", ""},
		{"not json", `hello`, 400, "invalid_request", ""},
		{"empty", ``, 400, "invalid_request", ""},
		{"body too large", `{"kind":"sweep","puzzle":{"board":["` + strings.Repeat(".", 5000) + `"]}}`, 413, "body_too_large", ""},
		{"negative budget", `{"kind":"sweep","puzzle":{"board":["."]},"options":{"max_nodes":-1}}`, 400, "invalid_request", "options.max_nodes"},
	} {
		code, b := s.Do("POST", "/v1/tasks", tc.body)
		e := decode[apitype.ErrorBody](t, b)
		if code != tc.status || e.Error.Code != tc.code || e.Error.Field != tc.field || e.Error.Message == "" {
			t.Errorf("%s: got %d %+v, want %d code %q field %q", tc.name, code, e.Error, tc.status, tc.code, tc.field)
		}
	}
	if n := s.Records(); n != 0 {
		t.Errorf("rejected requests left %d records", n)
	}
}

func TestLongPollWakesOnCompletion(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, nil) // no worker: the test ends the task itself
	tk := s.Submit(sample8, http.StatusAccepted)
	type res struct {
		tk  apitype.Task
		err error
		at  time.Time
	}
	got := make(chan res, 1)
	go func() {
		req, _ := http.NewRequest("GET", s.URL+"/v1/tasks/"+tk.ID+"?wait=30s", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- res{err: err}
			return
		}
		defer resp.Body.Close()
		var v apitype.Task
		err = json.NewDecoder(resp.Body).Decode(&v)
		got <- res{tk: v, err: err, at: time.Now()}
	}()
	time.Sleep(300 * time.Millisecond) // the poll is now waiting
	select {
	case r := <-got:
		t.Fatalf("long poll returned before the task ended: %+v", r)
	default:
	}
	finished := time.Now()
	if _, err := s.Store.Finish(context.Background(), []worker.Transition{{ID: tk.ID, State: apitype.TaskStateCompleted,
		Result: json.RawMessage(`{"moves":3,"solvable":true,"path":"DRD"}`)}}, nil); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.tk.State != apitype.TaskStateCompleted {
		t.Fatalf("long poll: %+v %v", r.tk, r.err)
	}
	// The re-check interval is 5s: an answer well inside it proves the
	// wake-up came from the notification.
	lat := r.at.Sub(finished)
	t.Logf("long poll woke %v after completion", lat)
	if lat > 2*time.Second {
		t.Fatalf("long poll woke %v after completion: not by notification", lat)
	}

	// A wait that runs out returns the pending task, not an error.
	tk2 := s.Submit(`{"kind":"sliding","puzzle":{"board":[[2,1],[3,0]]}}`, http.StatusAccepted)
	start := time.Now()
	if w := s.WaitTask(tk2.ID, 300*time.Millisecond); w.State != apitype.TaskStatePending || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("expired wait: %+v after %v", w, time.Since(start))
	}
}

func TestBatchIsAllOrNothing(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, map[string]string{"MAX_BATCH_ITEMS": "50"})
	rng := rand.New(rand.NewSource(1))
	items := make([]json.RawMessage, 30)
	for i := range items {
		items[i] = json.RawMessage(randomSliding(rng))
	}
	items[17] = json.RawMessage(`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,8,8]]}}`)
	code, b := s.Do("POST", "/v1/batches", map[string]any{"tasks": items})
	e := decode[apitype.ErrorBody](t, b)
	if code != 400 || !strings.HasPrefix(e.Error.Field, "tasks[17].puzzle.board") || e.Error.Code != "invalid_puzzle" {
		t.Fatalf("bad item: %d %+v", code, e)
	}
	for _, tc := range []struct {
		name, body string
		field      string
	}{
		{"empty", `{"tasks":[]}`, "tasks"},
		{"missing", `{}`, "tasks"},
		{"not a list", `{"tasks":{}}`, "tasks"},
		{"too many", `{"tasks":[` + strings.TrimSuffix(strings.Repeat(sample8+",", 51), ",") + `]}`, "tasks"},
		{"bad format", `x`, ""},
	} {
		code, b := s.Do("POST", "/v1/batches", tc.body)
		if e := decode[apitype.ErrorBody](t, b); code != 400 || e.Error.Field != tc.field {
			t.Errorf("%s: %d %s", tc.name, code, b)
		}
	}
	if code, b := s.Do("POST", "/v1/batches?format=boj1525", "1 2 3\n4 5\n"); code != 400 || !strings.Contains(string(b), "line 2") {
		t.Errorf("bad judge text: %d %s", code, b)
	}
	if code, _ := s.Do("POST", "/v1/batches?format=doc", "x"); code != 400 {
		t.Errorf("unknown format: %d", code)
	}
	if n := s.Records(); n != 0 {
		t.Errorf("rejected batches left %d records", n)
	}
	if n := s.Keys("asynq:{*}:t:*"); n != 0 {
		t.Errorf("rejected batches enqueued %d tasks", n)
	}
}
