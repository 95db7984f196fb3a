package store

import (
	"context"

	"github.com/puzzleq/puzzleq/tasks"
)

// FeedCheap is Feed from the cheap lane's feed onto queue, so that a test
// feeds that lane onto a queue of its own.
func (s *Store) FeedCheap(ctx context.Context, queue string, depth, max int) ([]tasks.UnitRef, error) {
	return s.feedInto(ctx, s.k.cheapFeed(), queue, depth, depth, max)
}
