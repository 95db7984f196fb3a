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
	"strings"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/solvers/fill"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/solvers/sweep"
	"github.com/puzzleq/puzzleq/webhook"
)

// The examples run against a real API and worker (exampleAPI); point New
// at your own server instead, e.g. "http://localhost:8080".

// Solve one puzzle: one request that waits for the answer, long polling
// on should the wait run out first, and the answer as the solver's type.
func ExampleClient_Solve() {
	c := client.New(exampleAPI(), client.WithAPIKey(os.Getenv("PUZZLEQ_API_KEY")))
	ctx := context.Background()

	t, err := c.Solve(ctx, client.Sliding(sliding.Puzzle{Board: [][]int{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}}}, sliding.Options{}))
	if err != nil {
		log.Fatal(err)
	}
	res, err := client.ResultOf[sliding.Result](t)
	if err != nil {
		log.Fatal(err) // a *client.NotCompletedError says why it failed
	}
	fmt.Println(res.Moves, res.Path)
	// Output: 3 DRD
}

// Submit a puzzle and come back for it: Submit answers at once with the
// task's ID, Wait long polls until it has ended.
func ExampleClient_Submit() {
	c := client.New(exampleAPI())
	ctx := context.Background()

	t, err := c.Submit(ctx, client.Sweep(sweep.Puzzle{Board: []string{"..*", "...", "*.."}}, sweep.Options{}))
	if err != nil {
		log.Fatal(err)
	}
	// ... later, or in another process that has t.ID:
	if t, err = c.Wait(ctx, t.ID); err != nil {
		log.Fatal(err)
	}
	res, err := client.ResultOf[sweep.Result](t)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.State, res.Moves, res.Start, res.Path)
	// Output: completed 5 [0 1] LDRDL
}

