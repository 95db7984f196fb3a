package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// The store is the worker's gate for expensive runs (see worker.Gate):
// one solve in flight per identical puzzle, and a cap per key on the runs
// holding a slot. Each decision is one script, so two workers admitting
// the same puzzle at the same moment see each other.

// liveLua counts the waiters of a solve whose records have not ended,
// dropping the others from the hash: a waiter whose cancel's
// announcement was lost, or whose record expired, must not keep a solve
// running that nobody waits for.
const liveLua = `
local function live(wk, tprefix)
  local w = redis.call('HKEYS', wk)
  local n = 0
  for i = 1, #w do
    local st = redis.call('HGET', tprefix .. w[i], 'state')
    if st == 'pending' or st == 'active' then
      n = n + 1
    else
      redis.call('HDEL', wk, w[i])
    end
  end
  return n
end
`

// promoteLua hands a slot that a run just freed to its owner's
// longest-parked run (keys.ownerParked), as asynq's own forward script
// moves a retry that is due: the first parked task that waits in its
// queue's retry set for a WaitError goes onto its pending list now. A
// parked task whose asynq state is active stays for the next freed slot
// (it was told to wait a moment ago and asynq has not yet moved it to the
// retry set, or it runs again now and will leave the set at its
// admission); so does one that asynq retried for another reason (its
// last error message is not a WaitError's, worker.WaitMessage): asynq's
// recoverer retried it because its worker died after it was told to
// wait, and the worker binary's leaseRecoveryDelay, which guards against
// a late second retry by another recoverer (hibiken/asynq#717) and so a
// third run of the task, is to be waited out, not cut short by a release
// (TestLeaseRecoveredRunIsNotPromoted). The message is asynq's protobuf
// TaskMessage, in which the error text is a plain string; a payload
// (the owner and a canonical puzzle) never holds it. One whose task is
// gone, pending or ended leaves the set. At most 16 members are looked
// at, so a release stays a short script however many runs wait; a run
// that is never promoted still runs when its retry delay ends.
//
// promote(parked key, now in Unix nanoseconds as asynq writes
// pending_since, promoted key or nil) returns 1 when it moved a run. With
// the owner's promoted key (keys.ownerPromoted: a slot was freed for the
// run) the run's member is also written there, until its admission: a promoted run that then
// takes no slot hands it on (passLua), and only such a run does. The
// entry also reserves the slot for the run for one worker.SolveLease
// (reserved, which every admission adds to the owner's live slots), and
// the task goes to the head of its pending list (RPUSH: asynq takes from
// that end, as its own requeue of an interrupted task does), not the
// tail: otherwise every task of the key queued before the promotion is
// taken first, the first of them takes the freed slot, and the promoted
// run parks again, at the back of the line, at every release for as long
// as the key's work keeps coming (TestPromotedRunKeepsItsSlot). A
// reservation whose run never comes to its admission lapses like a dead
// worker's slot (TestPromotionReservationLapses). A move without it
// (promote_all: a solve's waiting items) reserves nothing and goes to the
// tail.
//
// reserved(promoted key, a run's parked member or "", now in Unix ms)
// counts the reservations of the owner's promoted runs other than that
// member's.
var promoteLua = `
local wait_msg = [==[` + worker.WaitMessage + `]==]
local reserve_ms = ` + strconv.FormatInt(worker.SolveLease.Milliseconds(), 10) + `
local function reserved(mk, member, now)
  local from = now - reserve_ms
  local n = redis.call('ZCOUNT', mk, from, '+inf')
  if member ~= '' then
    local at = redis.call('ZSCORE', mk, member)
    if at and tonumber(at) >= from then n = n - 1 end
  end
  return n
end
local function promote(pk, now_ns, mk)
  local m = redis.call('ZRANGE', pk, 0, 15)
  for i = 1, #m do
    local tab = string.find(m[i], '\t', 1, true)
    local st, msg, base, id = nil, nil, nil, nil
    if tab then
      base = 'asynq:{' .. string.sub(m[i], 1, tab - 1) .. '}:'
      id = string.sub(m[i], tab + 1)
      -- The message holds the task's payload (a large fill's is
      -- megabytes): it is read only for a task in the retry set, the
      -- one case that needs it, not for every parked run looked at.
      st = redis.call('HGET', base .. 't:' .. id, 'state')
      if st == 'retry' then msg = redis.call('HGET', base .. 't:' .. id, 'msg') end
    end
    local waited = st == 'retry' and msg and string.find(msg, wait_msg, 1, true) ~= nil
    if st ~= 'active' and (st ~= 'retry' or waited) then redis.call('ZREM', pk, m[i]) end
    if waited and redis.call('ZREM', base .. 'retry', id) == 1 then
      if mk then
        redis.call('RPUSH', base .. 'pending', id)
      else
        redis.call('LPUSH', base .. 'pending', id)
      end
      redis.call('HSET', base .. 't:' .. id, 'state', 'pending', 'pending_since', now_ns)
      if mk then
        local t = redis.call('TIME')
        local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        redis.call('ZREMRANGEBYSCORE', mk, '-inf', ms - 3600000)
        redis.call('ZADD', mk, ms, m[i])
        redis.call('EXPIRE', mk, 3600)
      end
      return 1
    end
  end
  return 0
end
local function promote_all(pk, now_ns)
  for _ = 1, 64 do
    if promote(pk, now_ns) == 0 then return end
  end
end
`

