package store

import (
	"context"
	"encoding/json"
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

// SetProgress records p on task id while it is active.
func (s *Store) SetProgress(ctx context.Context, id string, p apitype.Progress) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if err := progressScript.Run(ctx, s.rdb, []string{s.k.task(id)}, string(b)).Err(); err != nil {
		return fmt.Errorf("store: progress of %s: %w", id, err)
	}
	return nil
}
