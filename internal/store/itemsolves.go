package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/tasks"
)

// The gate for a batch's expensive items (tasks.ItemGate): an own unit's
// item that is a search goes through the same leases as an expensive
// single task (solves.go), so that it counts against its key's cap of
// slots (keys.ownerRunning, member = the item's ID) and joins, or leads,
// the one solve in flight of its puzzle (keys.solve, keys.solveWaiters,
// field = the item's ID). The item's res hash keeps, beside its entry and
// marker, "s<k>": the key of the solve it waits on (for cancels), and
// "w<k>": how often it was told to wait (for its backoff).

// peekItemScript reads an own unit's item without starting it: its
// owner, request and whether it has ended. Read-only.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
// ARGV[1] the item's index
// ARGV[2] the batch's res key without the chunk number
//
// Returns {} when the batch or the item's own request is gone, else
// {owner, request, ended}: ended is "1" when the item has an entry or the
// batch was canceled.
var peekItemScript = redis.NewScript(`
local b = redis.call('HMGET', KEYS[1], 'owner', 'stride', 'total', 'canceled_at')
if not b[3] then return {} end
local idx = tonumber(ARGV[1])
if idx >= tonumber(b[3]) then return {} end
local req = redis.call('HGET', KEYS[2], 'x' .. idx)
if not req then return {} end
local stride = tonumber(b[2])
local j = math.floor(idx / stride)
local ended = '0'
if b[4] or redis.call('HEXISTS', ARGV[2] .. j, tostring(idx - j * stride)) == 1 then ended = '1' end
return {b[1] or '', req, ended}
`)

// admitItemScript decides what one run of a batch's expensive item does
// (tasks.Verdict), as admitScript does for a single task, in the same
// order:
//
//  1. An item that has not ended becomes a waiter of its solve (and its
//     res hash keeps the solve's key, "s<k>", for cancels). One that has
//     ended runs only on behalf of live waiters: with none, skip.
//  2. A cached answer: hit.
//  3. Another run holds the solve's lease: joined. The item becomes
//     active (its unit's marker, as startUnitScript sets it) and holds
//     no slot.
//  4. The owner's live slots are at the cap, and this item holds none of
//     them: wait, counting the wait in "w<k>". The item stays pending.
//     How long: the singles' backoff (1 s, a second more every fourth
//     wait, at most 10 s), or longer when the key has many items waiting
//     (keys.ownerWaiting): n waiting items wait n/ARGV[11] s each, so
//     that they ask again at most ARGV[11] times a second in all however
//     many a large batch has parked in asynq's retry set, while a slot
//     that frees is still taken within about 1/ARGV[11] s.
//  5. Otherwise run: take a slot and the solve's lease, and mark the item
//     active.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
// KEYS[3] cache entry of the puzzle
// KEYS[4] the solve's lease
// KEYS[5] the solve's waiters
// KEYS[6] the owner's slots (keys.ownerRunning)
// KEYS[7] the owner's waiting items (keys.ownerWaiting)
//
// ARGV[1] item ID (apitype.ItemID)
// ARGV[2] item index
// ARGV[3] lease, milliseconds
// ARGV[4] the owner's cap of slots (0: none)
// ARGV[5] record TTL, seconds (the waiters hash lives as long)
// ARGV[6] now, Unix milliseconds (the marker's started_at)
// ARGV[7] the solve's key (tasks.SolveRun.Solve)
// ARGV[8] task key prefix (keys.task(""))
// ARGV[9], ARGV[10] batch res affixes (keys.batchResAffixes)
// ARGV[11] how many times a second the owner's waiting items may ask
//
// Returns {verdict, value} as admitScript does, and for a wait a third
// value: how long to wait, milliseconds.
var admitItemScript = redis.NewScript(quotaLua + batchLua + liveLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'stride', 'total', 'expires_at', 'canceled_at')
local idx = tonumber(ARGV[2])
local runnable, rk, k = false, nil, nil
if b[3] and idx < tonumber(b[3]) then
  local stride = tonumber(b[2])
  local j = math.floor(idx / stride)
  k = idx - j * stride
  rk = KEYS[1] .. ARGV[10] .. j
  runnable = not b[5] and redis.call('HEXISTS', rk, tostring(k)) == 0 and redis.call('HEXISTS', KEYS[2], 'x' .. idx) == 1
end
local function start()
  if not runnable then return end
  local f = 'a' .. k
  local mv = redis.call('HGET', rk, f)
  if not mv then
    redis.call('HSET', rk, f, '1 ' .. ARGV[6])
    redis.call('HINCRBY', KEYS[1], 'pending', -1)
    redis.call('HINCRBY', KEYS[1], 'active', 1)
  else
    local a, s = parse_marker(mv)
    redis.call('HSET', rk, f, (a + 1) .. ' ' .. s)
  end
end
if runnable then
  redis.call('HSET', KEYS[5], ARGV[1], b[1] or '')
  redis.call('EXPIRE', KEYS[5], ARGV[5])
  redis.call('HSET', rk, 's' .. k, ARGV[7])
  redis.call('PEXPIREAT', rk, b[4])