// passLua holds what the sharing scripts do with a slot (fairLua); it
// comes after quotaLua, promoteLua and fairLua.
//
// give(G, owner, now_ns, freed) hands on a slot of owner's: a freed one
// (freed true: its run ended) or one that a promoted run of owner's takes
// no use of. With sharing (S > 0) it goes to the most under-served key's
// longest-parked run (fair_fill); without, to owner's own longest-parked
// run, a handed-on one only while owner is under the ceiling. It returns
// 1 when it promoted a run.
//
// pass(G, owner, member, now_ns) is for a run that takes no slot after
// all (its task or item ended, was canceled or cached while it was
// parked; or it joined a solve in flight): it leaves its owner's parked
// set and, if a freed slot promoted it (its member is in the owner's promoted
// set, see promoteLua), gives the slot on. A run that came back by its
// retry delay, or from a solve's parked set, hands on nothing: no slot
// was freed for it. Without it such a run would end a chain of
// promotions, and the parked runs would wait out their retry delays
// beside a free slot.
//
// may(G, owner, slot, member, now) tells whether owner's run (its slot
// member, its parked member or "") may take a slot now: it holds it
// already (a redelivery), or it stays under the ceiling and, with
// sharing, the cluster has a slot free (counting the other promoted
// runs' reservations) and owner holds fewer than its fair share, the run
// itself counted in owner's demand. The run's own reservation is the
// slot it takes.
//
// refill(G, owner, now_ns) follows a run that took a slot or was told to
// wait: with sharing, a slot still free goes to the most under-served
// key (a slot whose worker died, a promotion that was lost or a
// reservation a waiting run gave up would otherwise stay idle beside
// parked runs until each came back by its retry delay); without, owner's
// own longest-parked run is promoted while owner is under the ceiling
// (after a run only).
const passLua = `
local function give(G, owner, now_ns, freed)
  local a = G.by[owner]
  local now = clock()
  if G.S == 0 then
    if not freed then
      redis.call('ZREMRANGEBYSCORE', a.sk, '-inf', now)
      if G.cap > 0 and redis.call('ZCARD', a.sk) + reserved(a.mk, '', now) >= G.cap then return 0 end
    end
    return promote(a.pk, now_ns, a.mk)
  end
  fair_count(G, now, nil)
  shares(G, nil, 0)
  return fair_fill(G, now_ns)
end
local function pass(G, owner, member, now_ns)
  if member == '' then return 0 end
  local a = G.by[owner]
  redis.call('ZREM', a.pk, member)
  if redis.call('ZREM', a.mk, member) == 0 then return 0 end
  return give(G, owner, now_ns, false)
end
local function may(G, owner, slot, member, now)
  local a = G.by[owner]
  fair_count(G, now, owner)
  if redis.call('ZSCORE', a.sk, slot) then return true end
  local mine = 0
  if member ~= '' then
    local at = redis.call('ZSCORE', a.mk, member)
    if at and tonumber(at) >= now - reserve_ms then mine = 1 end
  end
  a.r = a.r - mine
  G.U = G.U - mine
  if G.cap > 0 and a.h + a.r >= G.cap then return false end
  if G.S == 0 then return true end
  local extra = 1
  if member ~= '' and redis.call('ZSCORE', a.pk, member) then extra = 0 end
  shares(G, a, extra)
  return G.U < G.S and a.h + a.r < a.f
end
local function refill(G, owner, now_ns, ran)
  local a = G.by[owner]
  if G.S == 0 then
    if ran and G.cap > 0 and redis.call('ZCARD', a.sk) + reserved(a.mk, '', clock()) < G.cap then promote(a.pk, now_ns, a.mk) end
    return
  end
  fair_count(G, clock(), owner)
  shares(G, nil, 0)
  fair_fill(G, now_ns)
end
`

