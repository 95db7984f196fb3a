package store

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/tasks"
)

// The delivery backlog per key: acking a delivery adds it to its key's
// count, ending it takes it out, both once however often they are called;
// a ref that never ends leaves the count with its webhook's life, and a
// key with nothing left leaves the set of keys.
func TestWebhookBacklogPerKey(t *testing.T) {
	clock := time.UnixMilli(1_700_000_000_000)
	s, rdb := newClockedStore(t, "bl:", &clock)
	ctx := context.Background()
	want := func(w map[string]int64) {
		t.Helper()
		got, err := s.WebhookBacklog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, w) {
			t.Fatalf("backlog %v, want %v", got, w)
		}
	}
	want(map[string]int64{})
	a1, a2, b1 := tasks.WebhookPayload{Ref: "b:1", Owner: "a"}, tasks.WebhookPayload{Ref: "t:2", Owner: "a"}, tasks.WebhookPayload{Ref: "b:3", Owner: "b"}
	if err := s.AckWebhook(ctx, a1, a2, b1); err != nil {
		t.Fatal(err)
	}
	if err := s.AckWebhook(ctx, a1); err != nil { // a lost ack, acked again
		t.Fatal(err)
	}
	want(map[string]int64{"a": 2, "b": 1})
	for range 2 { // a redelivered delivery ends twice
		if err := s.EndWebhook(ctx, "b", "b:3"); err != nil {
			t.Fatal(err)
		}
	}
	want(map[string]int64{"a": 2})
	if n, err := rdb.SCard(ctx, s.k.webhookBacklogKeys()).Result(); err != nil || n != 1 {
		t.Fatalf("keys with a backlog: %d %v, want b dropped", n, err)
	}
	if err := s.EndWebhook(ctx, "a", "b:1"); err != nil {
		t.Fatal(err)
	}
	want(map[string]int64{"a": 1})
	// t:2 never ends (its asynq task was deleted): it leaves the count
	// once its webhook would be gone.
	clock = clock.Add(s.webhookBacklogAge() + time.Second)
	want(map[string]int64{})
	if n, err := rdb.Exists(ctx, s.k.webhookBacklogKeys(), s.k.webhookBacklog("a")).Result(); err != nil || n != 0 {
		t.Fatalf("%d backlog keys left (%v), want none", n, err)
	}
}
