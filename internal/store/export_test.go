package store

import (
	"context"
	"time"

	"github.com/puzzleq/puzzleq/tasks"
)

// FeedCheap is Feed from the cheap lane's feed onto queue, so that a test
// feeds that lane onto a queue of its own.
func (s *Store) FeedCheap(ctx context.Context, queue string, depth, max int) ([]tasks.UnitRef, error) {
	return s.feedInto(ctx, s.k.cheapFeed(), queue, depth, depth, max)
}

// KeysForTest lists the keys under the store's prefix that match pattern.
func (s *Store) KeysForTest(ctx context.Context, pattern string) []string {
	return s.rdb.Keys(ctx, s.k.prefix+pattern).Val()
}

// TTLForTest is key's time to live.
func (s *Store) TTLForTest(ctx context.Context, key string) time.Duration {
	return s.rdb.TTL(ctx, key).Val()
}