// admitScript decides what one run of an expensive single task does
// (worker.Verdict), in this order:
//
//  1. A task that has not ended becomes a waiter of its solve (and its
//     record keeps the solve's key, for cancels). A task that has ended
//     runs only on behalf of live waiters (its client canceled it, but
//     others wait on the same solve): with none, skip.
//  2. A cached answer: hit (the caller ends every waiter with it).
//  3. Another run holds the solve's lease: joined. The task becomes
//     active, with "joined" naming that run's task, and holds no slot.
//  4. The run may not take a slot (passLua's may: the cluster has none
//     free, or its key holds its fair share, or the ceiling), and this
//     task holds none: wait, counting the wait in the record, and park
//     the task's asynq task in the owner's parked set (first wait's time
//     kept), where the next freed slot that goes to this key finds it
//     (promoteLua). Any other verdict takes it out of the set, and skip,
//     hit and joined, which take no slot, hand on the one this run may
//     have been promoted into (passLua).
//  5. Otherwise run: take a slot and the solve's lease, mark the task
//     active (an attempt, started_at once) like startManyScript. A slot
//     still free goes on to a parked run (passLua's refill), so each
//     admission fills one more (TestRaisedCapFillsFromTheLine).
//
// KEYS[1] task hash
// KEYS[2] cache entry of the puzzle
// KEYS[3] the solve's lease (keys.solve)
// KEYS[4] the solve's waiters (keys.solveWaiters)
// KEYS[5..] the sharing's keys (fairLua, kb = 5), the owner's among them
//
// ARGV[1] task ID
// ARGV[2] owner ("" when auth is off)
// ARGV[3] lease, milliseconds
// ARGV[4] record TTL, seconds (the waiters hash lives as long)
// ARGV[5] now, Unix milliseconds (started_at)
// ARGV[6] the solve's key (worker.SolveRun.Solve)
// ARGV[7] task key prefix (keys.task(""))
// ARGV[8] the run's parked member (parkedMember; "" never parks)
// ARGV[9] now, Unix nanoseconds (for promoteLua)
// ARGV[10..] the sharing's arguments (fairLua, ab = 10)
//
// Returns {verdict, value}: {"run", ""}, {"joined", lead task ID},
// {"wait", waits so far}, {"hit", result} or {"skip", ""}; or stale
// (fairLua).
var admitScript = redis.NewScript(quotaLua + liveLua + promoteLua + fairLua + passLua + `
local G, reg = fair_open(5, 10)
if not G then return stale(reg) end
local owner = ARGV[2]
local pk = G.by[owner].pk
local rec = redis.call('HMGET', KEYS[1], 'state', 'attempts', 'started_at')
local st = rec[1]
local runnable = st == 'pending' or st == 'active'
local function start(task, now_ms)
  if not runnable then return end
  local f = {'attempts', (tonumber(rec[2]) or 0) + 1, 'state', 'active'}
  if not rec[3] then f[5] = 'started_at'; f[6] = now_ms end
  redis.call('HSET', task, unpack(f))
end
if runnable then
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
  redis.call('EXPIRE', KEYS[4], ARGV[4])
  redis.call('HSET', KEYS[1], 'solve', ARGV[6])
elseif live(KEYS[4], ARGV[7]) == 0 then
  pass(G, owner, ARGV[8], ARGV[9])
  return {'skip', ''}
end
local hit = redis.call('GET', KEYS[2])
if hit then pass(G, owner, ARGV[8], ARGV[9]); return {'hit', hit} end
local lead = redis.call('GET', KEYS[3])
if lead and lead ~= ARGV[1] then
  pass(G, owner, ARGV[8], ARGV[9])
  start(KEYS[1], ARGV[5])
  if runnable then redis.call('HSET', KEYS[1], 'joined', lead) end
  return {'joined', lead}
end
local now = clock()
if not may(G, owner, ARGV[1], ARGV[8], now) then
  local w = 0
  if runnable then w = redis.call('HINCRBY', KEYS[1], 'waits', 1) end
  if ARGV[8] ~= '' then
    fair_register(G, owner)
    redis.call('ZADD', pk, 'NX', now, ARGV[8])
    redis.call('EXPIRE', pk, ARGV[4])
    redis.call('ZREM', G.by[owner].mk, ARGV[8])
  end
  refill(G, owner, ARGV[9], false)
  return {'wait', tostring(w)}
end
if ARGV[8] ~= '' then
  redis.call('ZREM', pk, ARGV[8])
  redis.call('ZREM', G.by[owner].mk, ARGV[8])
end
local lease = tonumber(ARGV[3])
local sk = G.by[owner].sk
fair_register(G, owner)
redis.call('ZADD', sk, now + lease, ARGV[1])
redis.call('PEXPIRE', sk, lease)
redis.call('SET', KEYS[3], ARGV[1], 'PX', lease)
start(KEYS[1], ARGV[5])
refill(G, owner, ARGV[9], true)
return {'run', ''}
`)

// renewSolveScript extends a run's slot and its solve's lease. The lease
// is taken again when it has lapsed (nobody else took it), never from
// another run that took it meanwhile.
//
// KEYS[1] the solve's lease
// KEYS[2] the owner's slots
// KEYS[3] the keys with expensive work (keys.gateOwners), where the
// owner stays registered while it holds the slot
// ARGV[1] task ID
// ARGV[2] lease, milliseconds
// ARGV[3] owner
//
// Returns 1 while the run holds the solve's lease, 0 when another run
// took it.
var renewSolveScript = redis.NewScript(quotaLua + `
redis.call('ZADD', KEYS[3], 'NX', 0, ARGV[3])
local lease = tonumber(ARGV[2])
local lead = redis.call('GET', KEYS[1])
local mine = 0
if not lead or lead == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', lease)
  mine = 1
end
redis.call('ZADD', KEYS[2], clock() + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[2], lease)
return mine
`)

