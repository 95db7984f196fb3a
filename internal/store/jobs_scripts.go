package store

import "github.com/redis/go-redis/v9"

// The scripts of the batch layout (docs/batches.md). Every change to a
// batch's counts is made by one of them, in the same call that writes the
// entries it counts, so counts, entries, quota and events never disagree.
//
// Invariants the scripts keep, on which their exactness rests:
//   - an item has ended exactly when its entry field <k> exists in its
//     chunk's res hash; only a script that finds it absent writes it, and
//     that script counts the item's move;
//   - while a unit's active marker exists, every item of the unit without
//     an entry is counted active (startUnitScript moves exactly those when
//     it sets the marker); without the marker, such an item is pending.

// batchLua holds the Lua helpers shared by the scripts that end items; it
// comes after quotaLua (it uses release). ARGV[1..4] of those scripts are
// the owner key affixes (keys.ownerAffixes), so the owner read from the
// batch record names its quota keys.
//
// is_own(kb) is true for an own-unit item's kind byte (uppercase).
// marker_field(kb, k) is the field of the active marker of item k's unit.
// parse_marker(v) returns attempts and started_at of a marker value.
// entry(st, started, attempts, now, head, result) builds an ended entry;
// head is extra JSON members ("" for none), result the inline result
// ("" for none), always last so that a reader can cut it off.
// settle(bk, batch, owner, j, delta, n, events, now) moves the batch's
// counts by delta, counts n more ended items, gives the owner's quota
// back, publishes c:<batch>:<j> and, when this ended the batch's last
// item, sets done_at and publishes b:<batch>.
const batchLua = `
local function is_own(kb) return kb >= 'A' and kb <= 'Z' end
local function marker_field(kb, k)
  if is_own(kb) then return 'a' .. k end
  return 'a'
end
local function parse_marker(v)
  local a, s = string.match(v, '^(%d+) (%d+)$')
  return tonumber(a), s
end
local function entry(st, started, attempts, now, head, result)
  local e = '{"state":"' .. st .. '"'
  if started then e = e .. ',"started_at":' .. started end
  e = e .. ',"completed_at":' .. now .. ',"attempts":' .. attempts
  if head ~= '' then e = e .. ',' .. head end
  if result ~= '' then e = e .. ',"size":' .. #result .. ',"result":' .. result end
  return e .. '}'
end
local function settle(bk, batch, owner, j, delta, n, events, now)
  if n == 0 then return end
  for st, d in pairs(delta) do
    if d ~= 0 then redis.call('HINCRBY', bk, st, d) end
  end
  local after = redis.call('HINCRBY', bk, 'ended', n)
  if owner ~= '' then
    local o = ARGV[1] .. owner
    release(o .. ARGV[2], o .. ARGV[3], o .. ARGV[4], {[batch] = n})
  end
  redis.call('PUBLISH', events, 'c:' .. batch .. ':' .. j)
  local total = tonumber(redis.call('HGET', bk, 'total'))
  if after - n < total and after >= total then
    redis.call('HSET', bk, 'done_at', now)
    redis.call('PUBLISH', events, 'b:' .. batch)
  end
end
local function lines_of(s)
  local out, pos = {}, 1
  while true do
    local nl = string.find(s, '\n', pos, true)
    if not nl then out[#out + 1] = string.sub(s, pos); return out end
    out[#out + 1] = string.sub(s, pos, nl - 1)
    pos = nl + 1
  end
end
`

// feedLua holds refill, shared by the commit and feed scripts. A batch's
// units enter the feed a window at a time, so that no script moves a
// million of them at once (Redis would stall every tenant for seconds):
// the commit moves the first window, and a refill mark "<batch>/+",
// scored halfway through each window, moves the next one when the feed
// script pops it. Unit k of a batch (1-based) is scored base+k however
// late it moves, so the order is the one a single move would give, and
// a batch with units waiting keeps between half a window and one and a
// half in the feed (what a ZCARD of the feed sees of it).
//
// refill(list, feed, batch, base, moved, units, w) pops up to w units
// from the batch's list into the feed, puts the next refill mark when
// units remain, and returns how many units have moved.
// backlogLua keeps the backlog (keys.backlog): one member per
// backlogUnits units of a batch not yet fed, so that its cardinality,
// which is all KEDA's redis scaler can read, counts every waiting unit
// (in buckets) however few of them sit in the feed's current window.
//
// backlog_set(z, batch, from, to, exp) makes the batch's members
// <batch>/b0 .. <batch>/b(to-1) exist (adding those at from.. when to >
// from, removing those at to.. below from when to < from); from and to
// are bucket counts, ceil(unfed / backlogUnits).
// buckets(unfed, per) is that count.
const backlogLua = `
local function buckets(unfed, per)
  if unfed <= 0 then return 0 end
  return math.floor((unfed + per - 1) / per)
end
local function backlog_set(z, batch, from, to, exp)
  local m = {}
  if to > from then
    for k = from, to - 1 do
      m[#m + 1] = exp
      m[#m + 1] = batch .. '/b' .. k
      if #m >= 2000 then redis.call('ZADD', z, unpack(m)); m = {} end
    end
    if #m > 0 then redis.call('ZADD', z, unpack(m)) end
  elseif to < from then
    for k = to, from - 1 do
      m[#m + 1] = batch .. '/b' .. k
      if #m >= 1000 then redis.call('ZREM', z, unpack(m)); m = {} end
    end
    if #m > 0 then redis.call('ZREM', z, unpack(m)) end
  end
end
`

