package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// ErrQuota is returned when admitting tasks would pass an owner's quota.
var ErrQuota = errors.New("pending-task quota exceeded")

// An owner's quota counts its tasks that have not ended, exactly, whatever
// dies when: tasks are counted by the same script that records them (so a
// crash cannot count a task that was never recorded, or record one that
// was never counted), uncounted by the script that ends them (only on
// their first move to an end), and dropped when their records expire
// without ending. For the last, the count is kept per unit of work (a
// batch, or a single task) with the time its records expire, and every
// script that reads the count first prunes the units that have expired.
// Reading a counter that could drift and repairing it later would be
// cheaper to write but not exact; scanning records at admission would be
// exact but cost O(tasks) per request.

// quotaLua holds the Lua functions shared by every script that counts an
// owner's tasks; it is put in front of their source. p, o and e are the
// owner's pending counter, open-units hash and expiry set (see keys.go).
//
// clock() is Redis's own time in Unix milliseconds, the clock that
// expires the records, so a unit leaves the count exactly when its
// records do, whatever the API hosts' clocks say.
// prune(p, o, e, now) drops the units whose records expired by now.
// admit(p, o, e, unit, n, expire_at) counts n more tasks of unit.
// release(p, o, e, ends) uncounts ends[unit] tasks of each unit, never
// more than it still counts (a pruned unit counts none).
const quotaLua = `
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function prune(p, o, e, now)
  local gone = redis.call('ZRANGEBYSCORE', e, '-inf', now)
  if #gone == 0 then return end
  local drop = 0
  for i = 1, #gone do
    drop = drop + (tonumber(redis.call('HGET', o, gone[i])) or 0)
    redis.call('HDEL', o, gone[i])
    redis.call('ZREM', e, gone[i])
  end
  if redis.call('DECRBY', p, drop) < 0 then redis.call('SET', p, 0) end
end
local function admit(p, o, e, unit, n, expire_at)
  redis.call('INCRBY', p, n)
  redis.call('HINCRBY', o, unit, n)
  redis.call('ZADD', e, expire_at, unit)
  redis.call('PEXPIREAT', p, expire_at)
  redis.call('PEXPIREAT', o, expire_at)
  redis.call('PEXPIREAT', e, expire_at)
end
local function release(p, o, e, ends)
  local total = 0
  for unit, d in pairs(ends) do
    local have = tonumber(redis.call('HGET', o, unit))
    if have then
      if d >= have then
        d = have
        redis.call('HDEL', o, unit)
        redis.call('ZREM', e, unit)
      else
        redis.call('HINCRBY', o, unit, -d)
      end
      total = total + d
    end
  end
  if total > 0 and redis.call('DECRBY', p, total) < 0 then redis.call('SET', p, 0) end
end
`

// pendingScript reads an owner's exact count.
//
// KEYS[1..3] the owner's pending counter, open units and expiry set
//
// Returns the number of the owner's tasks that have not ended.
var pendingScript = redis.NewScript(quotaLua + `
prune(KEYS[1], KEYS[2], KEYS[3], clock())
return tonumber(redis.call('GET', KEYS[1]) or '0')
`)

// releaseScript uncounts a unit whose submission failed after it was
// recorded.
//
// KEYS[1..3] the owner's pending counter, open units and expiry set
// ARGV[1] the unit: a batch ID or a single task's ID
var releaseScript = redis.NewScript(quotaLua + `
release(KEYS[1], KEYS[2], KEYS[3], {[ARGV[1]] = math.huge})
return 0
`)

// ReleasePending uncounts unit (a single task's ID or a batch ID) from
// owner's quota, for a submission that is being undone.
func (s *Store) ReleasePending(ctx context.Context, owner, unit string) error {
	if owner == "" {
		return nil
	}
	if err := releaseScript.Run(ctx, s.rdb, s.k.owner(owner), unit).Err(); err != nil {
		return fmt.Errorf("store: release quota: %w", err)
	}
	return nil
}

// Pending returns how many of owner's tasks have not ended.
func (s *Store) Pending(ctx context.Context, owner string) (int, error) {
	n, err := pendingScript.Run(ctx, s.rdb, s.k.owner(owner)).Int()
	if err != nil {
		return 0, fmt.Errorf("store: pending count: %w", err)
	}
	return n, nil
}