// finishSolveScript ends a solve: every waiter whose record is pending or
// active (and the run's own record, if it is not listed) gets the
// outcome, with "t:<id>" published for long polls and its owner's quota
// released (per single task, as finishManyScript does); a completed
// result that was solved, not read from the cache, is cached without
// shortening an existing entry's life. Then the waiters, the lease (when
// it is still this run's) and the run's slot go. A waiter that had ended
// (canceled, or ended by another run of the same solve) is left alone,
// so a second run of the same task, or of the same puzzle, changes and
// counts nothing twice.
//
// KEYS[1] the solve's waiters
// KEYS[2] the solve's lease
// KEYS[3] cache entry of the puzzle
// KEYS[4] the run's task hash
//
// ARGV[1] now, Unix milliseconds
// ARGV[2] the run's task ID
// ARGV[3] state: completed or failed
// ARGV[4] result JSON ("" when none)
// ARGV[5] error code ("" when none)
// ARGV[6] error message
// ARGV[7] "1" when the result came from the cache
// ARGV[8] events channel
// ARGV[9] task key prefix (keys.task(""))
// ARGV[10..13] owner affixes (keys.ownerAffixes)
// ARGV[14] result TTL, seconds
// ARGV[15] now, Unix nanoseconds (for promoteLua)
// ARGV[16] the prefix of a task's event (TaskEventKey(""))
//
// KEYS[5] the batch items waiting for this solve (keys.solveParked): all
// go back onto their queue
// KEYS[6..] the sharing's keys (fairLua, kb = 6), the owner's among them:
// the freed slot is given on (passLua's give)
// ARGV[17] the run's owner
// ARGV[18..] the sharing's arguments (fairLua, ab = 18)
//
// Returns {n, owner, count, owner, count, ...}: how many records it ended
// and how many of each owner's; or stale (fairLua).
var finishSolveScript = redis.NewScript(quotaLua + promoteLua + fairLua + passLua + `
local G, reg = fair_open(6, 18)
if not G then return stale(reg) end
if ARGV[3] == 'completed' and ARGV[7] ~= '1' and ARGV[4] ~= '' then
  redis.call('SET', KEYS[3], ARGV[4], 'NX', 'EX', ARGV[14])
  redis.call('EXPIRE', KEYS[3], ARGV[14], 'GT')
end
local w = redis.call('HGETALL', KEYS[1])
local listed = false
for i = 1, #w, 2 do
  if w[i] == ARGV[2] then listed = true end
end
if not listed then
  w[#w + 1] = ARGV[2]
  w[#w + 1] = redis.call('HGET', KEYS[4], 'owner') or ''
end
local ends, owners = {}, {}
local n = 0
local counted, by = {}, {}
for i = 1, #w, 2 do
  local id, owner = w[i], w[i + 1]
  local tk = ARGV[9] .. id
  local cur = redis.call('HGET', tk, 'state')
  if cur == 'pending' or cur == 'active' then
    local f = {'state', ARGV[3], 'completed_at', ARGV[1]}
    if ARGV[4] ~= '' then f[#f + 1] = 'result'; f[#f + 1] = ARGV[4] end
    if ARGV[5] ~= '' then
      f[#f + 1] = 'err_code'; f[#f + 1] = ARGV[5]
      f[#f + 1] = 'err_msg'; f[#f + 1] = ARGV[6]
    end
    if ARGV[7] == '1' then f[#f + 1] = 'cached'; f[#f + 1] = '1' end
    redis.call('HSET', tk, unpack(f))
    redis.call('PUBLISH', ARGV[8], ARGV[16] .. id)
    n = n + 1
    if not counted[owner] then counted[owner] = 0; by[#by + 1] = owner end
    counted[owner] = counted[owner] + 1
    if owner ~= '' then
      if not ends[owner] then ends[owner] = {}; owners[#owners + 1] = owner end
      ends[owner][id] = 1
    end
  end
end
for _, owner in ipairs(owners) do
  local b = ARGV[10] .. owner
  release(b .. ARGV[11], b .. ARGV[12], b .. ARGV[13], ends[owner])
end
redis.call('DEL', KEYS[1])
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
if redis.call('ZREM', G.by[ARGV[17]].sk, ARGV[2]) == 1 then give(G, ARGV[17], ARGV[15], true) end
promote_all(KEYS[5], ARGV[15])
local out = {n}
for _, owner in ipairs(by) do
  out[#out + 1] = owner
  out[#out + 1] = counted[owner]
end
return out
`)

// releaseSolveScript gives up a run whose solve was canceled: unless a
// task joined meanwhile (a live waiter), the run's slot and lease go.
//
// KEYS[1] the solve's waiters
// KEYS[2] the solve's lease
// KEYS[3] the batch items waiting for this solve: all go back onto their
// queue, where one leads a solve of its own
// KEYS[4..] the sharing's keys (fairLua, kb = 4), the owner's among them:
// the freed slot is given on (passLua's give)
// ARGV[1] the run's task ID
// ARGV[2] task key prefix
// ARGV[3] now, Unix nanoseconds (for promoteLua)
// ARGV[4] the run's owner
// ARGV[5..] the sharing's arguments (fairLua, ab = 5)
//
// Returns the live waiters: 0 when released, otherwise the solve is
// still owed and nothing was released; or stale (fairLua).
var releaseSolveScript = redis.NewScript(quotaLua + liveLua + promoteLua + fairLua + passLua + `
local G, reg = fair_open(4, 5)
if not G then return stale(reg) end
local n = live(KEYS[1], ARGV[2])
if n > 0 then return n end
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
if redis.call('ZREM', G.by[ARGV[4]].sk, ARGV[1]) == 1 then give(G, ARGV[4], ARGV[3], true) end
promote_all(KEYS[3], ARGV[3])
return 0
`)