const feedLua = backlogLua + `
local function refill(list, feed, batch, base, moved, units, w)
  local take = math.min(w, units - moved)
  local done = 0
  while done < take do
    local ms = redis.call('LPOP', list, math.min(1000, take - done))
    if not ms then break end
    local z = {}
    for i = 1, #ms do
      z[#z + 1] = string.format('%d', base + moved + done + i)
      z[#z + 1] = ms[i]
    end
    redis.call('ZADD', feed, unpack(z))
    done = done + #ms
  end
  if done > 0 and moved + done < units then
    redis.call('ZADD', feed, string.format('%d.5', base + moved + math.ceil(done / 2)), batch .. '/+')
  end
  return moved + done
end
`

// commitBatchScript makes a staged batch: it checks the Idempotency-Key
// claim, admits the batch's items against the owner's quota (the batch is
// one quota unit), writes the batch record, gives the staged keys the
// batch's expiry and gives the staged units fair scores (docs/batches.md,
// Fairness), moving the first window of them into the feed (see
// feedLua) from the staged list rather than from ARGV.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
// KEYS[3] batch units list
// KEYS[4] idempotency key (KEYS[1] again when none)
// KEYS[5..7] the owner's pending counter, open units and expiry set
//
//	(KEYS[1] thrice when there is no owner)
//
// KEYS[8] feed
// KEYS[9] the owner's virtual time
// KEYS[10] feed:vt
// KEYS[11] backlog
// KEYS[12] the owner's batch index (keys.ownerBatches)
//
// ARGV[1] now, Unix milliseconds (created_at)
// ARGV[2] record TTL, milliseconds
// ARGV[3] batch ID
// ARGV[4] owner ("" when auth is off)
// ARGV[5] format ("" for JSON)
// ARGV[6] the idempotency claim's value to check and keep ("" when none)
// ARGV[7] the owner's quota of unfinished items (0: unlimited)
// ARGV[8] total items
// ARGV[9] stride
// ARGV[10] chunks
// ARGV[11] units
// ARGV[12] the feed window: how many units move at a time
// ARGV[13] backlogUnits: waiting units per backlog member
// ARGV[14] the kinds of the batch's items, sorted, comma-separated
//
// Returns 1 when committed, 0 when the batch already exists (nothing
// changes), -1 when the quota would be passed, -2 when the claim is no
// longer ARGV[6] and -3 when the staged keys are gone or incomplete (for
// the last three, nothing is written).
var commitBatchScript = redis.NewScript(quotaLua + feedLua + `
local ttl, batch, owner, claim = tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[6]
local quota, total, units = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[11])
if claim ~= '' and redis.call('GET', KEYS[4]) ~= claim then return -2 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('LLEN', KEYS[3]) ~= units or (total > 0 and redis.call('EXISTS', KEYS[2]) == 0) then return -3 end
local t = clock()
local exp = t + ttl
if owner ~= '' and total > 0 then
  prune(KEYS[5], KEYS[6], KEYS[7], t)
  if quota > 0 and tonumber(redis.call('GET', KEYS[5]) or '0') + total > quota then return -1 end
  admit(KEYS[5], KEYS[6], KEYS[7], batch, total, exp)
end
local bf = {'total', total, 'stride', ARGV[9], 'chunks', ARGV[10], 'units', units,
  'created_at', ARGV[1], 'expires_at', exp, 'pending', total, 'active', 0,
  'completed', 0, 'failed', 0, 'canceled', 0, 'ended', 0}
if owner ~= '' then bf[#bf + 1] = 'owner'; bf[#bf + 1] = owner end
if ARGV[5] ~= '' then bf[#bf + 1] = 'format'; bf[#bf + 1] = ARGV[5] end
if total == 0 then bf[#bf + 1] = 'done_at'; bf[#bf + 1] = ARGV[1] end
if ARGV[14] ~= '' then bf[#bf + 1] = 'kinds'; bf[#bf + 1] = ARGV[14] end
redis.call('HSET', KEYS[1], unpack(bf))
redis.call('PEXPIREAT', KEYS[1], exp)
redis.call('ZADD', KEYS[12], ARGV[1], batch)
redis.call('ZREMRANGEBYSCORE', KEYS[12], '-inf', '(' .. (tonumber(ARGV[1]) - ttl))
redis.call('PEXPIREAT', KEYS[12], exp, 'GT')
if redis.call('PTTL', KEYS[12]) < 0 then redis.call('PEXPIREAT', KEYS[12], exp) end
if total > 0 then redis.call('PEXPIREAT', KEYS[2], exp) end
local base = math.floor(math.max(tonumber(redis.call('GET', KEYS[9]) or '0'), tonumber(redis.call('GET', KEYS[10]) or '0')))
local moved = refill(KEYS[3], KEYS[8], batch, base, 0, units, tonumber(ARGV[12]))
redis.call('HSET', KEYS[1], 'base', base, 'moved', moved, 'fed', 0)
backlog_set(KEYS[11], batch, 0, buckets(units, tonumber(ARGV[13])), exp)
if units > 0 then
  redis.call('PEXPIREAT', KEYS[3], exp)
  redis.call('SET', KEYS[9], string.format('%d', base + units), 'PXAT', exp)
end
if claim ~= '' then redis.call('SET', KEYS[4], claim, 'PXAT', exp) end
return 1
`)

