package api_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestOpenAPIBatchReads holds the answers about a batch's items (an
// item's GET and DELETE, a page of the batch, /results in every state) to
// the document. The batch is staged and run through the store, as the
// ingest path and a worker do, so the check needs neither.
func TestOpenAPIBatchReads(t *testing.T) {
	t.Parallel()
	doc := loadDoc(t)
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	st := store.New(rdb, store.Options{Prefix: "oar:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	o := api.OptionsForTest()
	o.MaxBatchItems, o.ChunkSize = 100, 2
	srv := api.New(st, store.NewHub(), prometheus.NewRegistry(), nil, o)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)

	ctx := context.Background()
	const id = "0123456789abcdef0123456789abcdef"
	w := st.NewBatchWriter(id, 2)
	for i, board := range []string{`[[1,0,3],[4,2,5],[7,8,6]]`, `[[1,2,3],[4,5,6],[7,0,8]]`, `[[1,2,3],[4,5,6],[0,7,8]]`, `[[1,2,3],[4,5,6],[7,8,0]]`} {
		p, err := puzzle.Decode([]byte(`{"kind":"sliding","puzzle":{"board":` + board + `}}`))
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Add(ctx, store.StagedItem{CustomID: []string{"a", "", "c", ""}[i], Kind: p.Kind(), Request: p.Payload(), Timeout: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.CommitBatch(ctx, w, store.CommitBatch{ID: id}); err != nil {
		t.Fatal(err)
	}
	ref := tasks.UnitRef{BatchID: id, Unit: tasks.ChunkUnit(0), Timeout: time.Minute}
	if _, err := st.StartUnit(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishUnit(ctx, ref, "", []worker.ItemOutcome{
		{Index: 0, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":3,"solvable":true,"path":"DRD"}`)},
		{Index: 1, State: apitype.TaskStateFailed, Code: apitype.CodeTimeout, Msg: "the solve passed its deadline"},
	}); err != nil {
		t.Fatal(err)
	}

	c := newClient(t, doc, strings.TrimPrefix(hs.URL, "http://"))
	item := c.do(call{method: "GET", path: "/v1/tasks/" + apitype.ItemID(id, 0), want: 200}).json(t)
	wantEqual(t, "custom_id", item["custom_id"], "a")
	wantEqual(t, "batch_id", item["batch_id"], id)
	c.do(call{method: "GET", path: "/v1/tasks/" + apitype.ItemID(id, 2) + "?wait=100ms", want: 200})
	c.do(call{method: "DELETE", path: "/v1/tasks/" + apitype.ItemID(id, 3), want: 200})
	c.do(call{method: "DELETE", path: "/v1/tasks/" + apitype.ItemID(id, 3), want: 200}) // a retry
	wantError(t, c.do(call{method: "DELETE", path: "/v1/tasks/" + apitype.ItemID(id, 0), want: 409}), "conflict", "")
	wantError(t, c.do(call{method: "GET", path: "/v1/tasks/" + apitype.ItemID(id, 4), want: 404}), "not_found", "")
	c.do(call{method: "GET", path: "/v1/batches/" + id + "?limit=3", want: 200})

	// Every state at once: completed, failed, pending, canceled.
	r := c.do(call{method: "GET", path: "/v1/batches/" + id + "/results", want: 200})
	if n := strings.Count(string(r.body), "\n"); n != 4 {
		t.Errorf("results: %d lines, want 4:\n%s", n, r.body)
	}
	for _, st := range []string{"completed", "failed", "pending", "canceled"} {
		r := c.do(call{method: "GET", path: "/v1/batches/" + id + "/results?state=" + st, want: 200})
		if n := strings.Count(string(r.body), "\n"); n != 1 || !strings.Contains(string(r.body), `"state":"`+st+`"`) {
			t.Errorf("results?state=%s:\n%s", st, r.body)
		}
	}
	wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + id + "/results?state=done", want: 400, req: reqInvalid}), "invalid_request", "state")
	wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + id + "/results?limit=1", want: 400}), "invalid_request", "limit")
}