// cancelSolveScript announces a single task's cancel to the workers once
// finishManyScript has canceled its record. A task that never waited on
// an expensive solve is announced as before (when it was active). One
// that did leaves its solve's waiters, and the solve is stopped only when
// no live waiter remains: canceling one of several identical tasks does
// not cancel the others. Then the run that leads the solve is told to
// stop (it runs under its own task's ID), and this task too when it was
// active.
//
// KEYS[1] task hash
// ARGV[1] task ID
// ARGV[2] "1" when the task was active before the cancel
// ARGV[3] cancels channel
// ARGV[4], ARGV[5] solve affixes (keys.solveAffixes)
// ARGV[6] task key prefix
//
// Returns 1 when a stop was announced (or nothing ran), 0 when the solve
// goes on for other waiters.
var cancelSolveScript = redis.NewScript(liveLua + `
local key = redis.call('HGET', KEYS[1], 'solve')
if not key then
  if ARGV[2] == '1' then redis.call('PUBLISH', ARGV[3], ARGV[1]) end
  return 1
end
local sk = ARGV[4] .. key
local wk = sk .. ARGV[5]
redis.call('HDEL', wk, ARGV[1])
if live(wk, ARGV[6]) > 0 then return 0 end
local lead = redis.call('GET', sk)
if lead then redis.call('PUBLISH', ARGV[3], lead) end
if ARGV[2] == '1' and lead ~= ARGV[1] then redis.call('PUBLISH', ARGV[3], ARGV[1]) end
return 1
`)

// The store is the worker's gate for expensive runs.
var _ worker.Gate = (*Store)(nil)

func leaseMS(d time.Duration) int64 { return d.Milliseconds() }