// abandonCommitScript undoes a commit whose reply was lost, unless one of
// the batch's units has left the feed (it is being run, so the batch is
// kept). A batch that was never committed has its staged keys deleted.
// The batch's units in the feed are the ones it moved (see feedLua),
// found by their scores base+1..base+moved and their batch ID, and its
// refill mark when units remain in its list.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
// KEYS[3] batch units list
// KEYS[4] idempotency key (KEYS[1] again when none)
// KEYS[5..7] the owner's pending counter, open units and expiry set
//
//	(KEYS[1] thrice when there is no owner)
//
// KEYS[8] feed
// KEYS[9] backlog
// KEYS[10] the owner's batch index
//
// ARGV[1] batch ID
// ARGV[2] the idempotency claim's value ("" when none)
// ARGV[3] "1" when the batch has an owner whose quota counts it
// ARGV[4] the batch's res key without the chunk number
// ARGV[5] backlogUnits
//
// Returns 0 (BatchNotWritten), 1 (BatchAbandoned) or -1 (BatchKept).
var abandonCommitScript = redis.NewScript(quotaLua + backlogLua + `
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2], KEYS[3])
  return 0
end
local b = redis.call('HMGET', KEYS[1], 'units', 'chunks', 'base', 'moved')
local units, chunks = tonumber(b[1]) or 0, tonumber(b[2]) or 0
local base, moved = tonumber(b[3]) or 0, tonumber(b[4]) or 0
local mark = ARGV[1] .. '/+'
if moved < units and not redis.call('ZSCORE', KEYS[8], mark) then return -1 end
local mine, pre = {}, ARGV[1] .. '/'
if moved > 0 then
  local got = redis.call('ZRANGEBYSCORE', KEYS[8], string.format('%d', base + 1), string.format('%d', base + moved))
  for i = 1, #got do
    if string.sub(got[i], 1, #pre) == pre and got[i] ~= mark then mine[#mine + 1] = got[i] end
  end
end
if #mine < moved then return -1 end
for from = 1, #mine, 1000 do
  redis.call('ZREM', KEYS[8], unpack(mine, from, math.min(#mine, from + 999)))
end
redis.call('ZREM', KEYS[8], mark)
backlog_set(KEYS[9], ARGV[1], buckets(units, tonumber(ARGV[5])), 0, 0)
for j = 0, chunks - 1 do redis.call('DEL', ARGV[4] .. j) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[10], ARGV[1])
if ARGV[2] ~= '' and redis.call('GET', KEYS[4]) == ARGV[2] then redis.call('DEL', KEYS[4]) end
if ARGV[3] == '1' then release(KEYS[5], KEYS[6], KEYS[7], {[ARGV[1]] = math.huge}) end
return 1
`)

