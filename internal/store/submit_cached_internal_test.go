package store

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestSubmitCachedMatchesSubmitTask: a hit through SubmitCached leaves
// what SubmitTask leaves for a hit (the record field for field, its TTL,
// the owner's index entry and its TTL, the trim of a "0" ID), and a miss
// writes nothing at all, so that the API may take either path.
func TestSubmitCachedMatchesSubmitTask(t *testing.T) {
	clock := time.UnixMilli(1_700_000_000_000)
	s, rdb := newClockedStore(t, "hit:", &clock)
	ctx := context.Background()
	const result = `{"moves":2,"solvable":true,"path":"LU"}`
	if err := rdb.Set(ctx, s.k.cache("ck"), result, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	msg := asynqdata.Enqueued{ID: "", Queue: tasks.QueueInteractive, Msg: []byte("not empty: a miss would enqueue")}
	for _, owner := range []string{"", "alice"} {
		// An old index member, which a "0" ID's submission trims.
		if err := rdb.ZAdd(ctx, s.k.ownerTasks(owner), redisZ(clock.Add(-2*time.Hour), "old")).Err(); err != nil {
			t.Fatal(err)
		}
		for _, suffix := range []string{"1", "0"} {
			a, b := owner+"a"+suffix, owner+"b"+suffix
			e := msg
			e.ID = a
			hitA, atA, err := s.SubmitTask(ctx, NewTask{ID: a, Kind: "sliding", Owner: owner, CacheKey: "ck", Enqueue: e}, 1)
			if err != nil || string(hitA) != result {
				t.Fatalf("SubmitTask: %q, %v", hitA, err)
			}
			indexA := rdb.ZRangeWithScores(ctx, s.k.ownerTasks(owner), 0, -1).Val()
			rdb.ZAdd(ctx, s.k.ownerTasks(owner), redisZ(clock.Add(-2*time.Hour), "old"))
			hitB, atB, err := s.SubmitCached(ctx, NewTask{ID: b, Kind: "sliding", Owner: owner, CacheKey: "ck"})
			if err != nil || string(hitB) != result || !atA.Equal(atB) {
				t.Fatalf("SubmitCached: %q at %v, %v; SubmitTask's at %v", hitB, atB, err, atA)
			}
			recA, recB := rdb.HGetAll(ctx, s.k.task(a)).Val(), rdb.HGetAll(ctx, s.k.task(b)).Val()
			if len(recA) == 0 || !maps.Equal(recA, recB) {
				t.Fatalf("owner %q: SubmitTask wrote %v, SubmitCached %v", owner, recA, recB)
			}
			if ta, tb := rdb.TTL(ctx, s.k.task(a)).Val(), rdb.TTL(ctx, s.k.task(b)).Val(); ta != tb || ta <= 0 {
				t.Fatalf("record TTLs %s and %s", ta, tb)
			}
			indexB := rdb.ZRangeWithScores(ctx, s.k.ownerTasks(owner), 0, -1).Val()
			if len(indexB) != len(indexA)+1 {
				t.Fatalf("owner %q, IDs ending %s: index %v after SubmitTask, %v after SubmitCached", owner, suffix, indexA, indexB)
			}
			if ttl := rdb.TTL(ctx, s.k.ownerTasks(owner)).Val(); ttl < 59*time.Minute {
				t.Fatalf("index TTL %s", ttl)
			}
			// A hit enqueues nothing and counts no quota either way.
			if n := rdb.Exists(ctx, asynqdata.TaskKey(tasks.QueueInteractive, a), asynqdata.PendingKey(tasks.QueueInteractive)).Val(); n != 0 {
				t.Fatalf("a hit left %d asynq keys", n)
			}
			clock = clock.Add(time.Millisecond)
		}
	}
	// A miss writes nothing: no record, no index entry.
	before, _ := rdb.DBSize(ctx).Result()
	hit, _, err := s.SubmitCached(ctx, NewTask{ID: "c1", Kind: "sliding", Owner: "bob", CacheKey: "gone"})
	if err != nil || hit != nil {
		t.Fatalf("a miss: %q, %v", hit, err)
	}
	if after, _ := rdb.DBSize(ctx).Result(); after != before {
		t.Fatalf("a miss changed the key count from %d to %d", before, after)
	}
}

// redisZ is an index member at t.
func redisZ(t time.Time, member string) redis.Z {
	return redis.Z{Score: float64(t.UnixMilli()), Member: member}
}
