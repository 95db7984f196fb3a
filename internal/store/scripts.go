package store

import "github.com/redis/go-redis/v9"

// Task records move pending -> active -> completed|failed|canceled. Each
// move is one Lua script, so a record, its owner's quota count and the
// wake-up message change together or not at all, and a task delivered twice moves
// (and counts) once.

// submitScript records a single submission in one round trip: it answers
// from the cache when it can (the record is created completed), and
// otherwise counts the task against its owner's quota (see quotaLua),
// creates the pending record and enqueues the task on asynq's queue, as
// asynq's own enqueue script does (its HSET and LPUSH, and its queue in
// the set of queues), so the record and the queued task exist together or
// not at all.
//
// KEYS[1] task hash
// KEYS[2] cache entry
// KEYS[3..5] the owner's pending counter, open units and expiry set (the
//
//	task hash thrice when there is no owner)
//
// KEYS[6] the owner's task index (keys.ownerTasks)
// KEYS[7] asynq's task hash, KEYS[8] its queue's pending list, KEYS[9]
//
//	asynq's set of queues (the task hash thrice when nothing is enqueued)
//
// ARGV[1] now, Unix milliseconds
// ARGV[2] record TTL, seconds
// ARGV[3] kind
// ARGV[4] owner ("" when auth is off)
// ARGV[5] cache key (kept in the record)
// ARGV[6] the owner's quota of pending tasks (0: unlimited)
// ARGV[7] task ID (its unit in the quota, and asynq's task ID)
// ARGV[8] asynq's encoded task message (asynqdata.Solve); "" to
//
//	record the task without enqueueing it
//
// ARGV[9] now, Unix nanoseconds (asynq's pending_since)
// ARGV[10] the queue's name to add to asynq's set of queues; "" when
//
//	this process has added it already (as asynq.Client remembers it)
//
// The record is written by record (recordLua).
//
// Returns {1, result} for a cache hit, {0, ""} for a new pending task,
// {-1, ""} when the quota is exhausted and {-2, ""} when asynq already
// holds a task of that ID (nothing written for either).
var submitScript = redis.NewScript(quotaLua + recordLua + `
local hit = redis.call('GET', KEYS[2])
if not hit then
  if ARGV[8] ~= '' and redis.call('EXISTS', KEYS[7]) == 1 then return {-2, ''} end
  if ARGV[4] ~= '' then
    local now = clock()
    prune(KEYS[3], KEYS[4], KEYS[5], now)
    local q = tonumber(ARGV[6])
    if q > 0 and tonumber(redis.call('GET', KEYS[3]) or '0') + 1 > q then return {-1, ''} end
    admit(KEYS[3], KEYS[4], KEYS[5], ARGV[7], 1, now + tonumber(ARGV[2]) * 1000)
  end
end
record(KEYS[1], KEYS[6], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[7], hit)
if hit then return {1, hit} end
if ARGV[8] ~= '' then
  redis.call('HSET', KEYS[7], 'msg', ARGV[8], 'state', 'pending', 'pending_since', ARGV[9])
  redis.call('LPUSH', KEYS[8], ARGV[7])
  if ARGV[10] ~= '' then redis.call('SADD', KEYS[9], ARGV[10]) end
end
return {0, ''}
`)

// recordLua defines record, which writes a single task's record as a
// submission creates it: pending, or completed from the cache when hit
// is the cached result. Both submit scripts call it, so a hit's record is
// the same whichever wrote it.
//
// record(task, index, now, ttl, kind, owner, key, id, hit): task is the
// record's hash, index the owner's task index (keys.ownerTasks), now the
// time in Unix ms, ttl the record's TTL in seconds, key the cache key
// kept in the record, id the task's ID.
//
// The owner's task index is trimmed of members older than the record TTL
// only by a submission whose ID ends in "0": IDs are random hex
// (api.newID), so one submission in 16 trims, and the index holds the
// live records plus the ones that expired since its owner's last ~16
// submissions (reads skip and drop those). Trimming on every submission
// would be one command in 30 of a single task's.
//
// The record is written by one HSET, owner and cached result included,
// not one HSET per group of fields.
const recordLua = `
local function record(task, index, now, ttl, kind, owner, key, id, hit)
  local f = {'kind', kind, 'state', hit and 'completed' or 'pending', 'created_at', now, 'attempts', 0, 'key', key}
  if owner ~= '' then f[#f + 1] = 'owner'; f[#f + 1] = owner end
  if hit then
    f[#f + 1] = 'result'; f[#f + 1] = hit
    f[#f + 1] = 'cached'; f[#f + 1] = '1'
    f[#f + 1] = 'completed_at'; f[#f + 1] = now
  end
  redis.call('HSET', task, unpack(f))
  redis.call('EXPIRE', task, ttl)
  redis.call('ZADD', index, now, id)
  if string.byte(id, -1) == 48 then
    redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. (tonumber(now) - tonumber(ttl) * 1000))
  end
  redis.call('EXPIRE', index, ttl)
end
`

