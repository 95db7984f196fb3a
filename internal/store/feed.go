package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/tasks"
)

// feedWindow is how many of a batch's units move into the feed at a time
// (see feedLua): a commit or a feed call moves at most a few windows, so
// neither blocks Redis for long however large the batch.
const feedWindow = 1000

// backlogUnits is how many waiting units one member of the backlog
// (keys.backlog) stands for: the KEDA trigger on it asks for one worker
// per member, the same 50 units per worker as its trigger on the bulk
// queue. A 1,000,000-item batch of own units has 20,000 members, which
// its commit adds in a few milliseconds.
const backlogUnits = 50

// maxRefills bounds how many windows one Feed call moves.
const maxRefills = 2

// maxFeedDrops bounds how many members of gone or canceled batches one
// Feed call pops and drops, so one call stays short; the next call drops
// more.
const maxFeedDrops = 10000

// Feed takes up to max units from queue's feed (the cheap lane's for
// tasks.QueueCheapBulk, the solvers' otherwise), in fair order (see
// docs/batches.md), while queue's asynq pending list holds fewer than
// depth tasks, moving them to the feeding set. The solvers' queue holds
// at most S units waiting, S the cluster's solver slots (the workers'
// live entries of keys.gateSlots), whatever depth says: its units are
// searches, and asynq runs a queue in order, so a key's units queued
// ahead of another key's all start before the other's first one is
// delivered and parked, which is when the fair share first counts it. S
// of them keep every slot fed between two feeds (a worker feeds after
// each unit it ends), and another key's first unit waits behind one
// round of searches at most, not FEED_DEPTH. Units of batches that are
// gone or canceled are dropped, not returned. The caller enqueues and
// acknowledges them with EnqueueFed.
func (s *Store) Feed(ctx context.Context, queue string, depth, max int) ([]tasks.UnitRef, error) {
	return s.FeedBelow(ctx, queue, depth, depth, max)
}

// FeedBelow is Feed that takes nothing unless queue's pending list holds
// fewer than low tasks (low <= depth): a worker that feeds after every
// unit then makes one feed of several units every few units, not a feed,
// an enqueue and an acknowledgement per unit.
func (s *Store) FeedBelow(ctx context.Context, queue string, low, depth, max int) ([]tasks.UnitRef, error) {
	return s.feedInto(ctx, s.feedFor(queue), queue, low, depth, max)
}

// feedInto is FeedBelow from the feed fk.
func (s *Store) feedInto(ctx context.Context, fk, queue string, low, depth, max int) ([]tasks.UnitRef, error) {
	if max <= 0 || depth <= 0 || low <= 0 {
		return nil, nil
	}
	ua := s.k.batchUnitsAffixes()
	solvers := 0
	if fk == s.k.feed() {
		solvers = 1
	}
	members, err := feedScript.Run(ctx, s.rdb,
		[]string{fk, s.k.feeding(), s.laneVT(fk == s.k.cheapFeed()), asynqdata.PendingKey(queue), s.k.backlog(),
			s.k.feed(), s.k.cheapFeed(), s.k.gateSlots()},
		depth, max, ms(s.now()), ua[0], maxFeedDrops, feedWindow, maxRefills, ua[1], backlogUnits, min(low, depth), solvers).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("store: feed: %w", err)
	}
	return s.parseMembers(ctx, members), nil
}

// feedFor is the feed whose units go to queue: the cheap lane's for its
// bulk queue, the solvers' for any other.
func (s *Store) feedFor(queue string) string {
	if queue == tasks.QueueCheapBulk {
		return s.k.cheapFeed()
	}
	return s.k.feed()
}

// laneVT is the virtual time of the cheap lane's feed when cheap is true,
// of the solvers' otherwise: a batch whose units all run in the cheap
// lane starts where that lane's feed is (docs/batches.md, Fairness).
func (s *Store) laneVT(cheap bool) string {
	if cheap {
		return s.k.cheapFeedVT()
	}
	return s.k.feedVT()
}

