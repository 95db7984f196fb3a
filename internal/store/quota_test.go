package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestQuotaIsExact drives one owner's count through every way a task
// stops being unfinished (completion, cancel, a failed submission undone,
// records expiring before they ran, a duplicate or late finish) and
// checks it against the records after each step.
func TestQuotaIsExact(t *testing.T) {
	t.Parallel()
	prefix := fmt.Sprintf("t:%s:%d:", t.Name(), time.Now().UnixNano())
	s, ctx := store.New(sharedServer(t).Client(t), store.Options{Prefix: prefix, TaskTTL: time.Second, ResultTTL: time.Hour}), context.Background()

	pending := func(want int, when string) {
		t.Helper()
		if n, err := s.Pending(ctx, "alice"); err != nil || n != want {
			t.Fatalf("%s: alice's count is %d (%v), want %d", when, n, err, want)
		}
	}
	batch := func(id string, n, quota int) error {
		items := make([]store.NewTask, n)
		for i := range items {
			items[i] = store.NewTask{ID: fmt.Sprintf("%s-%d", id, i), Kind: "sliding", Owner: "alice"}
		}
		return s.CreateBatch(ctx, store.NewBatch{ID: id, Owner: "alice", Quota: quota}, items)
	}

	if err := batch("b1", 5, 10); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: "s1", Kind: "sliding", Owner: "alice"}, 10); err != nil {
		t.Fatal(err)
	}
	pending(6, "a batch of 5 and a single")
	if err := batch("b2", 5, 10); err != store.ErrQuota {
		t.Fatalf("5 more over a quota of 10 with 6 open: %v", err)
	}
	if _, err := s.GetBatch(ctx, "b2"); err != store.ErrNotFound {
		t.Fatalf("a refused batch was written: %v", err)
	}
	pending(6, "after a refused batch")

	if _, err := s.Cancel(ctx, "b1-0", "b1", "alice"); err != nil {
		t.Fatal(err)
	}
	s.Cancel(ctx, "b1-0", "b1", "alice") // twice: counted once
	pending(5, "after cancelling one item twice")
	done := []tasks.Transition{{ID: "b1-1", BatchID: "b1", Owner: "alice", State: apitype.TaskStateCompleted, Result: []byte(`{}`)}}
	s.Finish(ctx, done, nil)
	s.Finish(ctx, done, nil) // a duplicate delivery
	pending(4, "after completing one item, delivered twice")
	if err := s.ReleasePending(ctx, "alice", "s1"); err != nil {
		t.Fatal(err)
	}
	pending(3, "after undoing the single")

	// The rest never run: when their records expire, the count drops.
	time.Sleep(1100 * time.Millisecond)
	if _, err := s.Get(ctx, "b1-2"); err != store.ErrNotFound {
		t.Fatalf("record still there after its TTL: %v", err)
	}
	pending(0, "after the records expired")
	// A worker finishing an expired item late must not lower the count of
	// the owner's new work.
	if err := batch("b3", 10, 10); err != nil {
		t.Fatalf("a full quota after expiry: %v", err)
	}
	s.Finish(ctx, []tasks.Transition{{ID: "b1-3", BatchID: "b1", Owner: "alice", State: apitype.TaskStateCompleted, Result: []byte(`{}`)}}, nil)
	pending(10, "after a late finish of an expired item")
	if _, err := s.CancelBatch(ctx, "b3", "alice"); err != nil {
		t.Fatal(err)
	}
	pending(0, "after cancelling the batch")
}
