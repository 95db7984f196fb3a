package store

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/redistest"
)

// TestSubmitTrimsOwnerIndexOneInSixteen holds submitScript's amortised
// trim of the owner's task index: a submission whose ID ends in "0"
// removes the members older than the record TTL, any other adds its own
// and leaves them, and every submission keeps the index's TTL at the
// record TTL.
func TestSubmitTrimsOwnerIndexOneInSixteen(t *testing.T) {
	clock := time.UnixMilli(1_700_000_000_000)
	s, rdb := newClockedStore(t, "trim:", &clock)
	ctx := context.Background()
	submit := func(t *testing.T, id string) {
		t.Helper()
		if _, _, err := s.SubmitTask(ctx, NewTask{ID: id, Kind: "sliding", CacheKey: "ck" + id}, 0); err != nil {
			t.Fatal(err)
		}
	}
	index := s.k.ownerTasks("")
	submit(t, "aaa1")
	submit(t, "aaa2")
	clock = clock.Add(time.Hour + time.Second)
	steps := []struct {
		id   string
		want []string
	}{
		{"bbb1", []string{"aaa1", "aaa2", "bbb1"}},
		{"bbbf", []string{"aaa1", "aaa2", "bbb1", "bbbf"}},
		{"bbb0", []string{"bbb1", "bbbf", "bbb0"}},
	}
	for _, st := range steps {
		submit(t, st.id)
		got, err := rdb.ZRange(ctx, index, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !sameSet(got, st.want) {
			t.Fatalf("after %s the index holds %v, want %v", st.id, got, st.want)
		}
		if ttl := rdb.TTL(ctx, index).Val(); ttl < 59*time.Minute || ttl > time.Hour {
			t.Fatalf("after %s the index's TTL is %s", st.id, ttl)
		}
	}
}

// newClockedStore starts a redis-server for one test and returns a store
// on it, with record and result TTLs of an hour, whose clock reads
// *clock.
func newClockedStore(t *testing.T, prefix string, clock *time.Time) (*Store, *redis.Client) {
	t.Helper()
	srv, err := redistest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	rdb := srv.Client(t)
	s := New(rdb, Options{Prefix: prefix, TaskTTL: time.Hour, ResultTTL: time.Hour})
	s.now = func() time.Time { return *clock }
	return s, rdb
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, x := range a {
		m[x] = true
	}
	for _, x := range b {
		if !m[x] {
			return false
		}
	}
	return true
}