// submitHitScript answers a single submission from the cache alone: the
// API calls it instead of submitScript for a puzzle whose answer it saw
// cached, so that a hit carries no asynq message, no quota keys and a
// shorter script. On a miss it writes nothing, and the API
// submits with submitScript.
//
// KEYS[1] task hash, KEYS[2] cache entry, KEYS[3] the owner's task index
// ARGV[1] now, Unix milliseconds; ARGV[2] record TTL, seconds; ARGV[3]
// kind; ARGV[4] owner; ARGV[5] cache key; ARGV[6] task ID
//
// Returns {1, result} for a hit (the record written as submitScript
// writes a hit's) and {0, ""} for a miss.
var submitHitScript = redis.NewScript(recordLua + `
local hit = redis.call('GET', KEYS[2])
if not hit then return {0, ''} end
record(KEYS[1], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], hit)
return {1, hit}
`)

// startManyScript marks up to maxPerScript single tasks active in one
// call. Per task: a task that is pending or active counts an attempt,
// gets started_at once and becomes active; a task in any other state (or
// gone) is left alone, so only pending and active tasks may run. The
// cached answers are looked up with one MGET. (Batch items are not task
// records: startUnitScript starts them.)
//
// KEYS[2i-1], KEYS[2i] for task i = 1..n: its task hash, and the cache
//
//	entry of its puzzle (its task hash again when unknown)
//
// ARGV[1] now, Unix milliseconds
// ARGV[1+i] "1" when task i's second key is a cache entry
//
// Returns {state_1, hit_1, state_2, hit_2, ...}: per task its state before
// the call ("" when the record does not exist) and its cached result (""
// on a miss or when the task may not run). Only "pending" and "active"
// mean the caller may run the task.
var startManyScript = redis.NewScript(`
local out = {}
local lookups, at = {}, {}
local n = #KEYS / 2
for i = 1, n do
  local tk = KEYS[2 * i - 1]
  local rec = redis.call('HMGET', tk, 'state', 'attempts', 'started_at')
  local cur = rec[1]
  if not cur then
    cur = ''
  elseif cur == 'pending' or cur == 'active' then
    local f = {'attempts', (tonumber(rec[2]) or 0) + 1}
    if not rec[3] then f[3] = 'started_at'; f[4] = ARGV[1] end
    if cur == 'pending' then
      f[#f + 1] = 'state'; f[#f + 1] = 'active'
    end
    redis.call('HSET', tk, unpack(f))
    if ARGV[1 + i] == '1' then
      lookups[#lookups + 1] = KEYS[2 * i]
      at[#at + 1] = 2 * i
    end
  end
  out[2 * i - 1] = cur
  out[2 * i] = ''
end
if #lookups > 0 then
  local hits = redis.call('MGET', unpack(lookups))
  for j = 1, #lookups do
    if hits[j] then out[at[j]] = hits[j] end
  end
end
return out
`)

