package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/puzzleq/puzzleq/client"
)

// fakeAPI stands in for a puzzleq server so the examples run; point New
// at your own server instead.
func fakeAPI() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/tasks":
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, `{"id":"5c0d8f0e2b6a4e7f9a1b3c5d7e9f0a1b","kind":"sliding","state":"pending"}`)
		case r.Method == "GET" && r.URL.Path == "/v1/tasks/5c0d8f0e2b6a4e7f9a1b3c5d7e9f0a1b":
			io.WriteString(w, `{"id":"5c0d8f0e2b6a4e7f9a1b3c5d7e9f0a1b","kind":"sliding","state":"completed","result":{"moves":3,"solvable":true,"path":"DRD"}}`)
		case r.Method == "POST" && r.URL.Path == "/v1/batches" && r.Header.Get("Content-Type") == client.NDJSONContentType:
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, `{"id":"9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f","total":2,"task_ids":["9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f-0","9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f-1"]}`)
		case r.URL.Path == "/v1/batches/9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f/results":
			io.WriteString(w, `{"index":0,"id":"9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f-0","custom_id":"easy","state":"completed","result":{"moves":3,"solvable":true,"path":"DRD"}}`+"\n")
			io.WriteString(w, `{"index":1,"id":"9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f-1","custom_id":null,"state":"failed","error":{"code":"budget_exceeded","message":"search exceeded max_nodes"}}`+"\n")
		case r.Method == "POST" && r.URL.Path == "/v1/batches":
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, `{"id":"9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f","total":2,"task_ids":["a1","a2"]}`)
		case r.URL.Path == "/v1/batches/9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f":
			io.WriteString(w, `{"id":"9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f","total":2,"counts":{"pending":0,"active":0,"completed":2,"failed":0,"canceled":0},"done":true,"tasks":[],"next_cursor":null}`)
		case r.Method == "GET" && r.URL.Path == "/v1/batches":
			io.WriteString(w, `{"batches":[{"id":"9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f","state":"failed","total":2,"counts":{"pending":0,"active":0,"completed":1,"failed":1,"canceled":0},"done":true,"kinds":["sliding","sweep"],"format":null,"created_at":"2026-11-30T09:00:00Z","done_at":"2026-11-30T09:00:01Z"}],"next_cursor":null}`)
		case r.URL.Path == "/v1/batches/9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f/items":
			io.WriteString(w, `{"tasks":[{"id":"9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f-1","custom_id":"hard","kind":"sweep","state":"failed","error":{"code":"budget_exceeded","message":"search exceeded max_nodes"}}],"next_cursor":null}`)
		case r.URL.Path == "/v1/batches/9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f/retry":
			io.WriteString(w, `{"id":"9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f","retried":1,"complete":true}`)
		case r.URL.Path == "/v1/status":
			io.WriteString(w, `{"workers_alive":0,"slots":0,"busy":0,"workers":[],"queues":[],"backlog_units":0,"oldest_pending_seconds":12.5}`)
		case r.URL.Path == "/v1/batches/9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f/output":
			io.WriteString(w, "{\"moves\":3,\"solvable\":true,\"path\":\"DRD\"}\n{\"moves\":-1,\"solvable\":false,\"path\":\"\"}\n")
		default:
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"code":"not_found","message":"no such task or batch"}}`)
		}
	}))
}

// Submit one puzzle and long-poll until it is solved.
func ExampleClient_Submit() {
	srv := fakeAPI() // e.g. "http://localhost:8080"
	defer srv.Close()
	c := client.New(srv.URL, client.WithAPIKey(os.Getenv("PUZZLEQ_API_KEY")))
	ctx := context.Background()

	t, err := c.Submit(ctx, []byte(`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`))
	if err != nil {
		log.Fatal(err)
	}
	for !t.Terminal() {
		if t, err = c.Get(ctx, t.ID, 30*time.Second); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(t.State, string(t.Result))
	// Output: completed {"moves":3,"solvable":true,"path":"DRD"}
}

// Solve one puzzle: one request that waits for the answer (POST
// /v1/tasks?wait=), long polling on should the wait run out first.
func ExampleClient_Solve() {
	srv := fakeAPI() // e.g. "http://localhost:8080"
	defer srv.Close()
	c := client.New(srv.URL, client.WithAPIKey(os.Getenv("PUZZLEQ_API_KEY")))

	t, err := c.Solve(context.Background(), []byte(`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`), 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.State, string(t.Result))
	// Output: completed {"moves":3,"solvable":true,"path":"DRD"}
}

// Submit a batch with an idempotency key, wait for it, read its results.
func ExampleClient_SubmitBatch() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL)
	ctx := context.Background()

	reqs := []json.RawMessage{
		json.RawMessage(`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`),
		json.RawMessage(`{"kind":"sliding","puzzle":{"board":[[3,6,0],[8,1,2],[7,4,5]]}}`),
	}
	// The same key and body, sent again (by a retry or a later run),
	// answers this batch instead of creating another.
	sub, err := c.SubmitBatch(ctx, reqs, "nightly-2026-11-30-part-0")
	if err != nil {
		log.Fatal(err)
	}
	b, err := c.GetBatch(ctx, sub.ID, "", 1, 30*time.Second)
	for err == nil && !b.Done {
		b, err = c.GetBatch(ctx, sub.ID, "", 1, 30*time.Second)
	}
	if err != nil {
		log.Fatal(err)
	}
	out, err := c.BatchOutput(ctx, sub.ID, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(b.Counts.Completed, "of", b.Total, "completed")
	fmt.Print(string(out))
	// Output:
	// 2 of 2 completed
	// {"moves":3,"solvable":true,"path":"DRD"}
	// {"moves":-1,"solvable":false,"path":""}
}

// Submit a file of NDJSON requests as one batch, streamed from disk (a
// retry reads the file again), then stream its results in submission
// order once every item has ended.
func ExampleClient_SubmitNDJSON() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL)
	ctx := context.Background()

	f, err := os.CreateTemp("", "batch-*.ndjson")
	if err != nil {
		log.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	io.WriteString(f, `{"custom_id":"easy","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`+"\n"+
		`{"kind":"sliding","puzzle":{"board":[[8,6,7],[2,5,4],[3,0,1]]},"options":{"max_nodes":10}}`+"\n")
	st, err := f.Stat()
	if err != nil {
		log.Fatal(err)
	}
	sub, err := c.SubmitNDJSON(ctx, client.ReaderAtBody(f, st.Size()), "nightly-2026-11-30")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sub.Total, "items, the second is", sub.ItemID(1))
	// Output: 2 items, the second is 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f-1
}