// alone is worker.SlotRun.Alone as admitSlotScript reads it.
func alone(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// nowNS is t as asynq writes its tasks' pending_since: Unix nanoseconds,
// as a decimal string (a Lua number would round it).
func nowNS(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// strings2 is a script's reply of two strings, nil otherwise.
func strings2(v any) []string {
	l, ok := v.([]any)
	if !ok || len(l) != 2 {
		return nil
	}
	out := make([]string, 2)
	for i, x := range l {
		switch x := x.(type) {
		case string:
			out[i] = x
		case int64:
			out[i] = strconv.FormatInt(x, 10)
		default:
			return nil
		}
	}
	return out
}

// Admit decides what a run of an expensive single task does, in one
// round trip (admitScript).
func (s *Store) Admit(ctx context.Context, r worker.SolveRun, cap int) (worker.Admission, error) {
	keys := []string{s.k.task(r.ID), s.k.cache(r.CacheKey), s.k.solve(r.Solve), s.k.solveWaiters(r.Solve)}
	res, err := s.runFair(ctx, admitScript, keys, []any{r.ID, r.Owner, leaseMS(r.LeaseOrDefault()),
		int64(s.taskTTL / time.Second), ms(s.now()), r.Solve, s.k.task(""), parkedMember(r.Queue, r.AsynqID), nowNS(s.now())},
		r.Owner, r.Slots, cap)
	v := strings2(res)
	if err != nil || len(v) != 2 {
		return worker.Admission{}, fmt.Errorf("store: admit %s: %v (reply %v)", r.ID, err, v)
	}
	a := worker.Admission{Verdict: worker.Verdict(v[0])}
	switch a.Verdict {
	case worker.VerdictHit:
		a.Result = json.RawMessage(v[1])
	case worker.VerdictJoined:
		a.Lead = v[1]
	case worker.VerdictWait:
		a.Waits, _ = strconv.Atoi(v[1])
	case worker.VerdictRun, worker.VerdictSkip:
	default:
		return a, fmt.Errorf("store: admit %s: unknown verdict %q", r.ID, v[0])
	}
	return a, nil
}

// RenewSolve extends a run's slot and solve (renewSolveScript).
func (s *Store) RenewSolve(ctx context.Context, r worker.SolveRun) error {
	err := renewSolveScript.Run(ctx, s.rdb, []string{s.k.solve(r.Solve), s.k.ownerRunning(r.Owner), s.k.gateOwners()},
		r.ID, leaseMS(r.LeaseOrDefault()), r.Owner).Err()
	if err != nil {
		return fmt.Errorf("store: renew solve of %s: %w", r.ID, err)
	}
	return nil
}

// FinishSolve ends every task waiting on r's solve with t's outcome
// (finishSolveScript).
func (s *Store) FinishSolve(ctx context.Context, r worker.SolveRun, t worker.Transition) (int, map[string]int, error) {
	cached := "0"
	if t.Cached {
		cached = "1"
	}
	keys := []string{s.k.solveWaiters(r.Solve), s.k.solve(r.Solve), s.k.cache(r.CacheKey), s.k.task(r.ID), s.k.solveParked(r.Solve)}
	args := []any{ms(s.now()), r.ID, string(t.State), string(t.Result), t.Code, t.Msg, cached, s.k.events(), s.k.task("")}
	args = append(args, s.k.ownerAffixes()...)
	args = append(args, int64(s.resultTTL/time.Second), nowNS(s.now()), TaskEventKey(""), r.Owner)
	res, err := s.runFair(ctx, finishSolveScript, keys, args, r.Owner, r.Slots, r.Ceiling)
	l, ok := res.([]any)
	var n int64
	if ok && len(l)%2 == 1 {
		n, ok = l[0].(int64)
	}
	if err == nil && !ok {
		err = fmt.Errorf("reply %v", res)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("store: finish solve of %s: %w", r.ID, err)
	}
	by := make(map[string]int, len(l)/2)
	for i := 1; i+1 < len(l); i += 2 {
		owner, _ := l[i].(string)
		c, _ := l[i+1].(int64)
		by[owner] += int(c)
	}
	return int(n), by, nil
}

// ReleaseSolve gives up a canceled run unless a task joined it meanwhile
// (releaseSolveScript).
func (s *Store) ReleaseSolve(ctx context.Context, r worker.SolveRun) (int, error) {
	res, err := s.runFair(ctx, releaseSolveScript, []string{s.k.solveWaiters(r.Solve), s.k.solve(r.Solve), s.k.solveParked(r.Solve)},
		[]any{r.ID, s.k.task(""), nowNS(s.now()), r.Owner}, r.Owner, r.Slots, r.Ceiling)
	n, ok := res.(int64)
	if err == nil && !ok {
		err = fmt.Errorf("reply %v", res)
	}
	if err != nil {
		return 0, fmt.Errorf("store: release solve of %s: %w", r.ID, err)
	}
	return int(n), nil
}

// announceCancel tells the workers that single task id was canceled,
// unless other tasks still wait on the solve it waited on
// (cancelSolveScript).
func (s *Store) announceCancel(ctx context.Context, id string, prev apitype.TaskState) error {
	active := "0"
	if prev == apitype.TaskStateActive {
		active = "1"
	}
	args := []any{id, active, s.k.cancels()}
	args = append(args, s.k.solveAffixes()...)
	args = append(args, s.k.task(""))
	if err := cancelSolveScript.Run(ctx, s.rdb, []string{s.k.task(id)}, args...).Err(); err != nil {
		return fmt.Errorf("store: announce cancel: %w", err)
	}
	return nil
}

// Running returns how many of owner's expensive runs hold a slot now
// (leases not yet ended), for tests and operators.
func (s *Store) Running(ctx context.Context, owner string) (int, error) {
	n, err := s.runningCmd(ctx, s.rdb, owner).Result()
	if err != nil {
		return 0, fmt.Errorf("store: running count: %w", err)
	}
	return int(n), nil
}

// runningCmd counts owner's live slots (their expiry after now) on c, a
// client or a pipeline.
func (s *Store) runningCmd(ctx context.Context, c redis.Cmdable, owner string) *redis.IntCmd {
	return c.ZCount(ctx, s.k.ownerRunning(owner), strconv.FormatInt(ms(s.now())+1, 10), "+inf")
}

// admitSlotScript admits a run of an expensive batch item (its unit runs
// it alone), in this order:
//
//  1. An identical solve is in flight (a single task's, keys.solve, or
//     another batch item's, keys.solveItemLead): join it by waiting. The
//     run is parked in the solve's parked set, whose members all go back
//     onto their queue when that solve ends; they then find its answer in
//     the cache (or, if it failed or stopped, one of them leads).
//  2. The run may not take a slot (passLua's may) and holds none: park
//     it in the owner's parked set and return its place in line, as
//     admitScript does for single tasks.
//  3. Otherwise run: take a slot and lead the solve (solveItemLead). A
//     run that holds its slot or leads already (a redelivery of the same
//     item) keeps them. A slot still free goes on to a parked run
//     (passLua's refill), as admitScript does.
//
// KEYS[1] the solve's lease of single tasks (keys.solve)
// KEYS[2] the solve's batch-item lead (keys.solveItemLead)
// KEYS[3] the batch items waiting for the solve (keys.solveParked)
// KEYS[4] the puzzle's cache entry
// KEYS[5..] the sharing's keys (fairLua, kb = 5), the owner's among them
//
// ARGV[1] the slot's member, also the lead's value (the item's ID)
// ARGV[2] lease, milliseconds
// ARGV[3] the owner
// ARGV[4] the run's parked member (parkedMember; "" never parks)
// ARGV[5] the parked sets' TTL, seconds
// ARGV[6] now, Unix nanoseconds (for promoteLua)
// ARGV[7] "1" to run even behind an identical solve in flight
// (worker.SlotRun.Alone: a last delivery must not wait); such a run leads
// the solve only if no other item does
// ARGV[8..] the sharing's arguments (fairLua, ab = 8)
//
// Hit and joined take no slot: they hand on the one the run may have
// been promoted into (passLua). Every verdict but joined takes the run
// out of the solve's parked items, where an earlier wait left it.
//
// Returns {verdict, n}: {"run", 0} when the run took its slot and leads;
// {"joined", ms} when it waits for an identical solve, ms being how long
// it has waited for it (since its first wait); {"hit", 0} when the answer
// is cached (an identical solve ended since the unit looked); {"wait",
// place} when it waits for a slot, place in the owner's line (1: the next
// to be promoted); or stale (fairLua).
var admitSlotScript = redis.NewScript(quotaLua + promoteLua + fairLua + passLua + `
local G, reg = fair_open(5, 8)
if not G then return stale(reg) end
local owner = ARGV[3]
local sk, pk = G.by[owner].sk, G.by[owner].pk
if redis.call('EXISTS', KEYS[4]) == 1 then
  pass(G, owner, ARGV[4], ARGV[6])
  if ARGV[4] ~= '' then redis.call('ZREM', KEYS[3], ARGV[4]) end
  return {'hit', 0}
end
local now = clock()
local lead = redis.call('GET', KEYS[2])
if ARGV[7] ~= '1' and (redis.call('EXISTS', KEYS[1]) == 1 or (lead and lead ~= ARGV[1])) then
  pass(G, owner, ARGV[4], ARGV[6])
  if ARGV[4] == '' then return {'joined', 0} end
  redis.call('ZADD', KEYS[3], 'NX', now, ARGV[4])
  redis.call('EXPIRE', KEYS[3], ARGV[5])
  return {'joined', now - tonumber(redis.call('ZSCORE', KEYS[3], ARGV[4]))}
end
if not may(G, owner, ARGV[1], ARGV[4], now) then
  if ARGV[4] == '' then return {'wait', 1} end
  fair_register(G, owner)
  redis.call('ZREM', KEYS[3], ARGV[4])
  redis.call('ZADD', pk, 'NX', now, ARGV[4])
  redis.call('EXPIRE', pk, ARGV[5])
  redis.call('ZREM', G.by[owner].mk, ARGV[4])
  refill(G, owner, ARGV[6], false)
  return {'wait', redis.call('ZRANK', pk, ARGV[4]) + 1}
end
local lease = tonumber(ARGV[2])
fair_register(G, owner)
redis.call('ZADD', sk, now + lease, ARGV[1])
redis.call('PEXPIRE', sk, lease)
if not lead or lead == ARGV[1] then redis.call('SET', KEYS[2], ARGV[1], 'PX', lease) end
if ARGV[4] ~= '' then
  redis.call('ZREM', pk, ARGV[4])
  redis.call('ZREM', G.by[owner].mk, ARGV[4])
  redis.call('ZREM', KEYS[3], ARGV[4])
end
refill(G, owner, ARGV[6], true)
return {'run', 0}
`)

// renewSlotScript extends a run's slot and its lead of the solve
// (admitSlotScript); the lead is taken again when it lapsed, never from
// another item that took it meanwhile.
//
// KEYS[1] the owner's slots
// KEYS[2] the solve's batch-item lead
// KEYS[3] the keys with expensive work (keys.gateOwners), where the
// owner stays registered while it holds the slot
// ARGV[1] the slot's member
// ARGV[2] lease, milliseconds
// ARGV[3] the owner
var renewSlotScript = redis.NewScript(quotaLua + `
redis.call('ZADD', KEYS[3], 'NX', 0, ARGV[3])
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], clock() + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease)
local lead = redis.call('GET', KEYS[2])
if not lead or lead == ARGV[1] then redis.call('SET', KEYS[2], ARGV[1], 'PX', lease) end
return 1
`)

// releaseSlotScript ends a batch item's run (admitSlotScript): its slot
// is given on (passLua's give), and its lead of the solve ends, with
// every batch item waiting for that solve moved back onto its queue
// (promoteLua). The caller has written the item's outcome, and its
// answer to the cache, first.
//
// KEYS[1] the solve's batch-item lead
// KEYS[2] the batch items waiting for the solve
// KEYS[3..] the sharing's keys (fairLua, kb = 3), the owner's among them
// ARGV[1] the slot's member
// ARGV[2] now, Unix nanoseconds
// ARGV[3] the owner
// ARGV[4..] the sharing's arguments (fairLua, ab = 4)
//
// Returns 1 when a parked run was promoted, or stale (fairLua).
var releaseSlotScript = redis.NewScript(quotaLua + promoteLua + fairLua + passLua + `
local G, reg = fair_open(3, 4)
if not G then return stale(reg) end
local p = 0
if redis.call('ZREM', G.by[ARGV[3]].sk, ARGV[1]) == 1 then p = give(G, ARGV[3], ARGV[2], true) end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  promote_all(KEYS[2], ARGV[2])
end
return p
`)

// passSlotScript is passLua's pass for a batch item's run that takes no
// slot after all (worker.Gate.PassSlot). With a solve named, the run also
// leaves that solve's parked items: an earlier delivery whose worker died
// before asynq moved it to the retry set stays in the set otherwise
// (promoteLua keeps members whose asynq state is active). When the
// solve's answer is cached it also moves up to 64 more of the batch
// items waiting for that solve back onto their queue: a solve's end
// moves 64, and each copy that comes back to the cached answer moves
// more, so that many copies follow one solve within a few rounds rather
// than each waiting out its own delay.
//
// KEYS[1] the batch items waiting for the solve (keys.solveParked), or
// the owner's parked runs when the run names no solve
// KEYS[2] the puzzle's cache entry, or the owner's parked runs when the
// run names no solve
// KEYS[3..] the sharing's keys (fairLua, kb = 3), the owner's among them
// ARGV[1] the run's parked member (parkedMember; "" for none)
// ARGV[2] the owner
// ARGV[3] now, Unix nanoseconds
// ARGV[4] "1" when KEYS[1] and KEYS[2] name a solve's waiting items and
// its cache entry
// ARGV[5..] the sharing's arguments (fairLua, ab = 5)
//
// Returns 1 when a parked run was promoted, or stale (fairLua).
var passSlotScript = redis.NewScript(quotaLua + promoteLua + fairLua + passLua + `
local G, reg = fair_open(3, 5)
if not G then return stale(reg) end
local p = pass(G, ARGV[2], ARGV[1], ARGV[3])
if ARGV[4] == '1' then
  if ARGV[1] ~= '' then redis.call('ZREM', KEYS[1], ARGV[1]) end
  if redis.call('EXISTS', KEYS[2]) == 1 then promote_all(KEYS[1], ARGV[3]) end
end
return p
`)

// AdmitSlot decides what a run of an expensive batch item does
// (admitSlotScript).
func (s *Store) AdmitSlot(ctx context.Context, r worker.SlotRun, cap int) (worker.SlotAdmission, error) {
	res, err := s.runFair(ctx, admitSlotScript, []string{s.k.solve(r.Solve), s.k.solveItemLead(r.Solve), s.k.solveParked(r.Solve), s.k.cache(r.CacheKey)},
		[]any{r.Slot, leaseMS(r.LeaseOrDefault()), r.Owner, parkedMember(r.Queue, r.AsynqID), int64(s.taskTTL / time.Second), nowNS(s.now()), alone(r.Alone)},
		r.Owner, r.Slots, cap)
	v, _ := res.([]any)
	if err != nil || len(v) != 2 {
		return worker.SlotAdmission{}, fmt.Errorf("store: admit slot %s: %v (reply %v)", r.Slot, err, v)
	}
	verdict, _ := v[0].(string)
	n, _ := v[1].(int64)
	a := worker.SlotAdmission{Verdict: worker.Verdict(verdict)}
	switch a.Verdict {
	case worker.VerdictRun, worker.VerdictHit:
	case worker.VerdictJoined:
		a.Waited = time.Duration(n) * time.Millisecond
	case worker.VerdictWait:
		a.Place = int(n)
	default:
		return a, fmt.Errorf("store: admit slot %s: unknown verdict %q", r.Slot, verdict)
	}
	return a, nil
}

// RenewSlot extends r's slot (renewSlotScript).
func (s *Store) RenewSlot(ctx context.Context, r worker.SlotRun) error {
	if err := renewSlotScript.Run(ctx, s.rdb, []string{s.k.ownerRunning(r.Owner), s.k.solveItemLead(r.Solve), s.k.gateOwners()}, r.Slot,
		leaseMS(r.LeaseOrDefault()), r.Owner).Err(); err != nil {
		return fmt.Errorf("store: renew slot %s: %w", r.Slot, err)
	}
	return nil
}

// ReleaseSlot frees r's slot and promotes the owner's longest-parked run
// (releaseSlotScript).
func (s *Store) ReleaseSlot(ctx context.Context, r worker.SlotRun) error {
	_, err := s.runFair(ctx, releaseSlotScript, []string{s.k.solveItemLead(r.Solve), s.k.solveParked(r.Solve)},
		[]any{r.Slot, nowNS(s.now()), r.Owner}, r.Owner, r.Slots, r.Ceiling)
	if err != nil {
		return fmt.Errorf("store: release slot %s: %w", r.Slot, err)
	}
	return nil
}

// PassSlot takes r out of r.Owner's parked runs and, while the owner
// holds fewer than cap slots, promotes its longest-parked run in r's
// place; with r.Solve set r also leaves that solve's parked items, and
// more of them move when r.CacheKey holds its answer (passSlotScript).
func (s *Store) PassSlot(ctx context.Context, r worker.SlotRun, cap int) error {
	keys := []string{s.k.ownerParked(r.Owner), s.k.ownerParked(r.Owner)}
	joined := "0"
	if r.Solve != "" {
		keys[0], keys[1], joined = s.k.solveParked(r.Solve), s.k.cache(r.CacheKey), "1"
	}
	_, err := s.runFair(ctx, passSlotScript, keys, []any{parkedMember(r.Queue, r.AsynqID), r.Owner, nowNS(s.now()), joined},
		r.Owner, r.Slots, cap)
	if err != nil {
		return fmt.Errorf("store: pass slot of %s: %w", r.Slot, err)
	}
	return nil
}

// Parked returns how many of owner's expensive runs wait for a slot, for
// tests and operators.
func (s *Store) Parked(ctx context.Context, owner string) (int, error) {
	n, err := s.rdb.ZCard(ctx, s.k.ownerParked(owner)).Result()
	if err != nil {
		return 0, fmt.Errorf("store: parked count: %w", err)
	}
	return int(n), nil
}
