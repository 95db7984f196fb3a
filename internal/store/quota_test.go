package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// TestQuotaIsExact drives one owner's count of single tasks through every
// way a task stops being unfinished (completion, cancel, a failed
// submission undone, records expiring before they ran, a duplicate or
// late finish) and checks it after each step. Batches, which count as one
// unit of many items, are held to the same by TestBatchQuotaExact.
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
	submit := func(id string, quota int) error {
		_, _, err := s.SubmitTask(ctx, store.NewTask{ID: id, Kind: "sliding", Owner: "alice"}, quota)
		return err
	}
	for i := range 6 {
		if err := submit(fmt.Sprintf("s%d", i), 6); err != nil {
			t.Fatal(err)
		}
	}
	pending(6, "six singles")
	if err := submit("s6", 6); err != store.ErrQuota {
		t.Fatalf("a seventh over a quota of 6: %v", err)
	}
	if _, err := s.Get(ctx, "s6"); err != store.ErrNotFound {
		t.Fatalf("a refused task was written: %v", err)
	}
	pending(6, "after a refused task")

	if _, err := s.Cancel(ctx, "s0", "alice"); err != nil {
		t.Fatal(err)
	}
	s.Cancel(ctx, "s0", "alice") // twice: counted once
	pending(5, "after cancelling one twice")
	done := []worker.Transition{{ID: "s1", Owner: "alice", State: apitype.TaskStateCompleted, Result: []byte(`{}`)}}
	s.Finish(ctx, done, nil)
	s.Finish(ctx, done, nil) // a duplicate delivery
	pending(4, "after completing one, delivered twice")
	if err := s.ReleasePending(ctx, "alice", "s2"); err != nil {
		t.Fatal(err)
	}
	pending(3, "after undoing one")

	// The rest never run: when their records expire, the count drops.
	time.Sleep(1100 * time.Millisecond)
	if _, err := s.Get(ctx, "s3"); err != store.ErrNotFound {
		t.Fatalf("record still there after its TTL: %v", err)
	}
	pending(0, "after the records expired")
	// A worker finishing an expired task late must not lower the count of
	// the owner's new work.
	for i := range 6 {
		if err := submit(fmt.Sprintf("n%d", i), 6); err != nil {
			t.Fatalf("a full quota after expiry: %v", err)
		}
	}
	s.Finish(ctx, []worker.Transition{{ID: "s4", Owner: "alice", State: apitype.TaskStateCompleted, Result: []byte(`{}`)}}, nil)
	pending(6, "after a late finish of an expired task")
}
