package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/solvers/sliding"
)

// TestCancelRetriedAfterALostAnswer: the server cancels, but the answer
// never reaches the client (the connection drops after the request was
// handled). The client retries the DELETE, as it does any idempotent
// request, and the retry must succeed as the first would have, not
// report a 409 for the cancel it just made, nor a 404 for the batch it
// just deleted. A real stack with no worker, so the work stays pending
// until it is canceled.
func TestCancelRetriedAfterALostAnswer(t *testing.T) {
	s := stacktest.StartWith(t, 0, map[string]string{"KEY_PREFIX": "ccancel:"})
	var mu sync.Mutex
	lost := map[string]int{} // path and query -> DELETE answers dropped
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err != nil || r.Method != http.MethodDelete {
			return resp, err
		}
		mu.Lock()
		defer mu.Unlock()
		if lost[r.URL.RequestURI()] > 0 {
			return resp, nil
		}
		lost[r.URL.RequestURI()]++
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, errors.New("connection reset by peer (the test dropped the answer)")
	})}
	c := client.New(s.URL, client.WithHTTPClient(hc))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	task, err := c.Submit(ctx, client.Sliding(sliding.Puzzle{Board: [][]int{{1, 2, 3}, {4, 5, 6}, {7, 0, 8}}}, sliding.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Cancel(ctx, task.ID)
	if err != nil || got.State != client.StateCanceled {
		t.Fatalf("Cancel after a lost answer: %+v, %v", got, err)
	}

	sub, err := c.SubmitBatch(ctx, client.NDJSONBatch(client.BytesBody([]byte(
		`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`+"\n"+
			`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[0,7,8]]}}`+"\n"))))
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.CancelBatch(ctx, sub.ID)
	if err != nil || n != 0 {
		// The first try canceled both; the retry that the client saw
		// canceled none more.
		t.Fatalf("CancelBatch after a lost answer: %d, %v; want 0, nil", n, err)
	}
	b, err := c.GetBatch(ctx, sub.ID, "", 1, 0)
	if err != nil || !b.Done || b.Counts.Canceled != 2 {
		t.Fatalf("the batch after the cancel: %+v, %v", b, err)
	}
	// Ended, the batch is deleted; the retry of the delete whose answer
	// was lost finds it deleted, and says so as the first would have.
	if err := c.DeleteBatch(ctx, sub.ID); err != nil {
		t.Fatalf("DeleteBatch after a lost answer: %v", err)
	}
	var e *client.Error
	if _, err := c.GetBatch(ctx, sub.ID, "", 1, 0); !errors.As(err, &e) || e.StatusCode != http.StatusNotFound {
		t.Fatalf("the batch after the delete: %v, want a 404", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lost) != 3 {
		t.Fatalf("dropped answers on %d paths, want 3 (the test's transport was not used?)", len(lost))
	}
}
