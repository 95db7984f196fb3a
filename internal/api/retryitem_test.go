package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// POST /v1/tasks/{id}/retry on a real stack: a failed item and a
// canceled one run again under their IDs, a repeat is answered as the
// first, and what cannot be retried says why.
func TestRetryItem(t *testing.T) {
	const alice, bob = "alice-key-0123456789", "bob-key-0123456789ab"
	// No worker until the items must run, so that what each step sees is
	// settled; chunks of 4 put the two 8-puzzles in one unit.
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:" + alice + ",bob:" + bob,
		"KEY_PREFIX": "retryitem:", "CHUNK_SIZE": "4"})
	const eight = `"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`
	body := `{"custom_id":"a",` + eight + "\n" + `{"custom_id":"b",` + eight + "\n" + `{"custom_id":"c",` + overBudget[1:] + "\n"
	code, b, _ := s.DoAs(alice, "POST", "/v1/batches", body, "Content-Type", "application/x-ndjson")
	if code != http.StatusAccepted {
		t.Fatalf("submit: %d %s", code, b)
	}
	id := stacktest.Decode[apitype.BatchCreated](t, b).ID
	item := func(i int) string { return apitype.ItemID(id, i) }
	retry := func(key, tid string, want int) (apitype.Task, apitype.ErrorBody) {
		t.Helper()
		code, b, _ := s.DoAs(key, "POST", "/v1/tasks/"+tid+"/retry", nil)
		if code != want {
			t.Fatalf("retry %s: %d, want %d: %s", tid, code, want, b)
		}
		if code == http.StatusOK {
			return stacktest.Decode[apitype.Task](t, b), apitype.ErrorBody{}
		}
		return apitype.Task{}, stacktest.Decode[apitype.ErrorBody](t, b)
	}

	// b canceled while a, in its chunk, waits: the chunk's unit still
	// has a to run, so b waits for a later retry.
	if code, b, _ := s.DoAs(alice, "DELETE", "/v1/tasks/"+item(1), nil); code != http.StatusOK {
		t.Fatalf("cancel b: %d %s", code, b)
	}
	if _, e := retry(alice, item(1), http.StatusConflict); !strings.Contains(e.Error.Message, "chunk still runs") {
		t.Errorf("retry of b beside a pending a: %+v", e.Error)
	}
	// A pending item is answered as it is.
	if tk, _ := retry(alice, item(0), http.StatusOK); tk.State != apitype.TaskStatePending || tk.ID != item(0) {
		t.Errorf("retry of pending a: %+v", tk)
	}

	s.AddWorker(nil)
	done := getAs[apitype.Batch](t, s, alice, "/v1/batches/"+id+"?wait=30s", http.StatusOK)
	if !done.Done || done.Counts.Completed != 1 || done.Counts.Canceled != 1 || done.Counts.Failed != 1 {
		t.Fatalf("first run: %+v", done)
	}
	if err := s.StopWorkers(); err != nil {
		t.Fatal(err)
	}

	// c failed and b canceled: both re-open, with their IDs and
	// custom_ids; a second retry of c is answered as the first.
	for _, i := range []int{2, 2, 1} {
		tk, _ := retry(alice, item(i), http.StatusOK)
		if tk.ID != item(i) || tk.State != apitype.TaskStatePending || tk.CustomID == nil || *tk.CustomID != string(rune('a'+i)) || tk.Error != nil {
			t.Errorf("retry of item %d: %+v, want it pending with its ID and custom_id", i, tk)
		}
	}
	reopened := getAs[apitype.Batch](t, s, alice, "/v1/batches/"+id, http.StatusOK)
	if reopened.Done || reopened.Counts.Pending != 2 || reopened.Counts.Completed != 1 || reopened.Counts.Failed != 0 || reopened.Counts.Canceled != 0 {
		t.Errorf("after the retries: %+v, want 2 pending and 1 completed", reopened)
	}

	// What is not retried.
	if _, e := retry(alice, item(0), http.StatusConflict); !strings.Contains(e.Error.Message, "completed") {
		t.Errorf("retry of completed a: %+v", e.Error)
	}
	single := stacktest.Decode[apitype.Task](t, func() []byte {
		code, b, _ := s.DoAs(alice, "POST", "/v1/tasks", overBudget)
		if code != http.StatusAccepted {
			t.Fatalf("single: %d %s", code, b)
		}
		return b
	}())
	if _, e := retry(alice, single.ID, http.StatusConflict); !strings.Contains(e.Error.Message, "single task") {
		t.Errorf("retry of a single task: %+v", e.Error)
	}
	retry(bob, item(2), http.StatusNotFound)
	retry(alice, apitype.ItemID(id, 3), http.StatusNotFound)
	retry(alice, "nope", http.StatusNotFound)

	// They run again: b completes, c fails again at its budget.
	s.AddWorker(nil)
	again := getAs[apitype.Batch](t, s, alice, "/v1/batches/"+id+"?wait=30s", http.StatusOK)
	if !again.Done || again.Counts.Completed != 2 || again.Counts.Failed != 1 || again.Counts.Canceled != 0 {
		t.Errorf("after the rerun: %+v, want 2 completed and 1 failed", again)
	}
	if tk := getAs[apitype.Task](t, s, alice, "/v1/tasks/"+item(1), http.StatusOK); tk.State != apitype.TaskStateCompleted || tk.Result == nil {
		t.Errorf("b after its retry: %+v", tk)
	}
}
