package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/store"
)

// TestReleaseIdempotencyOnlyDropsOwnClaim: a request whose claim expired
// while it ran, and which another request has claimed since, must not drop
// that request's claim when it gives up; otherwise a third request with
// the same key claims it too and two batches exist for one key.
func TestReleaseIdempotencyOnlyDropsOwnClaim(t *testing.T) {
	t.Parallel()
	rdb := sharedServer(t).Client(t)
	prefix := fmt.Sprintf("t:%s:%d:", t.Name(), time.Now().UnixNano())
	s := store.New(rdb, store.Options{Prefix: prefix, TaskTTL: time.Hour, ResultTTL: time.Hour})
	ctx := context.Background()

	if ok, _, _, err := s.ClaimIdempotency(ctx, "alice", "k", "b1", "h1"); !ok || err != nil {
		t.Fatalf("first claim: %v %v", ok, err)
	}
	// b1's lease runs out (the only key under this test's prefix).
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("claim keys: %v %v", keys, err)
	}
	if err := rdb.Del(ctx, keys[0]).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, _, _, err := s.ClaimIdempotency(ctx, "alice", "k", "b2", "h2"); !ok || err != nil {
		t.Fatalf("claim after expiry: %v %v", ok, err)
	}

	for _, c := range []struct {
		name              string
		batchID, bodyHash string
	}{
		{"the expired holder", "b1", "h1"},
		{"same batch, other body", "b2", "h1"},
		{"other batch, same body", "b1", "h2"},
	} {
		if err := s.ReleaseIdempotency(ctx, "alice", "k", c.batchID, c.bodyHash); err != nil {
			t.Fatalf("%s: release: %v", c.name, err)
		}
		ok, prev, hash, err := s.ClaimIdempotency(ctx, "alice", "k", "b3", "h3")
		if err != nil || ok || prev != "b2" || hash != "h2" {
			t.Fatalf("after %s released, a third request got claimed=%v prev=%q %q (%v); want b2's claim kept",
				c.name, ok, prev, hash, err)
		}
	}

	// The holder's own release frees the key at once.
	if err := s.ReleaseIdempotency(ctx, "alice", "k", "b2", "h2"); err != nil {
		t.Fatal(err)
	}
	if ok, _, _, err := s.ClaimIdempotency(ctx, "alice", "k", "b3", "h3"); !ok || err != nil {
		t.Fatalf("claim after the holder released: %v %v", ok, err)
	}
}
