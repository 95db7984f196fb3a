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
	// A repeat (a lost answer's retry) answers as the first did; to
	// another key the batch was never there.
	if code, _ := del(alice, id, "?purge=true"); code != http.StatusNoContent {
		t.Errorf("a second delete: %d, want 204", code)
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