// Submit a batch of mixed kinds under an idempotency key, then stream its
// results in submission order, each decoded as its kind's result.
func ExampleClient_SubmitBatch() {
	c := client.New(exampleAPI())
	ctx := context.Background()

	batch := client.BatchOf(
		client.Sliding(sliding.Puzzle{Board: [][]int{{1, 2, 3}, {4, 5, 6}, {7, 0, 8}}}, sliding.Options{}).WithCustomID("tiles"),
		client.Fill(fill.Puzzle{
			GameBoard: [][]int{{1, 1, 0}, {1, 1, 0}, {0, 0, 0}},
			Table:     [][]int{{1, 1, 1}, {0, 0, 1}, {0, 0, 1}},
		}, fill.Options{}).WithCustomID("pieces"),
	)
	// The same key and body, sent again (by a retry or a later run),
	// answers this batch instead of creating another.
	sub, err := c.SubmitBatch(ctx, batch, client.WithIdempotencyKey("nightly-2026-11-30-part-0"))
	if err != nil {
		log.Fatal(err)
	}
	again, err := c.SubmitBatch(ctx, batch, client.WithIdempotencyKey("nightly-2026-11-30-part-0"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sub.Total, "items; the second submission replayed the first:", again.Replayed && again.ID == sub.ID)

	for line, err := range c.Results(ctx, sub.ID, client.ResultsOptions{Wait: 30 * time.Second}) {
		if err != nil {
			log.Fatal(err)
		}
		switch *line.CustomID {
		case "tiles":
			r, err := client.ResultOf[sliding.Result](line)
			fmt.Println(line.Index, "tiles:", r.Moves, r.Path, err)
		case "pieces":
			r, err := client.ResultOf[fill.Result](line)
			fmt.Println(line.Index, "pieces:", r.Filled, "cells filled", err)
		}
	}
	// Output:
	// 2 items; the second submission replayed the first: true
	// 0 tiles: 1 R <nil>
	// 1 pieces: 5 cells filled <nil>
}

// Submit a file of NDJSON requests as one batch, streamed from disk (a
// retry reads the file again).
func ExampleNDJSONBatch() {
	c := client.New(exampleAPI())
	ctx := context.Background()

	f, err := os.CreateTemp("", "batch-*.ndjson")
	if err != nil {
		log.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	io.WriteString(f, `{"custom_id":"easy","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`+"\n"+
		`{"custom_id":"sweep","kind":"sweep","puzzle":{"board":["..","*.","*."]}}`+"\n")
	st, err := f.Stat()
	if err != nil {
		log.Fatal(err)
	}
	sub, err := c.SubmitBatch(ctx, client.NDJSONBatch(client.ReaderAtBody(f, st.Size())))
	if err != nil {
		log.Fatal(err)
	}
	b, err := c.GetBatch(ctx, sub.ID, "", 0, 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(b.Counts.Completed, "of", b.Total, "completed; the second is", sub.ItemID(1) == b.Tasks[1].ID)
	// Output: 2 of 2 completed; the second is true
}

// Submit a judge's input as it is and read the judge's answer.
func ExampleJudgeBatch() {
	c := client.New(exampleAPI())
	ctx := context.Background()

	in := "5 5\n**...\n.....\n....*\n..*..\n.....\n3 4\n****\n****\n....\n" // Baekjoon 9944
	sub, err := c.SubmitBatch(ctx, client.JudgeBatch("boj9944", client.BytesBody([]byte(in))))
	if err != nil {
		log.Fatal(err)
	}
	out, err := c.BatchOutput(ctx, sub.ID, 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(out))
	// Output:
	// Case 1: 10
	// Case 2: 1
}

// Name a completion webhook on a submission: once the task has ended the
// server POSTs a signed task.done event to the URL, so nothing has to
// poll for it. The receiver checks the signature with webhook.Verify and
// the server's WEBHOOK_SECRET. A URL the server refuses is a 400 *Error
// with Field "webhook".
func ExampleWithWebhook() {
	events := make(chan string, 1)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err == nil {
			err = webhook.Verify(webhookSecret, r.Header, body, time.Now())
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var ev apitype.WebhookEvent
		json.Unmarshal(body, &ev)
		select {
		case events <- ev.Type:
		default:
		}
	}))
	defer hook.Close()
	c := client.New(exampleAPI())

	_, err := c.Submit(context.Background(), client.Sweep(sweep.Puzzle{Board: []string{".*.", "..."}}, sweep.Options{}),
		client.WithWebhook(hook.URL+"/puzzleq"))
	if err != nil {
		log.Fatal(err)
	}
	select {
	case ev := <-events:
		fmt.Println("the webhook heard", ev)
	case <-time.After(30 * time.Second):
		fmt.Println("no webhook within 30s")
	}
	// Output: the webhook heard task.done
}

// A task that ran and failed is not a Go error of Solve: ResultOf says
// why it has no result.
func ExampleResultOf() {
	c := client.New(exampleAPI())

	// A node budget of 1 cannot finish the search.
	t, err := c.Solve(context.Background(), client.Sweep(sweep.Puzzle{Board: []string{"....", "....", "...."}}, sweep.Options{MaxNodes: 1}))
	if err != nil {
		log.Fatal(err)
	}
	_, err = client.ResultOf[sweep.Result](t)
	var nc *client.NotCompletedError
	if errors.As(err, &nc) {
		fmt.Println(nc.State, nc.Err.Code)
	}
	_, err = client.ResultOf[sliding.Result](t)
	fmt.Println(err != nil && strings.Contains(err.Error(), "sweep puzzle, not sliding"))
	// Output:
	// failed budget_exceeded
	// true
}

// API errors carry the HTTP status, code and field; network failures
// match ErrUnreachable.
func ExampleError() {
	c := client.New(exampleAPI())

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

// List the batches that failed since a moment, newest first, page after
// page, and retry their failed tasks.
func ExampleClient_ListBatches() {
	c := client.New(exampleAPI())
	ctx := context.Background()
	since := time.Now().Add(-time.Millisecond) // the server counts whole milliseconds
	sub, err := c.SubmitBatch(ctx, client.BatchOf(
		client.Sweep(sweep.Puzzle{Board: []string{".."}}, sweep.Options{}).WithCustomID("easy"),
		client.Sweep(sweep.Puzzle{Board: []string{".....", "....."}}, sweep.Options{MaxNodes: 1}).WithCustomID("hard"),
	))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.GetBatch(ctx, sub.ID, "", 1, 30*time.Second); err != nil {
		log.Fatal(err)
	}

	o := client.ListOptions{State: client.StateFailed, CreatedAfter: since}
	for {
		page, err := c.ListBatches(ctx, o)
		if err != nil {
			log.Fatal(err)
		}
		for _, b := range page.Batches {
			fmt.Printf("%d of %d failed\n", b.Counts.Failed, b.Total)
			items, err := c.BatchItems(ctx, b.ID, client.ListOptions{State: client.StateFailed})
			if err != nil {
				log.Fatal(err)
			}
			for _, t := range items.Tasks {
				fmt.Printf("  %s: %s\n", *t.CustomID, t.Error.Code)
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
	// 1 of 2 failed
	//   hard: budget_exceeded
	//   retried 1
}

// Check that a worker is alive before waiting on work.
func ExampleClient_Status() {
	st, err := client.New(exampleAPI()).Status(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	if st.WorkersAlive == 0 {
		fmt.Printf("no worker is alive; the oldest work has waited %.0fs\n", st.OldestPendingSeconds)
		return
	}
	fmt.Println(st.WorkersAlive, "worker alive")
	// Output: 1 worker alive
}