// enqueueFedScript puts units that the feed script took on asynq's queue
// and acknowledges them, in one call: per unit what asynq's enqueue
// script does (v0.26's enqueueCmd), then one LPUSH of the new tasks' IDs
// (in argument order, as one LPUSH per task would leave them) and one
// ZREM of the acknowledged units from the feeding set. A unit's fixed
// task ID may name a task asynq holds already:
//
//   - pending, scheduled, retry (or aggregating): it will run, and the
//     unit is acknowledged as queued, as asynq.Client's task ID conflict
//     has always been taken;
//   - archived (asynq gave up on it; a batch retry feeds the unit again)
//     or completed (kept for a retention): its hash goes and the unit is
//     queued afresh, or a retried item would never run;
//   - active: it runs now, perhaps past the items this feed is for (a
//     retry can feed a unit the moment it ended, before asynq's Done):
//     the unit is not acknowledged, and the reconciler feeds it again
//     after its grace, once the task is gone. At worst it runs twice,
//     which changes nothing: only an item without an entry runs.
//
// KEYS[1] the feeding set
// KEYS[2] asynq's pending list of the queue
// KEYS[3] asynq's set of queues
// KEYS[4], KEYS[5] asynq's archived and completed sets of the queue
// KEYS[5+i] asynq's task hash of unit i
// ARGV[1] now, Unix nanoseconds (asynq's pending_since)
// ARGV[2] the queue's name to add to asynq's set of queues; "" when this
// process has added it already
// ARGV[3i], ARGV[3i+1], ARGV[3i+2] for unit i: its task ID, its encoded
// task message (tasks.NewUnitEnqueued) and its feed member
//
// Returns the number of units acknowledged.
var enqueueFedScript = redis.NewScript(`
local n = #KEYS - 5
local ids, members = {}, {}
for i = 1, n do
  local a, k = 3 * i, KEYS[5 + i]
  local st = redis.call('HGET', k, 'state')
  if st == 'archived' or st == 'completed' then
    redis.call('ZREM', st == 'archived' and KEYS[4] or KEYS[5], ARGV[a])
    redis.call('DEL', k)
    st = false
  end
  if not st then
    redis.call('HSET', k, 'msg', ARGV[a + 1], 'state', 'pending', 'pending_since', ARGV[1])
    ids[#ids + 1] = ARGV[a]
  end
  if st ~= 'active' then members[#members + 1] = ARGV[a + 2] end
end
if #ids > 0 then redis.call('LPUSH', KEYS[2], unpack(ids)) end
if #members > 0 then redis.call('ZREM', KEYS[1], unpack(members)) end
if ARGV[2] ~= '' then redis.call('SADD', KEYS[3], ARGV[2]) end
return #members
`)

// feedScript takes units from the feed in score order while the bulk
// queue's pending list is short, dropping those of batches that are gone
// or canceled, and moves the rest to the feeding set. A refill mark it
// pops moves its batch's next window of units into the feed (see
// feedLua), or, for a batch gone or canceled, deletes the batch's list.
//
// KEYS[1] feed
// KEYS[2] feeding
// KEYS[3] feed:vt
// KEYS[4] the queue's asynq pending list
// KEYS[5] backlog
//
// ARGV[1] depth: the pending list's length to fill up to
// ARGV[2] the most units to take
// ARGV[3] now, Unix milliseconds (the feeding score)
// ARGV[4] the batch key without the batch ID
// ARGV[5] the most dropped members to pop in one call
// ARGV[6] the feed window
// ARGV[7] the most refills in one call
// ARGV[8] the batch units list's key after the batch ID
// ARGV[9] backlogUnits
// ARGV[10] low: take nothing unless the pending list is shorter than
// this (at most depth), so that a feeder called after every task feeds
// in batches of about depth - low rather than one unit per call
//
// It also lowers each fed batch's backlog members to its units still
// unfed, and drops members whose batch has expired.
//
// Returns the members taken.
var feedScript = redis.NewScript(feedLua + `
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. ARGV[3])
local waiting = redis.call('LLEN', KEYS[4])
local out = {}
if waiting >= tonumber(ARGV[10]) then return out end
local n = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) - waiting)
if n <= 0 then return out end
local live, dropped, last, refills = {}, 0, nil, 0
local fedBy = {}
local maxDrop, window, maxRefills = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
while #out < n and dropped < maxDrop and refills <= maxRefills do
  local got = redis.call('ZPOPMIN', KEYS[1], n - #out)
  if #got == 0 then break end
  local z = {}
  for i = 1, #got, 2 do
    local m = got[i]
    last = got[i + 1]
    local id = string.match(m, '^([^/]+)/')
    local ok = false
    if id then
      ok = live[id]
      if ok == nil then
        local f = redis.call('HMGET', ARGV[4] .. id, 'total', 'canceled_at')
        ok = (f[1] ~= false) and (f[2] == false)
        live[id] = ok
      end
    end
    if id and string.sub(m, -2) == '/+' then
      local list = ARGV[4] .. id .. ARGV[8]
      if ok then
        local bk = ARGV[4] .. id
        local f = redis.call('HMGET', bk, 'base', 'moved', 'units')
        local moved = refill(list, KEYS[1], id, tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), window)
        redis.call('HSET', bk, 'moved', moved)
        refills = refills + 1
      else
        redis.call('UNLINK', list)
        dropped = dropped + 1
      end
    elseif ok then
      out[#out + 1] = m
      z[#z + 1] = ARGV[3]
      z[#z + 1] = m
      fedBy[id] = (fedBy[id] or 0) + 1
    else
      dropped = dropped + 1
    end
  end
  if #z > 0 then redis.call('ZADD', KEYS[2], unpack(z)) end
end
if last then redis.call('SET', KEYS[3], last) end
local per = tonumber(ARGV[9])
for id, k in pairs(fedBy) do
  local bk = ARGV[4] .. id
  local f = redis.call('HMGET', bk, 'units', 'fed')
  local units, before = tonumber(f[1]) or 0, tonumber(f[2]) or 0
  local after = redis.call('HINCRBY', bk, 'fed', k)
  backlog_set(KEYS[5], id, buckets(units - before, per), buckets(units - after, per), 0)
end
return out
`)