// parseMembers reads feed members; one that cannot be read (never written
// by this code) is removed from the feeding set rather than returned
// forever.
func (s *Store) parseMembers(ctx context.Context, ms []string) []tasks.UnitRef {
	refs := make([]tasks.UnitRef, 0, len(ms))
	var bad []any
	for _, m := range ms {
		r, err := tasks.ParseMember(m)
		if err != nil {
			bad = append(bad, m)
			continue
		}
		refs = append(refs, r)
	}
	if len(bad) > 0 {
		s.rdb.ZRem(ctx, s.k.feeding(), bad...)
	}
	return refs
}

// enqueueFedPage is the most units one enqueueFedScript call takes: about
// a millisecond of Redis's time, so that a feeder that took thousands
// does not hold Redis for long at once.
const enqueueFedPage = 256

// EnqueueFed puts units that Feed took on queue's pending list, as
// asynq.Client would enqueue them with their fixed task IDs, and
// acknowledges them in the same script (worker.Feeder): a page of up
// to enqueueFedPage units a round trip. A unit whose task asynq holds
// already is acknowledged as queued, queued afresh when asynq had
// archived or kept it completed, and left unacknowledged while it runs
// (enqueueFedScript). It returns how many units it acknowledged; the
// others (running ones, and those of the pages after a failure) stay in
// the feeding set for the reconciler.
func (s *Store) EnqueueFed(ctx context.Context, queue string, refs []tasks.UnitRef) (int, error) {
	acked := 0
	for len(refs) > 0 {
		page := refs[:min(len(refs), enqueueFedPage)]
		refs = refs[len(page):]
		keys := make([]string, 5, 5+len(page))
		keys[0], keys[1], keys[2] = s.k.feeding(), asynqdata.PendingKey(queue), asynqdata.QueuesKey
		keys[3], keys[4] = asynqdata.ArchivedKey(queue), asynqdata.CompletedKey(queue)
		publish := queue
		if _, ok := s.queuesAdded.Load(queue); ok {
			publish = ""
		}
		args := make([]any, 2, 2+3*len(page))
		args[0], args[1] = s.now().UnixNano(), publish
		for _, r := range page {
			e, err := asynqdata.Unit(r, queue)
			if err != nil {
				return acked, err
			}
			keys = append(keys, asynqdata.TaskKey(queue, e.ID))
			args = append(args, e.ID, e.Msg, r.Member())
		}
		n, err := enqueueFedScript.Run(ctx, s.rdb, keys, args...).Int()
		if err != nil {
			return acked, fmt.Errorf("store: enqueue %d fed units: %w", len(page), err)
		}
		if publish != "" {
			s.queuesAdded.Store(queue, true)
		}
		acked += n
	}
	return acked, nil
}

// StaleFed returns up to limit units that were taken from the feed before
// before and never acknowledged: their feeder died. The reconciler
// enqueues them again.
func (s *Store) StaleFed(ctx context.Context, before time.Time, limit int) ([]tasks.UnitRef, error) {
	members, err := s.rdb.ZRangeByScore(ctx, s.k.feeding(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(ms(before), 10), Count: int64(limit)}).Result()
	if err != nil {
		return nil, fmt.Errorf("store: stale fed: %w", err)
	}
	return s.parseMembers(ctx, members), nil
}

// feedLua holds refill, shared by the commit and feed scripts. A batch's
// units enter the feed a window at a time, so that no script moves a
// million of them at once (Redis would stall every tenant for seconds):
// the commit moves the first window, and a refill mark "<batch>/+",
// scored halfway through each window, moves the next one when the feed
// script pops it. Unit k of a batch (1-based) is scored
// base+ceil(k/per) however late it moves, per the owner's weight in the
// share of solver slots (keys.gateWeights, fixed at the commit): a key of
// weight 3 has three units at each score where a key of weight 1 has one,
// so the bulk queues hand out units in the ratio of the weights, which is
// how the fair share sees a key's queued demand. The order is the one a
// single move would give, and
// a batch with units waiting keeps between half a window and one and a
// half in the feed (what a ZCARD of the feed sees of it).
//
// refill(list, feed, cfeed, batch, base, moved, units, w, per) pops up to w
// units from the batch's list into the feeds, a chunk's shared unit of
// cheap items into the cheap lane's feed cfeed and an item's own unit
// into feed (lane), puts the next refill mark, when units remain, in each
// feed that took units of this window, so that the lane that reaches the
// window's middle first moves the batch on and neither waits on the
// other, and returns how many units have moved.
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

