package store_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestCreateBatchWritesOutbox: the batch, its records and its outbox are
// written together; acknowledging every unit empties the outbox and takes
// the batch off the index.
func TestCreateBatchWritesOutbox(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	units := []tasks.Unit{
		{TaskID: tasks.ChunkTaskID("b", 0), Type: tasks.TypeChunk, Queue: tasks.QueueBulk, Timeout: time.Minute, Payload: json.RawMessage(`{"batch_id":"b","items":[]}`)},
		{TaskID: "i1", Type: tasks.TypeSweep, Queue: tasks.QueueBulk, Timeout: 2 * time.Minute, Payload: json.RawMessage(`{"id":"i1"}`)},
	}
	items := []store.NewTask{{ID: "i0", Kind: "sliding"}, {ID: "i1", Kind: "sweep"}, {ID: "i2", Kind: "sliding", Result: json.RawMessage(`{"moves":0}`)}}
	if err := s.CreateBatch(ctx, store.NewBatch{ID: "b", Units: units}, items); err != nil {
		t.Fatal(err)
	}
	b, err := s.GetBatch(ctx, "b")
	if err != nil || b.Total != 3 || b.Counts[apitype.TaskStatePending] != 2 || b.Counts[apitype.TaskStateCompleted] != 1 {
		t.Fatalf("batch %+v %v", b, err)
	}
	if got, _ := s.BatchItems(ctx, "b", 0, 10); len(got) != 3 || got[2] != "i2" {
		t.Fatalf("items %v", got)
	}
	ids, _ := s.OutboxBatches(ctx, time.Now().Add(time.Second), 10)
	if len(ids) != 1 || ids[0] != "b" {
		t.Fatalf("outbox index %v", ids)
	}
	idx, got, bad, err := s.OutboxUnits(ctx, "b")
	if err != nil || len(idx) != 2 || len(bad) != 0 {
		t.Fatalf("outbox: %v %v %v", idx, bad, err)
	}
	for j, i := range idx {
		if got[j].TaskID != units[i].TaskID || got[j].Timeout != units[i].Timeout || string(got[j].Payload) != string(units[i].Payload) {
			t.Errorf("unit %d read back as %+v, want %+v", i, got[j], units[i])
		}
	}
	if ids, _ := s.OutboxBatches(ctx, time.Now().Add(-time.Minute), 10); len(ids) != 0 {
		t.Fatalf("a batch younger than the cutoff was listed: %v", ids)
	}
	if left, err := s.AckOutbox(ctx, "b", []int{0}); err != nil || left != 1 {
		t.Fatalf("ack one: %d %v", left, err)
	}
	if left, err := s.AckOutbox(ctx, "b", []int{1}); err != nil || left != 0 {
		t.Fatalf("ack last: %d %v", left, err)
	}
	if ids, _ := s.OutboxBatches(ctx, time.Now().Add(time.Second), 10); len(ids) != 0 {
		t.Fatalf("an emptied outbox is still indexed: %v", ids)
	}
}

// TestCreateBatchUnderClaim: a batch is written only while its
// Idempotency-Key claim is its own; written, the claim names it for good.
func TestCreateBatchUnderClaim(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	items := []store.NewTask{{ID: "x0", Kind: "sliding"}}
	if ok, _, _, err := s.ClaimIdempotency(ctx, "alice", "k", "b1", "h"); !ok || err != nil {
		t.Fatalf("claim: %v %v", ok, err)
	}
	// Another request's claim (b2) does not let b2 be written...
	if err := s.CreateBatch(ctx, store.NewBatch{ID: "b2", Owner: "alice", IdempotencyKey: "k", BodyHash: "h"}, items); err != store.ErrClaimLost {
		t.Fatalf("write under someone else's claim: %v", err)
	}
	if _, err := s.GetBatch(ctx, "b2"); err != store.ErrNotFound {
		t.Fatalf("b2 written without its claim: %v", err)
	}
	// ...b1's is.
	if err := s.CreateBatch(ctx, store.NewBatch{ID: "b1", Owner: "alice", IdempotencyKey: "k", BodyHash: "h"}, items); err != nil {
		t.Fatal(err)
	}
	ok, prev, hash, err := s.ClaimIdempotency(ctx, "alice", "k", "b3", "h")
	if ok || prev != "b1" || hash != "h" || err != nil {
		t.Fatalf("after the write the key names %q %q (claimed %v, %v), want b1", prev, hash, ok, err)
	}
	// A released claim (nothing written) frees the key at once.
	s.ClaimIdempotency(ctx, "alice", "k2", "b4", "h")
	s.ReleaseIdempotency(ctx, "alice", "k2", "b4", "h")
	if err := s.CreateBatch(ctx, store.NewBatch{ID: "b4", Owner: "alice", IdempotencyKey: "k2", BodyHash: "h"}, items); err != store.ErrClaimLost {
		t.Fatalf("write after the claim was released: %v", err)
	}
}

// TestLease: one holder at a time; the holder renews, and another takes
// over once the lease has expired.
func TestLease(t *testing.T) {
	t.Parallel()
	s, ctx := newStore(t)
	if ok, err := s.AcquireLease(ctx, "l", "a", 200*time.Millisecond); !ok || err != nil {
		t.Fatalf("a: %v %v", ok, err)
	}
	if ok, _ := s.AcquireLease(ctx, "l", "b", 200*time.Millisecond); ok {
		t.Fatal("b took a live lease")
	}
	if ok, _ := s.AcquireLease(ctx, "l", "a", 200*time.Millisecond); !ok {
		t.Fatal("a could not renew")
	}
	time.Sleep(300 * time.Millisecond)
	if ok, _ := s.AcquireLease(ctx, "l", "b", 200*time.Millisecond); !ok {
		t.Fatal("b could not take an expired lease")
	}
}
