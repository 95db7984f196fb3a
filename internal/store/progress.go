package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
)

// progressScript records a running task's progress.
//
// KEYS[1] task hash
// ARGV[1] progress JSON
//
// Writes only while the task is active: a late report must neither mark
// an ended task nor recreate an expired record without its TTL.
var progressScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'state') == 'active' then
  redis.call('HSET', KEYS[1], 'progress', ARGV[1])
  return 1
end
return 0
`)

// SetProgress records p on task id while it is active; for a batch
// item's ID (apitype.ItemID), while the item has not ended.
func (s *Store) SetProgress(ctx context.Context, id string, p apitype.Progress) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if batchID, index, ok := apitype.ParseItemID(id); ok {
		return s.setItemProgress(ctx, batchID, index, string(b))
	}
	if err := progressScript.Run(ctx, s.rdb, []string{s.k.task(id)}, string(b)).Err(); err != nil {
		return fmt.Errorf("store: progress of %s: %w", id, err)
	}
	return nil
}

// setItemProgress records progress on a batch item. The chunk depends on
// the batch's stride, read first: progress is advisory, and the extra
// round trip of a report every few seconds costs nothing.
func (s *Store) setItemProgress(ctx context.Context, batchID string, index int, p string) error {
	st, err := s.rdb.HGet(ctx, s.k.batch(batchID), "stride").Int()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil || st <= 0 {
		return fmt.Errorf("store: progress of %s-%d: stride: %v", batchID, index, err)
	}
	j, k := index/st, index%st
	err = itemProgressScript.Run(ctx, s.rdb, []string{s.k.batch(batchID), s.k.batchRes(batchID, j)}, k, p).Err()
	if err != nil {
		return fmt.Errorf("store: progress of %s-%d: %w", batchID, index, err)
	}
	return nil
}