const feedLua = backlogLua + laneLua + `
local function refill(list, feed, cfeed, batch, base, moved, units, w, per)
  per = per or 1
  local take = math.min(w, units - moved)
  local done, inFeed, inCheap = 0, false, false
  while done < take do
    local ms = redis.call('LPOP', list, math.min(1000, take - done))
    if not ms then break end
    local z, c = {}, {}
    for i = 1, #ms do
      local t = z
      if lane(ms[i]) then t = c end
      t[#t + 1] = string.format('%d', base + math.ceil((moved + done + i) / per))
      t[#t + 1] = ms[i]
    end
    if #z > 0 then redis.call('ZADD', feed, unpack(z)); inFeed = true end
    if #c > 0 then redis.call('ZADD', cfeed, unpack(c)); inCheap = true end
    done = done + #ms
  end
  if done > 0 and moved + done < units then
    local at = string.format('%d.5', base + math.ceil((moved + math.ceil(done / 2)) / per))
    if inFeed then redis.call('ZADD', feed, at, batch .. '/+') end
    if inCheap then redis.call('ZADD', cfeed, at, batch .. '/+') end
  end
  return moved + done
end
`

// laneLua holds lane(member): true when the feed member names a chunk's
// shared unit ("<batch>/c<j>/<ms>"), whose items are all cheap and which
// runs in the cheap lane (tasks.UnitQueue).
const laneLua = `
local function lane(m)
  return string.match(m, '^[^/]+/c%d') ~= nil
end
`

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
// task message (asynqdata.Unit) and its feed member
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

// feedScript takes units from a feed in score order while its bulk
// queue's pending list is short, dropping those of batches that are gone
// or canceled, and moves the rest to the feeding set. A refill mark it
// pops moves its batch's next window of units into the feeds (see
// feedLua), or, for a batch gone or canceled, deletes the batch's list.
//
// KEYS[1] the feed taken from: KEYS[6] or KEYS[7]
// KEYS[2] feeding
// KEYS[3] the taken feed's virtual time (feed:vt or feed:cheap:vt), set
// to the last score taken
// KEYS[4] the queue's asynq pending list
// KEYS[5] backlog
// KEYS[6] the solvers' feed
// KEYS[7] the cheap lane's feed
// KEYS[8] the workers' solver slots (keys.gateSlots)
//
// ARGV[1] depth: the pending list's length to fill up to (for the
// solvers' feed at most the live solver slots in KEYS[8], when any)
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
// ARGV[11] 1 when KEYS[1] is the solvers' feed, whose depth KEYS[8] caps
//
// It also lowers each fed batch's backlog members to its units still
// unfed, and drops members whose batch has expired.
//
// Returns the members taken.
var feedScript = redis.NewScript(quotaLua + liveSlotsLua + feedLua + `
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. ARGV[3])
local depth, low = tonumber(ARGV[1]), tonumber(ARGV[10])
if ARGV[11] == '1' then
  local slots = live_slots(KEYS[8], clock())
  if slots > 0 and slots < depth then
    depth = slots
    low = math.min(low, depth)
  end
end
local waiting = redis.call('LLEN', KEYS[4])
local out = {}
if waiting >= low then return out end
local n = math.min(tonumber(ARGV[2]), depth - waiting)
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
        local f = redis.call('HMGET', bk, 'base', 'moved', 'units', 'per')
        local moved = refill(list, KEYS[6], KEYS[7], id, tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), window, tonumber(f[4]) or 1)
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