// finishManyScript ends up to maxPerScript single tasks of one owner (or
// none) in one call. Per task: only a pending or active task moves to its
// terminal state (so a duplicate delivery or a cancel that won changes
// and counts nothing), with its result or error and completed_at, and
// "t:<id>" is published for long polls. Then, once for the whole call,
// it uncounts the tasks it ended from the owner's quota (each single task
// is its own unit; see quotaLua). (Batch items are not task records:
// finishUnitScript and cancelItemsScript end them.)
//
// A task whose cache flag is set has its result cached first, whether or
// not this call ends it (a duplicate delivery solved it too): SET NX with
// the result TTL, and only when the entry exists already a PEXPIRE GT,
// since batch items refer to entries whose TTL finishUnitScript raised
// to their batch's and an existing entry is the same puzzle's answer. In
// the script a new entry costs one command; the pipeline's SET NX and
// EXPIRE GT cost two.
//
// KEYS[1..3] the owner's pending counter, open units and expiry set (the
//
//	first task hash thrice when none)
//
// KEYS[2+2i] task i's hash, i = 1..n, and KEYS[3+2i] its cache entry
// (its hash again when not cached)
//
// ARGV[1] now, Unix milliseconds
// ARGV[2] "1" when the tasks have an owner whose quota count to lower
// ARGV[3] events channel
// ARGV[4] the largest result (with error message) whose record the
//
//	event of a task carries, in bytes
//
// ARGV[5] the result cache's TTL, milliseconds (0: none)
// ARGV[6] the prefix of a task's event (TaskEventKey(""))
//
// then 8 values per task i, from ARGV[8i-1]:
// ARGV[8i-1] new state: completed, failed or canceled
// ARGV[8i]   task ID
// ARGV[8i+1] result JSON ("" when none)
// ARGV[8i+2] error code ("" when none)
// ARGV[8i+3] error message
// ARGV[8i+4] "1" when the result came from the cache
// ARGV[8i+5] "1" when the task ran without startManyScript (an instant
//
//	solve): this call counts its attempt and sets started_at
//
// ARGV[8i+6] "1" to cache the result under KEYS[3+2i]
//
// The event of a task carries its ended record, "t:<id> <the hash's
// fields>", so a long poll answers from it without reading the record
// again; a record with a larger result is announced as "t:<id>" alone and
// read. The fields are netstring-like, "<len>:<name><len>:<value>" for
// each (decodeEventFields): no escaping in Lua, no JSON reflection in the
// API, where decoding a cjson object per long poll costs 2% of its
// CPU.
//
// Returns each task's state before the call, "" when the record does not
// exist. A task moved only when that state is "pending" or "active"; any
// other value means it had already ended and nothing changed for it.
var finishManyScript = redis.NewScript(quotaLua + `
local out = {}
local ends = {}
local ended = 0
local n = (#KEYS - 3) / 2
for i = 1, n do
  local tk = KEYS[2 + 2 * i]
  local a = 8 * i - 1
  if ARGV[a + 7] == '1' then
    local ck = KEYS[3 + 2 * i]
    if ARGV[5] == '0' then
      redis.call('SET', ck, ARGV[a + 2], 'NX')
    elseif not redis.call('SET', ck, ARGV[a + 2], 'PX', ARGV[5], 'NX') then
      redis.call('PEXPIRE', ck, ARGV[5], 'GT')
    end
  end
  local cur, rec
  local kv = redis.call('HGETALL', tk)
  if #kv > 0 then
    rec = {}
    for j = 1, #kv, 2 do rec[kv[j]] = kv[j + 1] end
    cur = rec.state
  end
  if not cur then
    cur = ''
  elseif cur == 'pending' or cur == 'active' then
    local st = ARGV[a]
    local f = {'state', st, 'completed_at', ARGV[1]}
    if ARGV[a + 2] ~= '' then f[#f + 1] = 'result'; f[#f + 1] = ARGV[a + 2] end
    if ARGV[a + 3] ~= '' then
      f[#f + 1] = 'err_code'; f[#f + 1] = ARGV[a + 3]
      f[#f + 1] = 'err_msg'; f[#f + 1] = ARGV[a + 4]
    end
    if ARGV[a + 5] == '1' then f[#f + 1] = 'cached'; f[#f + 1] = '1' end
    if ARGV[a + 6] == '1' then
      f[#f + 1] = 'attempts'; f[#f + 1] = tostring((tonumber(rec.attempts) or 0) + 1)
      if not rec.started_at then f[#f + 1] = 'started_at'; f[#f + 1] = ARGV[1] end
    end
    redis.call('HSET', tk, unpack(f))
    local msg = ARGV[6] .. ARGV[a + 1]
    if #ARGV[a + 2] + #ARGV[a + 4] <= tonumber(ARGV[4]) then
      for j = 1, #f, 2 do rec[f[j]] = f[j + 1] end
      local parts = {}
      for k, v in pairs(rec) do parts[#parts + 1] = #k .. ':' .. k .. #v .. ':' .. v end
      msg = msg .. ' ' .. table.concat(parts)
    end
    redis.call('PUBLISH', ARGV[3], msg)
    ended = ended + 1
    local unit = ARGV[a + 1]
    ends[unit] = (ends[unit] or 0) + 1
  end
  out[i] = cur
end
if ended > 0 and ARGV[2] == '1' then release(KEYS[1], KEYS[2], KEYS[3], ends) end
return out
`)