elseif live(KEYS[5], ARGV[8], ARGV[9], ARGV[10]) == 0 then
  redis.call('ZREM', KEYS[7], ARGV[1])
  return {'skip', ''}
end
local hit = redis.call('GET', KEYS[3])
if hit then
  redis.call('ZREM', KEYS[7], ARGV[1])
  return {'hit', hit}
end
local lead = redis.call('GET', KEYS[4])
if lead and lead ~= ARGV[1] then
  start()
  redis.call('ZREM', KEYS[7], ARGV[1])
  return {'joined', lead}
end
local now = clock()
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
local cap = tonumber(ARGV[4])
if cap > 0 and not redis.call('ZSCORE', KEYS[6], ARGV[1]) and redis.call('ZCARD', KEYS[6]) >= cap then
  local w = 0
  if runnable then w = redis.call('HINCRBY', rk, 'w' .. k, 1) end
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now)
  local others = redis.call('ZCARD', KEYS[7])
  if redis.call('ZSCORE', KEYS[7], ARGV[1]) then others = others - 1 end
  local d = math.max(math.min(1000 + math.floor(w / 4) * 1000, 10000), math.floor((others + 1) * 1000 / tonumber(ARGV[11])))
  local until_ms = now + d + 2000
  redis.call('ZADD', KEYS[7], until_ms, ARGV[1])
  if redis.call('PTTL', KEYS[7]) < d + 2000 then redis.call('PEXPIRE', KEYS[7], d + 2000) end
  return {'wait', tostring(w), tostring(d)}
end
redis.call('ZREM', KEYS[7], ARGV[1])
local lease = tonumber(ARGV[3])
redis.call('ZADD', KEYS[6], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[6], lease)
redis.call('SET', KEYS[4], ARGV[1], 'PX', lease)
start()
return {'run', ''}
`)

// ItemWakesPerSecond bounds how often one key's expensive batch items
// that wait for a slot ask again, all together (see admitItemScript): a
// batch of 100,000 hard boards parks most of them in asynq's retry set
// over time, and without the bound each would ask every 10 s, 10,000
// script calls a second for nothing. A freed slot is taken within about
// 1/ItemWakesPerSecond s.
const ItemWakesPerSecond = 20

// The store is the worker's gate for expensive batch items too.
var _ tasks.ItemGate = (*Store)(nil)

// PeekItem reads item index of own unit ref without starting it
// (peekItemScript), so the worker can decode its request and name its
// solve before admitting it.
func (s *Store) PeekItem(ctx context.Context, ref tasks.UnitRef, index int) (tasks.ItemPeek, error) {
	v, err := peekItemScript.RunRO(ctx, s.rdb, []string{s.k.batch(ref.BatchID), s.k.batchReq(ref.BatchID)},
		index, s.k.batchResBase(ref.BatchID)).StringSlice()
	if err != nil {
		return tasks.ItemPeek{}, fmt.Errorf("store: peek item %s: %w", ref.TaskID(), err)
	}
	if len(v) != 3 {
		return tasks.ItemPeek{}, nil
	}
	return tasks.ItemPeek{Found: true, Owner: v[0], Request: []byte(v[1]), Ended: v[2] == "1"}, nil
}

// AdmitItem decides what a run of a batch's expensive item does, in one
// round trip (admitItemScript). r.ID is the item's ID and r.Owner its
// batch's owner.
func (s *Store) AdmitItem(ctx context.Context, r tasks.SolveRun, ref tasks.UnitRef, index, cap int) (tasks.Admission, error) {
	keys := []string{s.k.batch(ref.BatchID), s.k.batchReq(ref.BatchID), s.k.cache(r.CacheKey),
		s.k.solve(r.Solve), s.k.solveWaiters(r.Solve), s.k.ownerRunning(r.Owner), s.k.ownerWaiting(r.Owner)}
	v, err := admitItemScript.Run(ctx, s.rdb, keys, r.ID, index, leaseMS(r.LeaseOrDefault()), cap,
		int64(s.taskTTL/time.Second), ms(s.now()), r.Solve, s.k.task(""), s.k.batch(""), suffixRes, ItemWakesPerSecond).StringSlice()
	if err != nil || len(v) < 2 {
		return tasks.Admission{}, fmt.Errorf("store: admit item %s: %v (reply %v)", r.ID, err, v)
	}
	return admission(r.ID, v)
}

// admission reads an admit script's {verdict, value} reply.
func admission(id string, v []string) (tasks.Admission, error) {
	a := tasks.Admission{Verdict: tasks.Verdict(v[0])}
	switch a.Verdict {
	case tasks.VerdictHit:
		a.Result = json.RawMessage(v[1])
	case tasks.VerdictJoined:
		a.Lead = v[1]
	case tasks.VerdictWait:
		a.Waits, _ = strconv.Atoi(v[1])
		if len(v) > 2 {
			d, _ := strconv.Atoi(v[2])
			a.Delay = time.Duration(d) * time.Millisecond
		}
	case tasks.VerdictRun, tasks.VerdictSkip:
	default:
		return a, fmt.Errorf("store: admit %s: unknown verdict %q", id, v[0])
	}
	return a, nil
}
