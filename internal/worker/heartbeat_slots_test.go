package worker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// A worker's beats record its solver slots in Redis, the first beat
// before it fetches anything, and tell it the cluster's; leaving takes
// them out at once.
func TestHeartbeatRecordsSolverSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	st := store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	var seen atomic.Int64
	beat := func(id string, slots int) *worker.Heartbeat {
		hb := worker.NewHeartbeat(st, id, time.Hour, nil) // beats only when told
		hb.SetSlots(st, slots, func(total int) { seen.Store(int64(total)) })
		if err := hb.Beat(ctx); err != nil {
			t.Fatal(err)
		}
		return hb
	}
	a := beat("w-a", 2)
	if n, err := st.ClusterSlots(ctx); err != nil || n != 2 || seen.Load() != 2 {
		t.Fatalf("one worker of 2 slots: cluster %d (%v), told %d; want 2", n, err, seen.Load())
	}
	b := beat("w-b", 3)
	if n, err := st.ClusterSlots(ctx); err != nil || n != 5 || seen.Load() != 5 {
		t.Fatalf("workers of 2 and 3 slots: cluster %d (%v), told %d; want 5", n, err, seen.Load())
	}
	if err := a.Beat(ctx); err != nil || seen.Load() != 5 {
		t.Fatalf("a's second beat: %v, told %d; want 5", err, seen.Load())
	}
	if err := b.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := st.ClusterSlots(ctx); err != nil || n != 2 {
		t.Fatalf("after b left: cluster %d (%v), want 2", n, err)
	}
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := st.ClusterSlots(ctx); err != nil || n != 0 {
		t.Fatalf("after both left: cluster %d (%v), want 0", n, err)
	}
}
