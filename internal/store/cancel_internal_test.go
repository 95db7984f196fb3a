package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/puzzle"
)

// TestCancelBatchIsSafeToRepeat: a cancel cut off part way (the API died
// or timed out after marking the batch and canceling its first chunk) is
// finished by the next call, which counts only what it canceled itself;
// a call after the batch ended by a cancel cancels nothing and is no
// error; a batch that ended on its own is ErrBatchEnded, and one that does
// not exist ErrNotFound. The API answers 200, 200 and 409 from these,
// which is what makes the client's retry of a DELETE safe.
func TestCancelBatchIsSafeToRepeat(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := New(rdb, Options{Prefix: "cx:", TaskTTL: time.Hour, ResultTTL: time.Hour})

	const n, stride = 10, 2
	id := fmt.Sprintf("%032x", 7)
	w := s.NewBatchWriter(id, stride)
	for i := range n {
		if err := w.Add(ctx, StagedItem{Kind: puzzle.KindSliding, Request: fmt.Appendf(nil, `{"board":%d}`, i), Timeout: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitBatch(ctx, w, CommitBatch{ID: id, Owner: "alice"}); err != nil {
		t.Fatal(err)
	}

	// The first cancel's two first steps, as CancelBatch takes them, then
	// nothing: the mark and chunk 0 of 5.
	chunks, err := markCanceledScript.Run(ctx, rdb, []string{s.k.batch(id), s.k.backlog()}, ms(s.now()), id, backlogUnits).Int()
	if err != nil || chunks != n/stride {
		t.Fatalf("mark: %d chunks, %v", chunks, err)
	}
	if err := cancelItemsScript.Run(ctx, rdb, []string{s.k.batch(id), s.k.batchReq(id), s.k.batchRes(id, 0)},
		s.cancelArgs(id, 0, "batch canceled by request")...).Err(); err != nil {
		t.Fatal(err)
	}
	b, err := s.GetBatch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if b.Done() || b.CanceledAt.IsZero() || b.Counts[apitype.TaskStateCanceled] != stride {
		t.Fatalf("after the cut-off cancel: done %v, canceled_at %v, counts %v", b.Done(), b.CanceledAt, b.Counts)
	}
	markedAt := b.CanceledAt

	got, err := s.CancelBatch(ctx, id, "alice")
	if err != nil || got != n-stride {
		t.Fatalf("the retry canceled %d (%v), want %d", got, err, n-stride)
	}
	b, err = s.GetBatch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Done() || b.Counts[apitype.TaskStateCanceled] != n || !b.CanceledAt.Equal(markedAt) {
		t.Fatalf("after the retry: done %v, counts %v, canceled_at %v (was %v)", b.Done(), b.Counts, b.CanceledAt, markedAt)
	}
	if got, err := s.CancelBatch(ctx, id, "alice"); err != nil || got != 0 {
		t.Fatalf("a cancel of the canceled batch: %d, %v; want 0, nil", got, err)
	}

	ended := fmt.Sprintf("%032x", 8)
	fillBatch(t, s, ended, 4, 2, false)
	if got, err := s.CancelBatch(ctx, ended, "alice"); !errors.Is(err, ErrBatchEnded) || got != 0 {
		t.Fatalf("a cancel of a batch that ended on its own: %d, %v; want ErrBatchEnded", got, err)
	}
	if b, err := s.GetBatch(ctx, ended); err != nil || !b.CanceledAt.IsZero() {
		t.Fatalf("the ended batch was marked canceled: %v, %v", b.CanceledAt, err)
	}
	if _, err := s.CancelBatch(ctx, fmt.Sprintf("%032x", 9), "alice"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a cancel of no batch: %v, want ErrNotFound", err)
	}
}
