package api_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// DELETE /v1/batches/{id}?purge=true on a real stack: an ended batch and
// every key of it go, and it reads as not found; a batch with items that
// have not ended, or that a retry is re-opening, is refused with 409 and
// left whole; another key's batch is not found; a bad purge value is a
// 400 naming the parameter; DELETE without purge still cancels.
func TestDeleteBatch(t *testing.T) {
	const alice, bob = "alice-key-0123456789", "bob-key-0123456789ab"
	s := stacktest.StartWith(t, 1, map[string]string{"API_KEYS": "alice:" + alice + ",bob:" + bob,
		"KEY_PREFIX": "delete:", "CHUNK_SIZE": "2"})
	var lines []string
	for i := range 5 {
		lines = append(lines, fmt.Sprintf(`{"custom_id":"c%d","kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`, i))
	}
	lines = append(lines, `{"custom_id":"bad",`+overBudget[1:])
	submit := func() string {
		t.Helper()
		code, b, _ := s.DoAs(alice, "POST", "/v1/batches", strings.Join(lines, "\n")+"\n", "Content-Type", "application/x-ndjson")
		if code != http.StatusAccepted {
			t.Fatalf("submit: %d %s", code, b)
		}
		return stacktest.Decode[apitype.BatchCreated](t, b).ID
	}
	del := func(key, id, query string) (int, apitype.ErrorBody) {
		t.Helper()
		code, b, _ := s.DoAs(key, "DELETE", "/v1/batches/"+id+query, nil)
		var e apitype.ErrorBody
		if code != http.StatusNoContent {
			e = stacktest.Decode[apitype.ErrorBody](t, b)
		} else if len(b) != 0 {
			t.Errorf("204 with a body: %s", b)
		}
		return code, e
	}
	keep := submit()
	id := submit()
	for _, b := range []string{keep, id} {
		if bt := getAs[apitype.Batch](t, s, alice, "/v1/batches/"+b+"?wait=30s", 200); !bt.Done || bt.Counts.Completed != 5 || bt.Counts.Failed != 1 {
			t.Fatalf("batch %s: %+v", b, bt)
		}
	}
	if n := s.Keys("delete:*" + id + "*"); n < 3 {
		t.Fatalf("the batch has %d keys before the delete; the check below would prove nothing", n)
	}
	keepKeys := s.Keys("delete:*" + keep + "*")
	// The results' chunks go after the record; any that a failure leaves
	// behind must expire on their own.
	chunks, _ := s.RDB.Keys(t.Context(), "delete:batch:"+id+":res:*").Result()
	if len(chunks) != 3 {
		t.Fatalf("result chunks %v, want 3 (6 items, 2 a chunk)", chunks)
	}
	for _, k := range chunks {
		if ttl := s.RDB.PTTL(t.Context(), k).Val(); ttl <= 0 {
			t.Errorf("result chunk %s has no expiry (%v): one a delete left behind would stay", k, ttl)
		}
	}

	if code, e := del(alice, id, "?purge=yes"); code != http.StatusBadRequest || e.Error.Field != "purge" || e.Error.Code != apitype.CodeInvalidRequest {
		t.Fatalf("purge=yes: %d %+v, want 400 naming purge", code, e)
	}
	if code, _ := del(bob, id, "?purge=true"); code != http.StatusNotFound {
		t.Fatalf("another key's delete: %d, want 404", code)
	}
	// A retry re-opening it (its lock held, as by another replica) holds
	// the delete off.
	lock := "delete:batch:" + id + ":retry"
	if err := s.RDB.Set(t.Context(), lock, "another", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if code, e := del(alice, id, "?purge=true"); code != http.StatusConflict || e.Error.Code != apitype.CodeConflict {
		t.Fatalf("delete while a retry runs: %d %+v, want 409", code, e)
	}
	s.RDB.Del(t.Context(), lock)
	getAs[apitype.Batch](t, s, alice, "/v1/batches/"+id, 200)

	if code, e := del(alice, id, "?purge=true"); code != http.StatusNoContent {
		t.Fatalf("delete: %d %+v, want 204", code, e)
	}
	// What is left is its tombstone, which expires when the batch would
	// have.
	if left, _ := s.RDB.Keys(t.Context(), "delete:*"+id+"*").Result(); len(left) != 1 || left[0] != "delete:batch:"+id+":deleted" {
		t.Errorf("keys of the deleted batch left: %v, want its tombstone alone", left)
	}
	if ttl := s.RDB.PTTL(t.Context(), "delete:batch:"+id+":deleted").Val(); ttl <= 0 {
		t.Errorf("the tombstone's TTL is %v, want the batch's expiry", ttl)
	}
	if n := s.Keys("delete:*" + keep + "*"); n != keepKeys {
		t.Errorf("the other batch has %d keys after the delete, %d before", n, keepKeys)
	}
	for _, path := range []string{"/v1/batches/" + id, "/v1/batches/" + id + "/items", "/v1/tasks/" + apitype.ItemID(id, 0)} {
		if code, b, _ := s.DoAs(alice, "GET", path, nil); code != http.StatusNotFound {
			t.Errorf("GET %s after the delete: %d %s, want 404", path, code, b)
		}
	}
	list := getAs[apitype.BatchList](t, s, alice, "/v1/batches", 200)
	if len(list.Batches) != 1 || list.Batches[0].ID != keep {
		t.Errorf("the batch list after the delete: %+v, want %s alone", list.Batches, keep)
	}
	// A repeat (a lost answer's retry) answers as the first did, and
	// unlinks any result chunk a first call cut short left (its answer
	// lost while Redis was frozen, say: it gave up before its unlinks);
	// to another key the batch was never there.
	left := "delete:batch:" + id + ":res:2"
	if err := s.RDB.Set(t.Context(), left, "as a cut-short delete leaves it", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if code, _ := del(alice, id, "?purge=true"); code != http.StatusNoContent {
		t.Errorf("a second delete: %d, want 204", code)
	}
	if n := s.RDB.Exists(t.Context(), left).Val(); n != 0 {
		t.Errorf("the repeated delete left the result chunk %s", left)
	}
	if code, _ := del(bob, id, "?purge=true"); code != http.StatusNotFound {
		t.Errorf("another key's delete of the deleted batch: %d, want 404", code)
	}
	if code, _ := del(alice, id, ""); code != http.StatusNotFound {
		t.Errorf("a cancel of the deleted batch: %d, want 404", code)
	}
	if bt := getAs[apitype.Batch](t, s, alice, "/v1/batches/"+keep, 200); bt.Counts.Completed != 5 {
		t.Errorf("the other batch after the delete: %+v", bt)
	}

	// With no worker, a batch's items do not end: the delete is refused
	// and the batch is whole; a cancel ends them, and the delete then
	// goes through.
	if err := s.StopWorkers(); err != nil {
		t.Fatal(err)
	}
	open := submit()
	if code, e := del(alice, open, "?purge=true"); code != http.StatusConflict || e.Error.Field != "purge" {
		t.Fatalf("delete of a batch still pending: %d %+v, want 409 naming purge", code, e)
	}
	if bt := getAs[apitype.Batch](t, s, alice, "/v1/batches/"+open, 200); bt.Counts.Pending != len(lines) {
		t.Fatalf("the refused delete touched the batch: %+v", bt)
	}
	if code, b, _ := s.DoAs(alice, "DELETE", "/v1/batches/"+open, nil); code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, b)
	}
	if bt := getAs[apitype.Batch](t, s, alice, "/v1/batches/"+open+"?wait=10s", 200); !bt.Done || bt.Counts.Canceled != len(lines) {
		t.Fatalf("after the cancel: %+v", bt)
	}
	if code, e := del(alice, open, "?purge=1"); code != http.StatusNoContent {
		t.Fatalf("delete of the canceled batch: %d %+v", code, e)
	}
	// Its units are still queued in asynq (no worker took them): a
	// worker that takes them finds the batch gone, as it would an
	// expired one, and writes nothing of it back.
	if n := s.Running("bulk") + s.Running("cheap-bulk"); n == 0 {
		t.Fatal("none of the deleted batch's units is queued: the check below would prove nothing")
	}
	s.AddWorker(nil)
	deadline := time.Now().Add(20 * time.Second)
	for s.Running("bulk")+s.Running("cheap-bulk") > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the deleted batch's units still queued: bulk %d, cheap-bulk %d", s.Running("bulk"), s.Running("cheap-bulk"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if left, _ := s.RDB.Keys(t.Context(), "delete:*"+open+"*").Result(); len(left) != 1 || left[0] != "delete:batch:"+open+":deleted" {
		t.Errorf("keys of the deleted canceled batch left once its units ran: %v, want its tombstone alone", left)
	}
}