// startUnitScript marks a unit active and returns its items that have not
// ended with their requests. The first delivery sets the unit's marker
// ("<attempts> <started_at ms>") and moves the runnable items' counts
// from pending to active; a redelivery only counts an attempt.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
//
// ARGV[1] now, Unix milliseconds
// ARGV[2] "c" for a chunk's unit, "x" for an own item's
// ARGV[3] the chunk (c) or the item (x)
// ARGV[4] the batch's res key without the chunk number (the chunk of an
// own item depends on the stride, which the script reads)
//
// Returns {} when the batch is gone, {owner} when it is canceled (no
// item runs, but the worker hands on its owner's slot: tasks.Gate's
// PassSlot), else {owner, index_1, request_1, index_2, request_2, ...},
// or, for a chunk's first delivery with no entry or marker yet, {owner,
// "*", the chunk's first index, the chunk's kind bytes, its request
// lines}: every item whose kind byte is lowercase runs, with
// the line of its offset.
var startUnitScript = redis.NewScript(batchLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'stride', 'total', 'expires_at', 'canceled_at')
if not b[3] then return {} end
if b[5] then return {b[1] or ''} end
local owner, stride, total = b[1] or '', tonumber(b[2]), tonumber(b[3])
local chunk, n = ARGV[2] == 'c', tonumber(ARGV[3])
local j = n
if not chunk then j = math.floor(n / stride) end
local rk = ARGV[4] .. j
local m = redis.call('HGET', KEYS[2], 'm' .. j)
if not m then return {} end
if chunk and redis.call('EXISTS', rk) == 0 then
  -- The first delivery of a chunk none of whose items has an entry or a
  -- marker (the common case): every cheap item runs. What the loop below
  -- does per item, in Lua, is done here by C (gsub counts the own items'
  -- uppercase bytes) and the worker splits the chunk's lines itself.
  local run = #m - select(2, string.gsub(m, '[A-Z]', ''))
  if run == 0 then return {owner} end
  redis.call('HSET', rk, 'a', '1 ' .. ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'pending', -run)
  redis.call('HINCRBY', KEYS[1], 'active', run)
  redis.call('PEXPIREAT', rk, b[4])
  return {owner, '*', tostring(j * stride), m, redis.call('HGET', KEYS[2], tostring(j)) or ''}
