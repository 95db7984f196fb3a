package api_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// The list, retry and status routes on a real stack (API and a worker on
// a real Redis), with two API keys.

const overBudget = `{"kind":"sweep","puzzle":{"board":[".....",".....","....."]},"options":{"max_nodes":1}}`

func getAs[T any](t *testing.T, s *stacktest.Stack, key, path string, want int) T {
	t.Helper()
	code, b, _ := s.DoAs(key, "GET", path, nil)
	if code != want {
		t.Fatalf("GET %s: %d, want %d: %s", path, code, want, b)
	}
	return stacktest.Decode[T](t, b)
}

func TestListsRetryAndStatus(t *testing.T) {
	s := stacktest.StartWith(t, 1, map[string]string{"API_KEYS": "alice:alice-key-0123456789,bob:bob-key-0123456789ab", "KEY_PREFIX": "lists:"})
	ndjson := `{"custom_id":"ok","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}` + "\n" +
		`{"custom_id":"bad",` + overBudget[1:] + "\n"
	var ids []string
	for range 3 {
		code, b, _ := s.DoAs("alice-key-0123456789", "POST", "/v1/batches", ndjson, "Content-Type", "application/x-ndjson")
		if code != http.StatusAccepted {
			t.Fatalf("submit: %d %s", code, b)
		}
		ids = append(ids, stacktest.Decode[apitype.BatchCreated](t, b).ID)
	}
	code, b, _ := s.DoAs("bob-key-0123456789ab", "POST", "/v1/batches", ndjson, "Content-Type", "application/x-ndjson")
	if code != http.StatusAccepted {
		t.Fatalf("bob's submit: %d %s", code, b)
	}
	bobBatch := stacktest.Decode[apitype.BatchCreated](t, b).ID
	task := func(key string) string {
		code, b, _ := s.DoAs(key, "POST", "/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`)
		if code != http.StatusAccepted && code != http.StatusOK {
			t.Fatalf("submit task: %d %s", code, b)
		}
		return stacktest.Decode[apitype.Task](t, b).ID
	}
	aliceTask, _ := task("alice-key-0123456789"), task("bob-key-0123456789ab")
	for _, id := range ids {
		getAs[apitype.Batch](t, s, "alice-key-0123456789", "/v1/batches/"+id+"?wait=30s", 200)
	}

	t.Run("list batches", func(t *testing.T) {
		var got []string
		cursor := ""
		for range 10 {
			l := getAs[apitype.BatchList](t, s, "alice-key-0123456789", "/v1/batches?limit=2"+cursor, 200)
			for _, b := range l.Batches {
				got = append(got, b.ID)
				if b.State != apitype.TaskStateFailed || b.Counts.Failed != 1 || !b.Done || strings.Join(b.Kinds, ",") != "sliding,sweep" {
					t.Errorf("batch %+v, want failed with one failure, sliding and sweep", b)
				}
			}
			if l.NextCursor == nil {
				break
			}
			cursor = "&cursor=" + url.QueryEscape(*l.NextCursor)
		}
		if want := []string{ids[2], ids[1], ids[0]}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("alice lists %v, want %v (newest first, bob's not among them)", got, want)
		}
		if l := getAs[apitype.BatchList](t, s, "alice-key-0123456789", "/v1/batches?state=completed", 200); len(l.Batches) != 0 {
			t.Fatalf("state=completed lists %v", l.Batches)
		}
		if l := getAs[apitype.BatchList](t, s, "bob-key-0123456789ab", "/v1/batches?kind=sweep", 200); len(l.Batches) != 1 || l.Batches[0].ID != bobBatch {
			t.Fatalf("bob lists %+v", l.Batches)
		}
		after := time.Now().Add(time.Minute).UTC().Format(time.RFC3339)
		if l := getAs[apitype.BatchList](t, s, "alice-key-0123456789", "/v1/batches?created_after="+after, 200); len(l.Batches) != 0 {
			t.Fatalf("created_after a minute from now lists %v", l.Batches)
		}
	})

	t.Run("list tasks", func(t *testing.T) {
		l := getAs[apitype.TaskList](t, s, "alice-key-0123456789", "/v1/tasks?kind=sliding", 200)
		if len(l.Tasks) != 1 || l.Tasks[0].ID != aliceTask || l.NextCursor != nil {
			t.Fatalf("alice's tasks: %+v", l)
		}
		if l := getAs[apitype.TaskList](t, s, "alice-key-0123456789", "/v1/tasks?kind=fill", 200); len(l.Tasks) != 0 {
			t.Fatalf("kind=fill lists %+v", l.Tasks)
		}
	})

	t.Run("items", func(t *testing.T) {
		l := getAs[apitype.TaskList](t, s, "alice-key-0123456789", "/v1/batches/"+ids[0]+"/items?state=failed", 200)
		if len(l.Tasks) != 1 || l.Tasks[0].ID != ids[0]+"-1" || l.Tasks[0].CustomID == nil || *l.Tasks[0].CustomID != "bad" ||
			l.Tasks[0].Error == nil || l.Tasks[0].Error.Code != apitype.CodeBudgetExceeded || l.NextCursor != nil {
			t.Fatalf("failed items: %+v", l)
		}
		l = getAs[apitype.TaskList](t, s, "alice-key-0123456789", "/v1/batches/"+ids[0]+"/items?limit=1", 200)
		if len(l.Tasks) != 1 || l.Tasks[0].Result == nil || l.NextCursor == nil || *l.NextCursor != "1" {
			t.Fatalf("first page of items: %+v", l)
		}
		getAs[apitype.ErrorBody](t, s, "bob-key-0123456789ab", "/v1/batches/"+ids[0]+"/items", 404)
	})

	t.Run("bad query", func(t *testing.T) {
		for _, c := range []struct{ path, field string }{
			{"/v1/batches?stat=failed", "stat"},
			{"/v1/batches?state=done", "state"},
			{"/v1/batches?kind=chess", "kind"},
			{"/v1/batches?created_after=yesterday", "created_after"},
			{"/v1/batches?cursor=zzz", "cursor"},
			{"/v1/batches?limit=1001", "limit"},
			{"/v1/tasks?sate=failed", "sate"},
			{"/v1/batches/" + ids[0] + "/items?state=failed&x=1", "x"},
			{"/v1/batches/" + ids[0] + "?wiat=1s", "wiat"},
			{"/v1/tasks/" + aliceTask + "?wait=1s&foo=bar", "foo"},
			{"/v1/status?verbose=1", "verbose"},
			{"/healthz?x=1", "x"},
		} {
			e := getAs[apitype.ErrorBody](t, s, "alice-key-0123456789", c.path, 400)
			if e.Error.Code != apitype.CodeInvalidRequest || e.Error.Field != c.field {
				t.Errorf("GET %s: %+v, want invalid_request on field %q", c.path, e.Error, c.field)
			}
		}
		code, b, _ := s.DoAs("alice-key-0123456789", "DELETE", "/v1/batches/"+ids[0]+"?force=1", nil)
		if code != 400 || !strings.Contains(string(b), `"field":"force"`) {
			t.Errorf("DELETE with ?force=1: %d %s", code, b)
		}
	})

	t.Run("retry", func(t *testing.T) {
		code, b, _ := s.DoAs("bob-key-0123456789ab", "POST", "/v1/batches/"+ids[0]+"/retry", nil)
		if code != 404 {
			t.Fatalf("bob retries alice's batch: %d %s", code, b)
		}
		code, b, _ = s.DoAs("alice-key-0123456789", "POST", "/v1/batches/"+ids[0]+"/retry", nil)
		if code != 200 {
			t.Fatalf("retry: %d %s", code, b)
		}
		if r := stacktest.Decode[apitype.BatchRetried](t, b); r.Retried != 1 || r.ID != ids[0] {
			t.Fatalf("retry answered %+v", r)
		}
		// It runs again (and fails again, as it must), counted once.
		bt := getAs[apitype.Batch](t, s, "alice-key-0123456789", "/v1/batches/"+ids[0]+"?wait=30s", 200)
		if !bt.Done || bt.Counts.Failed != 1 || bt.Counts.Completed != 1 || bt.Counts.Pending+bt.Counts.Active != 0 {
			t.Fatalf("after the retry: %+v", bt)
		}
		it := getAs[apitype.Task](t, s, "alice-key-0123456789", "/v1/tasks/"+ids[0]+"-1", 200)
		if it.State != apitype.TaskStateFailed || it.CustomID == nil || *it.CustomID != "bad" || it.Attempts != 1 {
			t.Fatalf("the retried item: %+v", it)
		}
		if st := getAs[apitype.ServiceStatus](t, s, "alice-key-0123456789", "/v1/status", 200); st.WorkersAlive != 1 || st.Slots < 1 || len(st.Queues) != 4 {
			t.Fatalf("status: %+v", st)
		}
	})

	t.Run("retry while another runs", func(t *testing.T) {
		// As a retry running on another replica holds it (store.RetryBatch).
		lock := "lists:batch:" + ids[1] + ":retry"
		if err := s.RDB.Set(t.Context(), lock, "another", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		code, b, _ := s.DoAs("alice-key-0123456789", "POST", "/v1/batches/"+ids[1]+"/retry", nil)
		if e := stacktest.Decode[apitype.ErrorBody](t, b); code != http.StatusConflict || e.Error.Code != apitype.CodeConflict {
			t.Fatalf("retry while another runs: %d %s, want 409 conflict", code, b)
		}
		s.RDB.Del(t.Context(), lock)
		code, b, _ = s.DoAs("alice-key-0123456789", "POST", "/v1/batches/"+ids[1]+"/retry", nil)
		if r := stacktest.Decode[apitype.BatchRetried](t, b); code != 200 || r.Retried != 1 {
			t.Fatalf("retry once the other ended: %d %s", code, b)
		}
		getAs[apitype.Batch](t, s, "alice-key-0123456789", "/v1/batches/"+ids[1]+"?wait=30s", 200)
		if n := s.RDB.Exists(t.Context(), lock).Val(); n != 0 {
			t.Errorf("a retry that answered left its lock")
		}
	})

	t.Run("status without workers", func(t *testing.T) {
		if err := s.StopWorkers(); err != nil {
			t.Fatal(err)
		}
		st := getAs[apitype.ServiceStatus](t, s, "alice-key-0123456789", "/v1/status", 200)
		if st.WorkersAlive != 0 || len(st.Workers) != 0 {
			t.Fatalf("status after the workers stopped: %+v", st)
		}
		code, b, _ := s.DoAs("alice-key-0123456789", "POST", "/v1/batches", `{"tasks":[`+overBudget+`]}`)
		if code != 202 {
			t.Fatalf("submit: %d %s", code, b)
		}
		id := stacktest.Decode[apitype.BatchCreated](t, b).ID
		code, b, _ = s.DoAs("alice-key-0123456789", "POST", "/v1/batches/"+id+"/retry", nil)
		if r := stacktest.Decode[apitype.BatchRetried](t, b); code != 200 || r.Retried != 0 {
			t.Fatalf("retry of a batch still pending: %d %s, want 200 and nothing retried", code, b)
		}
		time.Sleep(1100 * time.Millisecond)
		st = getAs[apitype.ServiceStatus](t, s, "alice-key-0123456789", "/v1/status", 200)
		if st.OldestPendingSeconds < 1 {
			t.Fatalf("work waits a second with no worker, but oldest_pending_seconds is %v: %+v", st.OldestPendingSeconds, st)
		}

		// A worker shutting down, as its beat says: listed, draining,
		// and left out of the totals, since it takes nothing new.
		st2 := store.New(s.RDB, store.Options{Prefix: "lists:", TaskTTL: time.Hour, ResultTTL: time.Hour})
		p := worker.Presence{Slots: 3, Started: time.Now().UnixMilli(), Running: map[string]int{tasks.TypeUnit: 1}, Draining: true}
		if err := st2.Beat(t.Context(), "w-0123456789ab", time.Now().UnixMilli(), nil, nil, time.Minute, p, time.Minute); err != nil {
			t.Fatal(err)
		}
		st = getAs[apitype.ServiceStatus](t, s, "alice-key-0123456789", "/v1/status", 200)
		if st.WorkersAlive != 0 || st.Slots != 0 || st.Busy != 0 || len(st.Workers) != 1 ||
			!st.Workers[0].Draining || st.Workers[0].Busy != 1 || st.Workers[0].Slots != 3 {
			t.Fatalf("status with a draining worker: %+v, want it listed as draining with its task, and out of the totals", st)
		}
	})
}

// A page of a batch's items ends early, with a cursor, once its results
// pass 8 MiB (pageResultBytes), on GET /v1/batches/{id} and on /items,
// and paging on reads every item once: six 300x300 fills of about 1.6 MB
// of result each come as pages of 5 and 1. Before, a page held every
// result it listed, and one of eight 1000x1000 fills was 156 MB.
func TestItemsPageBoundedByResultBytes(t *testing.T) {
	s := stacktest.StartWith(t, 1, nil)
	const n = 300
	row := "[" + strings.TrimSuffix(strings.Repeat("0,", n), ",") + "]"
	full := "[" + strings.TrimSuffix(strings.Repeat(strings.ReplaceAll(row, "0", "1")+",", n), ",") + "]"
	empty := "[" + strings.TrimSuffix(strings.Repeat(row+",", n), ",") + "]"
	item := `{"kind":"fill","puzzle":{"game_board":` + empty + `,"table":` + full + `}}`
	code, b, _ := s.DoH("POST", "/v1/batches", strings.Repeat(item+"\n", 6), "Content-Type", "application/x-ndjson")
	if code != http.StatusAccepted {
		t.Fatalf("submit: %d %.300s", code, b)
	}
	id := stacktest.Decode[apitype.BatchCreated](t, b).ID
	if bt := getAs[apitype.Batch](t, s, "", "/v1/batches/"+id+"?wait=60s&limit=1", 200); bt.Counts.Completed != 6 {
		t.Fatalf("not all completed: %+v", bt.Counts)
	}
	for _, route := range []string{"/v1/batches/" + id + "?limit=1000", "/v1/batches/" + id + "/items?limit=1000"} {
		var sizes []int
		seen := map[string]bool{}
		path := route
		for range 10 {
			code, b, _ := s.DoH("GET", path, nil)
			if code != 200 {
				t.Fatalf("GET %s: %d %.200s", path, code, b)
			}
			if len(b) > 12<<20 {
				t.Errorf("GET %s: %d bytes, want a page of about 8 MiB at most", path, len(b))
			}
			page := stacktest.Decode[struct {
				Tasks      []apitype.Task `json:"tasks"`
				NextCursor *string        `json:"next_cursor"`
			}](t, b)
			sizes = append(sizes, len(page.Tasks))
			for _, tk := range page.Tasks {
				if seen[tk.ID] || len(tk.Result) < 1<<20 {
					t.Errorf("%s: item %s twice or without its result (%d bytes)", route, tk.ID, len(tk.Result))
				}
				seen[tk.ID] = true
			}
			if page.NextCursor == nil {
				break
			}
			path = route + "&cursor=" + *page.NextCursor
		}
		if fmt.Sprint(sizes) != "[5 1]" || len(seen) != 6 {
			t.Errorf("%s: pages of %v, %d items; want pages of [5 1], 6 items", route, sizes, len(seen))
		}
	}
}