// Name a completion webhook on a submission: once the batch has ended the
// server POSTs a signed batch.done event to the URL, so nothing has to
// poll for it. A URL the server refuses is a 400 *Error with Field
// "webhook".
func ExampleWithWebhook() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL)

	lines := `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}` + "\n" +
		`{"kind":"sliding","puzzle":{"board":[[3,6,0],[8,1,2],[7,4,5]]}}` + "\n"
	sub, err := c.SubmitNDJSON(context.Background(), client.BytesBody([]byte(lines)), "",
		client.WithWebhook("https://hooks.example.com/puzzleq"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sub.Total, "items; the webhook hears when they have all ended")
	// Output: 2 items; the webhook hears when they have all ended
}

// Stream a batch's results: one line per item in submission order,
// decoded as it arrives. Wait holds the request until the batch is done
// (at most the server's MAX_WAIT); loop while some item has not ended.
func ExampleClient_Results() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL)
	ctx := context.Background()

	for line, err := range c.Results(ctx, "9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f", client.ResultsOptions{Wait: 30 * time.Second}) {
		if err != nil {
			log.Fatal(err)
		}
		name := "-"
		if line.CustomID != nil {
			name = *line.CustomID
		}
		switch line.State {
		case client.StateCompleted:
			fmt.Println(line.Index, name, string(line.Result))
		case client.StateFailed, client.StateCanceled:
			fmt.Println(line.Index, name, line.State, line.Error.Code)
		default:
			fmt.Println(line.Index, name, "not ended yet:", line.State)
		}
	}
	// Output:
	// 0 easy {"moves":3,"solvable":true,"path":"DRD"}
	// 1 - failed budget_exceeded
}

// API errors carry the HTTP status, code and field; network failures
// match ErrUnreachable.
func ExampleError() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL)

	_, err := c.Get(context.Background(), "00000000000000000000000000000000", 0)
	var apiErr *client.Error
	switch {
	case errors.As(err, &apiErr):
		fmt.Println(apiErr.StatusCode, apiErr.Code)
	case errors.Is(err, client.ErrUnreachable):
		fmt.Println("server down")
	}
	// Output: 404 not_found
}

// List the batches that failed, newest first, page after page, and
// retry their failed tasks.
func ExampleClient_ListBatches() {
	srv := fakeAPI()
	defer srv.Close()
	c := client.New(srv.URL)
	ctx := context.Background()

	o := client.ListOptions{State: client.StateFailed}
	for {
		page, err := c.ListBatches(ctx, o)
		if err != nil {
			log.Fatal(err)
		}
		for _, b := range page.Batches {
			fmt.Printf("%s: %d of %d failed\n", b.ID, b.Counts.Failed, b.Total)
			items, err := c.BatchItems(ctx, b.ID, client.ListOptions{State: client.StateFailed})
			if err != nil {
				log.Fatal(err)
			}
			for _, t := range items.Tasks {
				fmt.Printf("  %s (%s): %s\n", t.ID, *t.CustomID, t.Error.Code)
			}
			n, err := c.RetryBatch(ctx, b.ID)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Printf("  retried %d\n", n)
		}
		if page.NextCursor == nil {
			break
		}
		o.Cursor = *page.NextCursor
	}
	// Output:
	// 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f: 1 of 2 failed
	//   9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f-1 (hard): budget_exceeded
	//   retried 1
}

// Check that a worker is alive before waiting on work.
func ExampleClient_Status() {
	srv := fakeAPI()
	defer srv.Close()
	st, err := client.New(srv.URL).Status(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	if st.WorkersAlive == 0 {
		fmt.Printf("no worker is alive; the oldest work has waited %.0fs\n", st.OldestPendingSeconds)
	}
	// Output: no worker is alive; the oldest work has waited 12s
}