end
local offs = {}
if chunk then
  for k = 1, #m do
    if not is_own(string.sub(m, k, k)) then offs[#offs + 1] = k - 1 end
  end
else
  local k = n - j * stride
  if n >= total or k < 0 or k >= #m or not is_own(string.sub(m, k + 1, k + 1)) then return {} end
  offs[1] = k
end
if #offs == 0 then return {owner} end
local ents = redis.call('HMGET', rk, unpack(offs))
local run = {}
for i = 1, #offs do
  if not ents[i] then run[#run + 1] = offs[i] end
end
if #run == 0 then return {owner} end
local f = marker_field(string.sub(m, run[1] + 1, run[1] + 1), run[1])
local mv = redis.call('HGET', rk, f)
if not mv then
  redis.call('HSET', rk, f, '1 ' .. ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'pending', -#run)
  redis.call('HINCRBY', KEYS[1], 'active', #run)
else
  local a, s = parse_marker(mv)
  redis.call('HSET', rk, f, (a + 1) .. ' ' .. s)
end
redis.call('PEXPIREAT', rk, b[4])
local out = {owner}
if chunk then
  local lines = lines_of(redis.call('HGET', KEYS[2], tostring(j)) or '')
  for i = 1, #run do
    out[#out + 1] = tostring(j * stride + run[i])
    out[#out + 1] = lines[run[i] + 1] or ''
  end
else
  out[2] = tostring(n)
  out[3] = redis.call('HGET', KEYS[2], 'x' .. n) or ''
end
return out
`)

// yieldUnitScript takes back what startUnitScript did for an own item
// whose run was told to wait for its owner's expensive slots
// (admitSlotScript): the attempt it counted goes, and when that start set
// the item's active marker (one attempt), the marker goes too and the
// item is counted pending again, which is what it is while it waits. A
// marker of more attempts stays: another delivery of the unit may be
// running it (a watchdog's copy), and an active item that waits is the
// smaller error than a running one counted pending. An item that has
// ended is left alone.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
//
// ARGV[1] the item
// ARGV[2] the batch's res key without the chunk number
//
// Returns 1 when the item is pending again, else 0.
var yieldUnitScript = redis.NewScript(batchLua + `
local stride = tonumber(redis.call('HGET', KEYS[1], 'stride'))
if not stride then return 0 end
local n = tonumber(ARGV[1])
local j = math.floor(n / stride)
local k = n - j * stride
local rk = ARGV[2] .. j
if redis.call('HEXISTS', rk, k) == 1 then return 0 end
local f = 'a' .. k
local mv = redis.call('HGET', rk, f)
if not mv then return 0 end
local a, st = parse_marker(mv)
if a > 1 then
  redis.call('HSET', rk, f, (a - 1) .. ' ' .. st)
  return 0
end
redis.call('HDEL', rk, f)
redis.call('HINCRBY', KEYS[1], 'active', -1)
redis.call('HINCRBY', KEYS[1], 'pending', 1)
return 1
`)

// finishUnitScript writes the ended entries of a unit's items that have
// none yet (a duplicate delivery, or an item canceled meanwhile, changes
// nothing), stores a cached item's result once in the cache entry (the
// entry refers to it), and settles the counts (see batchLua).
//
// Every item of a unit shares one active marker (a chunk's "a", an own
// item's "a<k>"), so the entry's start of each state ({"state",
// "started_at", "completed_at", "attempts") is built once per call, and
// the rest of each entry (its head members and inline result) comes built
// from the worker: per item the script does a few table operations, not
// the string building and parsing that cost 5-6 µs of Redis per item
// (BENCHMARKS.md, "The unit scripts").
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
// KEYS[2+i] outcome i's cache entry (KEYS[1] when its result is inline)
//
// ARGV[1..4] owner key affixes
// ARGV[5] now, Unix milliseconds
// ARGV[6] events channel
// ARGV[7] batch ID
// ARGV[8] "c" or "x"
// ARGV[9] the chunk (c) or the item (x)
// ARGV[10] the batch's res key without the chunk number
// ARGV[11] ResultTTL, milliseconds
// then 4 values per outcome i, from ARGV[12+4(i-1)]: item index, state
// (completed or failed), the entry's rest after its attempts (its other
// members, each after a comma, and the closing brace), and the result to
// store in the cache entry KEYS[2+i] ("" when none)
//
// Returns how many items it ended.
var finishUnitScript = redis.NewScript(quotaLua + batchLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'stride', 'total', 'expires_at')
if not b[3] then return 0 end
local owner, stride, total, exp = b[1] or '', tonumber(b[2]), tonumber(b[3]), tonumber(b[4])
local chunk, n = ARGV[8] == 'c', tonumber(ARGV[9])
local j = n
if not chunk then j = math.floor(n / stride) end
local rk = ARGV[10] .. j
local m = redis.call('HGET', KEYS[2], 'm' .. j)
if not m then return 0 end
local delta, ended = {}, 0
local rttl = tonumber(ARGV[11])
local nout = #KEYS - 2
local base = j * stride
local fields = {}
for i = 1, nout do fields[i] = tonumber(ARGV[12 + 4 * (i - 1)]) - base end
local have = redis.call('HMGET', rk, unpack(fields))
local mf = 'a'
if not chunk then mf = 'a' .. (n - base) end
local mv = redis.call('HGET', rk, mf)
local attempts, started, prev = 0, nil, 'pending'
if mv then
  attempts, started = parse_marker(mv)
  prev = 'active'
end
local pre = {}
local hs, hd, seen = {}, {}, {}
local nm = #m
for i = 1, nout do
  local a = 12 + 4 * (i - 1)
  local k = fields[i]
  local ok = k >= 0 and k < nm and not have[i] and not seen[k]
  if ok then
    local c = string.byte(m, k + 1)
    local own = c >= 65 and c <= 90
    if chunk then ok = not own else ok = k == n - base and own end
  end
  if ok then
    seen[k] = true
    local st = ARGV[a + 1]
    local p = pre[st]
    if not p then
      p = entry(st, started, attempts, ARGV[5], '', '')
      p = string.sub(p, 1, #p - 1)
      pre[st] = p
    end
    local ck, res = KEYS[2 + i], ARGV[a + 3]
    if ck ~= KEYS[1] and res ~= '' then
      redis.call('SET', ck, res, 'NX', 'PX', rttl)
      redis.call('PEXPIREAT', ck, math.max(exp, clock() + rttl), 'GT')
    end
    hs[#hs + 1] = k
    hs[#hs + 1] = p .. ARGV[a + 2]
    hd[#hd + 1] = 'p' .. k
    delta[st] = (delta[st] or 0) + 1
    ended = ended + 1
  end
end
if ended > 0 then
  delta[prev] = (delta[prev] or 0) - ended
  redis.call('HSET', rk, unpack(hs))
  redis.call('HDEL', rk, unpack(hd))
  redis.call('PEXPIREAT', rk, exp)
  settle(KEYS[1], ARGV[7], owner, j, delta, ended, ARGV[6], ARGV[5])
end
return ended
`)

// finishChunkScript is finishUnitScript for the common case, a chunk's
// first delivery finishing in one call: its res hash holds nothing but
// the start's marker (no item has an entry, a progress field or a marker
// of its own), so no item can have ended and there is nothing to delete.
// The worker sends every entry whole (it knows the marker, which is what
// the entry's start is built from), and the script checks that each
// offset is one of the chunk's cheap items, once, then writes them all
// in one HSET straight from ARGV. It costs about a third of
// finishUnitScript per item (BENCHMARKS.md, "The finish's fast path"):
// no HMGET of the entries, no HDEL of progress fields, no string built
// per item, and no key per item. In any other case (the marker is not
// the one the worker started, the hash holds more, an offset does not
// check) it changes nothing and returns -1, and the caller sends the
// same outcomes to finishUnitScript.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
//
// ARGV[1..4] owner key affixes
// ARGV[5] now, Unix milliseconds (the entries' completed_at)
// ARGV[6] events channel
// ARGV[7] batch ID
// ARGV[8] the chunk
// ARGV[9] the batch's res key without the chunk number
// ARGV[10] the marker the start wrote: "1 <started_at>"
// ARGV[11] how many of the entries are completed (the rest failed)
// ARGV[12] the chunk's first index as the start answered it (two chunks
// started in the same millisecond hold the same marker, so this is what
// ties the mark to this chunk)
// then pairs from ARGV[13]: an item's offset in the chunk, its entry
//
// Returns how many items it ended, or -1 to take the general path.
var finishChunkScript = redis.NewScript(quotaLua + batchLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'stride', 'total', 'expires_at')
if not b[3] then return 0 end
local j = tonumber(ARGV[8])
if tonumber(ARGV[12]) ~= j * tonumber(b[2]) then return -1 end
local rk = ARGV[9] .. j
if redis.call('HGET', rk, 'a') ~= ARGV[10] or redis.call('HLEN', rk) ~= 1 then return -1 end
local m = redis.call('HGET', KEYS[2], 'm' .. j)
if not m then return 0 end
local nm, seen = #m, {}
for a = 13, #ARGV, 2 do
  local k = tonumber(ARGV[a])
  if not k or k < 0 or k >= nm or seen[k] then return -1 end
  local c = string.byte(m, k + 1)
  if c >= 65 and c <= 90 then return -1 end
  seen[k] = true
end
local ended = (#ARGV - 12) / 2
if ended == 0 then return 0 end
local done = tonumber(ARGV[11])
redis.call('HSET', rk, unpack(ARGV, 13, #ARGV))
redis.call('PEXPIREAT', rk, b[4])
settle(KEYS[1], ARGV[7], b[1] or '', j, {active = -ended, completed = done, failed = ended - done}, ended, ARGV[6], ARGV[5])
return ended
`)

// cancelItemsScript cancels the items of one chunk that have not ended:
// the listed offsets, or all of the chunk's items. Each gets a canceled
// entry, its count moves from active (its unit's marker is set) or
// pending, the quota is given back and the events published (see
// batchLua); an item that was active is announced on the cancels
// channel, so its worker aborts it.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
// KEYS[3] res hash of the chunk
//
// ARGV[1..4] owner key affixes
// ARGV[5] now, Unix milliseconds
// ARGV[6] events channel
// ARGV[7] batch ID
// ARGV[8] the chunk
// ARGV[9] cancels channel
// ARGV[10] the entry's error JSON member
// ARGV[11..] the offsets in the chunk to cancel (none: every item)
//
// Returns {canceled, state_1, state_2, ...}: how many it canceled and,
// for each listed offset, its state before ("" when the batch or item is
// gone).
var cancelItemsScript = redis.NewScript(quotaLua + batchLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'stride', 'total', 'expires_at')
if not b[3] then return {'0'} end
local owner, stride, total, exp = b[1] or '', tonumber(b[2]), tonumber(b[3]), tonumber(b[4])
local j = tonumber(ARGV[8])
local m = redis.call('HGET', KEYS[2], 'm' .. j) or ''
local offs = {}
if #ARGV > 10 then
  for a = 11, #ARGV do offs[#offs + 1] = tonumber(ARGV[a]) end
else
  for k = 0, #m - 1 do offs[#offs + 1] = k end
end
local out = {'0'}
if #offs == 0 then return out end
local ents = redis.call('HMGET', KEYS[3], unpack(offs))
local markers, delta, ended = {}, {}, 0
local hs, hd, seen = {}, {}, {}
for i = 1, #offs do
  local k = offs[i]
  local prior = ''
  if seen[k] then
    prior = 'canceled'
  elseif ents[i] then
    prior = string.match(ents[i], '^{"state":"(%a+)"') or ''
  elseif k >= 0 and k < #m and j * stride + k < total then
    seen[k] = true
    local kb = string.sub(m, k + 1, k + 1)
    local f = marker_field(kb, k)
    local mv = markers[f]
    if mv == nil then
      mv = redis.call('HGET', KEYS[3], f)
      markers[f] = mv
    end
    local attempts, started = 0, nil
    prior = 'pending'
    if mv then
      attempts, started = parse_marker(mv)
      prior = 'active'
      redis.call('PUBLISH', ARGV[9], ARGV[7] .. '-' .. (j * stride + k))
    end
    hs[#hs + 1] = k
    hs[#hs + 1] = entry('canceled', started, attempts, ARGV[5], ARGV[10], '')
    hd[#hd + 1] = 'p' .. k
    delta[prior] = (delta[prior] or 0) - 1
    delta['canceled'] = (delta['canceled'] or 0) + 1
    ended = ended + 1
  end
  out[#out + 1] = prior
end
if ended > 0 then
  redis.call('HSET', KEYS[3], unpack(hs))
  redis.call('HDEL', KEYS[3], unpack(hd))
  redis.call('PEXPIREAT', KEYS[3], exp)
  settle(KEYS[1], ARGV[7], owner, j, delta, ended, ARGV[6], ARGV[5])
end
out[1] = tostring(ended)
return out
`)

// markCanceledScript marks a batch canceled, so that the feed drops its
// units and no unit of it starts, before its chunks are canceled. A batch
// whose items have all ended is left as it is: nothing of it was
// canceled, and the answer says whether an earlier cancel had marked it,
// so that a retried cancel is told apart from one that came too late.
//
// Its members in the backlog go too: nothing of it waits any more.
//
// KEYS[1] batch hash
// KEYS[2] backlog
// ARGV[1] now, Unix milliseconds
// ARGV[2] batch ID
// ARGV[3] backlogUnits
//
// Returns the number of chunks to cancel: 0 when the batch is done and
// was canceled before, -2 when it is done and was never canceled, -1 when
// it does not exist.
var markCanceledScript = redis.NewScript(backlogLua + `
local b = redis.call('HMGET', KEYS[1], 'chunks', 'total', 'ended', 'units', 'fed')
if not b[1] then return -1 end
if tonumber(b[3]) >= tonumber(b[2]) then
  if redis.call('HEXISTS', KEYS[1], 'canceled_at') == 1 then return 0 end
  return -2
end
redis.call('HSETNX', KEYS[1], 'canceled_at', ARGV[1])
local per = tonumber(ARGV[3])
backlog_set(KEYS[2], ARGV[2], buckets((tonumber(b[4]) or 0) - (tonumber(b[5]) or 0), per), 0, 0)
return tonumber(b[1])
`)

// itemProgressScript records a batch item's progress while it has not
// ended.
//
// KEYS[1] batch hash
// KEYS[2] res hash of the item's chunk
// ARGV[1] the item's offset in its chunk
// ARGV[2] progress JSON
//
// Returns 1 when written.
var itemProgressScript = redis.NewScript(`
local exp = redis.call('HGET', KEYS[1], 'expires_at')
if not exp or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
redis.call('HSET', KEYS[2], 'p' .. ARGV[1], ARGV[2])
redis.call('PEXPIREAT', KEYS[2], exp)
return 1
`)

// readItemsScript reads items [first, first+count) of a batch, clamped to
// its total, as task records: the batch's owner and creation time, and per
// item its kind byte, custom ID line, entry, active marker, progress and
// (for an entry that refers to the cache) the cached result. GetItem uses
// it, one item in one round trip; reads of many items (reads.go) use
// plain commands, decoded in the API, instead. Read-only.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
//
// ARGV[1] the batch's res key without the chunk number
// ARGV[2] the cache key without the hash
// ARGV[3] first index
// ARGV[4] count
//
// Returns {} when the batch is gone, else {owner, created_at, total,
// stride, then 6 values per item}.
var readItemsScript = redis.NewScript(`
` + batchLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'created_at', 'total', 'stride')
if not b[3] then return {} end
local total, stride = tonumber(b[3]), tonumber(b[4]) or 0
local out = {b[1] or '', b[2] or '', b[3], b[4] or '0'}
if stride <= 0 then return out end
local first, last = tonumber(ARGV[3]), math.min(total, tonumber(ARGV[3]) + tonumber(ARGV[4])) - 1
local cj, m, ids, rk = -1, '', nil, ''
for idx = first, last do
  local j = math.floor(idx / stride)
  local k = idx - j * stride
  if j ~= cj then
    cj = j
    m = redis.call('HGET', KEYS[2], 'm' .. j) or ''
    local il = redis.call('HGET', KEYS[2], 'i' .. j)
    ids = il and lines_of(il) or nil
    rk = ARGV[1] .. j
  end
  local kb = string.sub(m, k + 1, k + 1)
  local r = redis.call('HMGET', rk, tostring(k), marker_field(kb == '' and 's' or kb, k), 'p' .. k)
  local e, extra = r[1] or '', ''
  if e ~= '' then
    local ref = string.match(e, ',"ref":(%b"")')
    if ref then
      extra = redis.call('GET', ARGV[2] .. cjson.decode(ref)) or ''
    end
  end
  out[#out + 1] = kb
  out[#out + 1] = ids and ids[k + 1] or ''
  out[#out + 1] = e
  out[#out + 1] = r[2] or ''
  out[#out + 1] = r[3] or ''
  out[#out + 1] = extra
end
return out
`)
