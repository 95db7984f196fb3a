package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/solvers/fill"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/solvers/sweep"
)

// TestListRetryStatusOnAStack drives the list, items, retry and status
// methods against a real stack (internal/stacktest: a redis-server, the
// API and a worker).
func TestListRetryStatusOnAStack(t *testing.T) {
	s := stacktest.StartWith(t, 1, map[string]string{"KEY_PREFIX": "clists:"})
	c := client.New(s.URL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub, err := c.SubmitBatch(ctx, client.BatchOf(
		client.Sliding(sliding.Puzzle{Board: [][]int{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}}}, sliding.Options{}).WithCustomID("ok"),
		client.Sweep(sweep.Puzzle{Board: []string{".....", "....."}}, sweep.Options{MaxNodes: 1}).WithCustomID("bad")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetBatch(ctx, sub.ID, "", 1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	task, err := c.Submit(ctx, client.Fill(fill.Puzzle{GameBoard: [][]int{{1, 1, 0}, {1, 1, 0}, {0, 0, 0}}, Table: [][]int{{1, 1, 1}, {0, 0, 1}, {0, 0, 1}}}, fill.Options{}))
	if err != nil {
		t.Fatal(err)
	}

	l, err := c.ListBatches(ctx, client.ListOptions{State: client.StateFailed, Kind: "sweep"})
	if err != nil || len(l.Batches) != 1 || l.Batches[0].ID != sub.ID || l.NextCursor != nil {
		t.Fatalf("ListBatches: %+v, %v", l, err)
	}
	if l, err := c.ListBatches(ctx, client.ListOptions{CreatedAfter: time.Now().Add(time.Hour)}); err != nil || len(l.Batches) != 0 {
		t.Fatalf("ListBatches created an hour from now: %+v, %v", l, err)
	}
	tl, err := c.ListTasks(ctx, client.ListOptions{Kind: "fill", Limit: 10})
	if err != nil || len(tl.Tasks) != 1 || tl.Tasks[0].ID != task.ID {
		t.Fatalf("ListTasks: %+v, %v", tl, err)
	}
	items, err := c.BatchItems(ctx, sub.ID, client.ListOptions{State: client.StateFailed})
	if err != nil || len(items.Tasks) != 1 || *items.Tasks[0].CustomID != "bad" {
		t.Fatalf("BatchItems: %+v, %v", items, err)
	}
	items, err = c.BatchItems(ctx, sub.ID, client.ListOptions{CustomID: "ok"})
	if err != nil || len(items.Tasks) != 1 || items.Tasks[0].ID != sub.ID+"-0" {
		t.Fatalf("BatchItems by custom_id: %+v, %v", items, err)
	}
	n, err := c.RetryBatch(ctx, sub.ID)
	if err != nil || n != 1 {
		t.Fatalf("RetryBatch: %d, %v", n, err)
	}
	b, err := c.GetBatch(ctx, sub.ID, "", 1, 30*time.Second)
	if err != nil || !b.Done || b.Counts.Failed != 1 || b.Counts.Completed != 1 {
		t.Fatalf("after the retry: %+v, %v", b, err)
	}
	st, err := c.Status(ctx)
	if err != nil || st.WorkersAlive != 1 || st.Slots == 0 {
		t.Fatalf("Status: %+v, %v", st, err)
	}
	if _, err := c.RetryBatch(ctx, "0123456789abcdef0123456789abcdef"); !client.IsNotFound(err) {
		t.Fatalf("RetryBatch of an unknown batch: %v", err)
	}
}