// DELETE /v1/tasks/{id}?purge=true on a real stack: an ended single task's
// record goes (its tombstone stays until the record would have expired)
// and it reads as not found, while the result it cached still answers
// the same puzzle; a task that has not ended is refused with 409; a
// repeat answers 204, another key 404; a batch item is deleted with its
// batch (400 naming purge).
func TestDeleteTask(t *testing.T) {
	const alice, bob = "alice-key-0123456789", "bob-key-0123456789ab"
	s := stacktest.StartWith(t, 1, map[string]string{"API_KEYS": "alice:" + alice + ",bob:" + bob, "KEY_PREFIX": "deltask:"})
	const req = `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`
	code, b, _ := s.DoAs(alice, "POST", "/v1/tasks?wait=10s", req)
	if code != http.StatusOK {
		t.Fatalf("solve: %d %s", code, b)
	}
	id := stacktest.Decode[apitype.Task](t, b).ID
	del := func(key, id, query string) int {
		t.Helper()
		code, b, _ := s.DoAs(key, "DELETE", "/v1/tasks/"+id+query, nil)
		if code == http.StatusNoContent && len(b) != 0 {
			t.Errorf("204 with a body: %s", b)
		}
		return code
	}
	if code := del(bob, id, "?purge=true"); code != http.StatusNotFound {
		t.Fatalf("another key's delete: %d, want 404", code)
	}
	if code := del(alice, id, "?purge=true"); code != http.StatusNoContent {
		t.Fatalf("delete: %d, want 204", code)
	}
	if left, _ := s.RDB.Keys(t.Context(), "deltask:task:"+id+"*").Result(); len(left) != 1 || left[0] != "deltask:task:"+id+":deleted" {
		t.Errorf("keys of the deleted task left: %v, want its tombstone alone", left)
	}
	if ttl := s.RDB.PTTL(t.Context(), "deltask:task:"+id+":deleted").Val(); ttl <= 0 {
		t.Errorf("the tombstone's TTL is %v, want the record's", ttl)
	}
	if code, b, _ := s.DoAs(alice, "GET", "/v1/tasks/"+id, nil); code != http.StatusNotFound {
		t.Errorf("GET after the delete: %d %s, want 404", code, b)
	}
	if list := getAs[apitype.TaskList](t, s, alice, "/v1/tasks", 200); len(list.Tasks) != 0 {
		t.Errorf("the task list after the delete: %+v", list.Tasks)
	}
	if code := del(alice, id, "?purge=true"); code != http.StatusNoContent {
		t.Errorf("a repeated delete: %d, want 204", code)
	}
	if code := del(bob, id, "?purge=true"); code != http.StatusNotFound {
		t.Errorf("another key's delete of the deleted task: %d, want 404", code)
	}
	// The cache is the puzzle's, not the task's: the same request is a
	// hit, under a new ID.
	code, b, _ = s.DoAs(alice, "POST", "/v1/tasks", req)
	if again := stacktest.Decode[apitype.Task](t, b); code != http.StatusOK || !again.Cached || again.ID == id {
		t.Errorf("the same puzzle after the delete: %d %s, want a cache hit under a new ID", code, b)
	}

	// Not ended: refused, and whole; canceled, it goes.
	if err := s.StopWorkers(); err != nil {
		t.Fatal(err)
	}
	code, b, _ = s.DoAs(alice, "POST", "/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[0,7,8]]}}`)
	if code != http.StatusAccepted {
		t.Fatalf("submit: %d %s", code, b)
	}
	open := stacktest.Decode[apitype.Task](t, b).ID
	code, b, _ = s.DoAs(alice, "DELETE", "/v1/tasks/"+open+"?purge=true", nil)
	if e := stacktest.Decode[apitype.ErrorBody](t, b); code != http.StatusConflict || e.Error.Field != "purge" {
		t.Fatalf("delete of a pending task: %d %s, want 409 naming purge", code, b)
	}
	if tk := getAs[apitype.Task](t, s, alice, "/v1/tasks/"+open, 200); tk.State != apitype.TaskStatePending {
		t.Fatalf("the refused delete touched the task: %+v", tk)
	}
	if code, b, _ := s.DoAs(alice, "DELETE", "/v1/tasks/"+open, nil); code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, b)
	}
	if code := del(alice, open, "?purge=1"); code != http.StatusNoContent {
		t.Fatalf("delete of the canceled task: %d", code)
	}
	if code, _, _ := s.DoAs(alice, "GET", "/v1/tasks/"+open, nil); code != http.StatusNotFound {
		t.Errorf("GET of the deleted canceled task: %d, want 404", code)
	}

	code, b, _ = s.DoAs(alice, "DELETE", "/v1/tasks/"+apitype.ItemID(open, 3)+"?purge=true", nil)
	if e := stacktest.Decode[apitype.ErrorBody](t, b); code != http.StatusBadRequest || e.Error.Field != "purge" || !strings.Contains(e.Error.Message, "/v1/batches/") {
		t.Errorf("delete of a batch item: %d %s, want 400 pointing at its batch", code, b)
	}
}
