package store

import "github.com/redis/go-redis/v9"

// Task records move pending -> active -> completed|failed|canceled. Each
// move is one Lua script, so a record, its batch's counts and the wake-up
// message change together or not at all, and a task delivered twice moves
// (and counts) once.

// startScript marks a task active and counts the attempt.
//
// KEYS[1] task hash
// KEYS[2] batch hash (the task hash again when the task has no batch)
// ARGV[1] now, Unix milliseconds
// ARGV[2] "1" when the task belongs to a batch
//
// Returns the state before the call; "" when the record does not exist.
// Only "pending" and "active" mean the caller may run the task.
var startScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'state')
if not cur then return '' end
if cur ~= 'pending' and cur ~= 'active' then return cur end
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSETNX', KEYS[1], 'started_at', ARGV[1])
if cur == 'pending' then
  redis.call('HSET', KEYS[1], 'state', 'active')
  if ARGV[2] == '1' then
    redis.call('HINCRBY', KEYS[2], 'pending', -1)
    redis.call('HINCRBY', KEYS[2], 'active', 1)
  end
end
return cur
`)

// finishScript moves a task to a terminal state, updates its batch's
// counts and announces the change.
//
// KEYS[1] task hash
// KEYS[2] batch hash (the task hash again when the task has no batch)
// KEYS[3] the owner's pending counter (the task hash again when none)
//
// ARGV[1] new state: completed, failed or canceled
// ARGV[2] now, Unix milliseconds
// ARGV[3] "1" when the task belongs to a batch
// ARGV[4] events channel
// ARGV[5] task ID
// ARGV[6] batch ID ("" when none)
// ARGV[7] result JSON ("" when none)
// ARGV[8] error code ("" when none)
// ARGV[9] error message
// ARGV[10] "1" when the result came from the cache
// ARGV[11] "1" when the task has an owner whose pending count to lower
//
// Returns the state before the call; "" when the record does not exist.
// The move happened only when that state is "pending" or "active"; any
// other value means the task had already ended and nothing changed.
var finishScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'state')
if not cur then return '' end
if cur ~= 'pending' and cur ~= 'active' then return cur end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'completed_at', ARGV[2])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'result', ARGV[7]) end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'err_code', ARGV[8], 'err_msg', ARGV[9]) end
if ARGV[10] == '1' then redis.call('HSET', KEYS[1], 'cached', '1') end
redis.call('PUBLISH', ARGV[4], 't:' .. ARGV[5])
if ARGV[11] == '1' then
  if redis.call('DECR', KEYS[3]) < 0 then redis.call('SET', KEYS[3], 0) end
end
if ARGV[3] == '1' then
  redis.call('HINCRBY', KEYS[2], cur, -1)
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
  local ended = redis.call('HINCRBY', KEYS[2], 'ended', 1)
  if ended == tonumber(redis.call('HGET', KEYS[2], 'total')) then
    redis.call('HSET', KEYS[2], 'done_at', ARGV[2])
    redis.call('PUBLISH', ARGV[4], 'b:' .. ARGV[6])
  end
end
return cur
`)

// reserveScript admits n more pending tasks for an owner unless that would
// pass the quota.
//
// KEYS[1] the owner's pending counter
// ARGV[1] n
// ARGV[2] the quota
//
// Returns the new count, or -1 when the quota would be exceeded (and
// nothing changed).
var reserveScript = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return -1 end
return redis.call('INCRBY', KEYS[1], ARGV[1])
`)
