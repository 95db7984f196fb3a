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
// pending_since, mark) returns 1 when it moved a run. With mark (a slot
// was freed for the run) the run's member is also written to the parked
// key's ":promoted" set, until its admission: a promoted run that then
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
// worker's slot (TestPromotionReservationLapses). A move without mark
// (promote_all: a solve's waiting items) reserves nothing and goes to the
// tail.
//
// reserved(parked key, a run's parked member or "", now in Unix ms)
// counts the reservations of the owner's promoted runs other than that
// member's.
var promoteLua = `
local wait_msg = [==[` + worker.WaitMessage + `]==]
local reserve_ms = ` + strconv.FormatInt(worker.SolveLease.Milliseconds(), 10) + `
local function reserved(pk, member, now)
  local mk = pk .. ':promoted'
  local from = now - reserve_ms
  local n = redis.call('ZCOUNT', mk, from, '+inf')
  if member ~= '' then
    local at = redis.call('ZSCORE', mk, member)
    if at and tonumber(at) >= from then n = n - 1 end
  end
  return n
end
local function promote(pk, now_ns, mark)
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
      if mark then
        redis.call('RPUSH', base .. 'pending', id)
      else
        redis.call('LPUSH', base .. 'pending', id)
      end
      redis.call('HSET', base .. 't:' .. id, 'state', 'pending', 'pending_since', now_ns)
      if mark then
        local mk = pk .. ':promoted'
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

// passLua hands on the slot that a run was promoted into when that run
// takes none after all (its task or item ended, was canceled or cached
// while it was parked; or it joined a solve in flight): it leaves its
// owner's parked set and, if a freed slot promoted it (its member is in
// the ":promoted" set, see promoteLua) and the owner's live slots with
// its other promoted runs' reservations are under its cap (0: none), the
// owner's longest-parked run is promoted in its place. A run that came
// back by its retry delay, or from a solve's parked set, hands on
// nothing: no slot was freed for it.
// Without it such a run would end a chain of promotions, and the key's
// other parked runs would wait out their retry delays beside a free
// slot. It comes after quotaLua and promoteLua.
//
// pass(slots key, parked key, the run's parked member or "", cap, now in
// Unix nanoseconds) returns 1 when it promoted a run.
const passLua = `
local function pass(sk, pk, member, cap, now_ns)
  if member == '' then return 0 end
  redis.call('ZREM', pk, member)
  if redis.call('ZREM', pk .. ':promoted', member) == 0 then return 0 end
  local now = clock()
  redis.call('ZREMRANGEBYSCORE', sk, '-inf', now)
  if cap > 0 and redis.call('ZCARD', sk) + reserved(pk, '', now) >= cap then return 0 end
  return promote(pk, now_ns, true)
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
//  4. The owner's live slots (leases not yet ended) and the slots
//     reserved for its other promoted runs (promoteLua) are at the cap,
//     and this task holds none of them: wait, counting the wait in the
//     record, and park the task's asynq task in the owner's parked set
//     (first wait's time kept), where the next run of the owner to free
//     a slot finds it (promoteLua). Any other verdict takes it out of the
//     set, and skip, hit and joined, which take no slot, hand on the one
//     this run may have been promoted into (passLua).
//  5. Otherwise run: take a slot and the solve's lease, mark the task
//     active (an attempt, started_at once) like startManyScript. If the
//     owner's slots and reservations are still under the cap, promote
//     its longest-parked run too: a cap that was raised (or a slot whose
//     worker died, or a promotion that was lost) would otherwise leave
//     free slots beside parked runs until each came back by its own
//     retry delay, and this way each admission fills one more
//     (TestRaisedCapFillsFromTheLine).
//
// KEYS[1] task hash
// KEYS[2] cache entry of the puzzle
// KEYS[3] the solve's lease (keys.solve)
// KEYS[4] the solve's waiters (keys.solveWaiters)
// KEYS[5] the owner's slots (keys.ownerRunning)
//
// ARGV[1] task ID
// ARGV[2] owner ("" when auth is off)
// ARGV[3] lease, milliseconds
// ARGV[4] the owner's cap of slots (0: none)
// ARGV[5] record TTL, seconds (the waiters hash lives as long)
// ARGV[6] now, Unix milliseconds (started_at)
// ARGV[7] the solve's key (worker.SolveRun.Solve)
// ARGV[8] task key prefix (keys.task(""))
// ARGV[9] the run's parked member (parkedMember; "" never parks)
// ARGV[10] now, Unix nanoseconds (for promoteLua)
//
// KEYS[6] the owner's parked runs (keys.ownerParked)
//
// Returns {verdict, value}: {"run", ""}, {"joined", lead task ID},
// {"wait", waits so far}, {"hit", result} or {"skip", ""}.
var admitScript = redis.NewScript(quotaLua + liveLua + promoteLua + passLua + `
local function unpark(pk, member)
  if member ~= '' then
    redis.call('ZREM', pk, member)
    redis.call('ZREM', pk .. ':promoted', member)
  end
end
local function fill(sk, pk, cap, now_ns)
  if cap > 0 and redis.call('ZCARD', sk) + reserved(pk, '', clock()) < cap then
    promote(pk, now_ns, true)
  end
end
local cap = tonumber(ARGV[4])
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
  redis.call('EXPIRE', KEYS[4], ARGV[5])
  redis.call('HSET', KEYS[1], 'solve', ARGV[7])
elseif live(KEYS[4], ARGV[8]) == 0 then
  pass(KEYS[5], KEYS[6], ARGV[9], cap, ARGV[10])
  return {'skip', ''}
end
local hit = redis.call('GET', KEYS[2])
if hit then pass(KEYS[5], KEYS[6], ARGV[9], cap, ARGV[10]); return {'hit', hit} end
local lead = redis.call('GET', KEYS[3])
if lead and lead ~= ARGV[1] then
  pass(KEYS[5], KEYS[6], ARGV[9], cap, ARGV[10])
  start(KEYS[1], ARGV[6])
  if runnable then redis.call('HSET', KEYS[1], 'joined', lead) end
  return {'joined', lead}
end
local now = clock()
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
if cap > 0 and not redis.call('ZSCORE', KEYS[5], ARGV[1]) and redis.call('ZCARD', KEYS[5]) + reserved(KEYS[6], ARGV[9], now) >= cap then
  local w = 0
  if runnable then w = redis.call('HINCRBY', KEYS[1], 'waits', 1) end
  if ARGV[9] ~= '' then
    redis.call('ZADD', KEYS[6], 'NX', now, ARGV[9])
    redis.call('EXPIRE', KEYS[6], ARGV[5])
    redis.call('ZREM', KEYS[6] .. ':promoted', ARGV[9])
  end
  return {'wait', tostring(w)}
end
unpark(KEYS[6], ARGV[9])
local lease = tonumber(ARGV[3])
redis.call('ZADD', KEYS[5], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[5], lease)
redis.call('SET', KEYS[3], ARGV[1], 'PX', lease)
start(KEYS[1], ARGV[6])
fill(KEYS[5], KEYS[6], cap, ARGV[10])
return {'run', ''}
`)

// renewSolveScript extends a run's slot and its solve's lease. The lease
// is taken again when it has lapsed (nobody else took it), never from
// another run that took it meanwhile.
//
// KEYS[1] the solve's lease
// KEYS[2] the owner's slots
// ARGV[1] task ID
// ARGV[2] lease, milliseconds
//
// Returns 1 while the run holds the solve's lease, 0 when another run
// took it.
var renewSolveScript = redis.NewScript(quotaLua + `
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
// KEYS[3] the run's owner's slots
// KEYS[4] cache entry of the puzzle
// KEYS[5] the run's task hash
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
// KEYS[6] the owner's parked runs: the freed slot goes to the first
// (promoteLua)
// KEYS[7] the batch items waiting for this solve (keys.solveParked): all
// go back onto their queue
//
// Returns how many records it ended.
var finishSolveScript = redis.NewScript(quotaLua + promoteLua + `
if ARGV[3] == 'completed' and ARGV[7] ~= '1' and ARGV[4] ~= '' then
  redis.call('SET', KEYS[4], ARGV[4], 'NX', 'EX', ARGV[14])
  redis.call('EXPIRE', KEYS[4], ARGV[14], 'GT')
end
local w = redis.call('HGETALL', KEYS[1])
local listed = false
for i = 1, #w, 2 do
  if w[i] == ARGV[2] then listed = true end
end
if not listed then
  w[#w + 1] = ARGV[2]
  w[#w + 1] = redis.call('HGET', KEYS[5], 'owner') or ''
end
local ends, owners = {}, {}
local n = 0
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
if redis.call('ZREM', KEYS[3], ARGV[2]) == 1 then promote(KEYS[6], ARGV[15], true) end
promote_all(KEYS[7], ARGV[15])
return n
`)

// releaseSolveScript gives up a run whose solve was canceled: unless a
// task joined meanwhile (a live waiter), the run's slot and lease go.
//
// KEYS[1] the solve's waiters
// KEYS[2] the solve's lease
// KEYS[3] the run's owner's slots
// KEYS[4] the owner's parked runs: the freed slot goes to the first
// KEYS[5] the batch items waiting for this solve: all go back onto their
// queue, where one leads a solve of its own
// ARGV[1] the run's task ID
// ARGV[2] task key prefix
// ARGV[3] now, Unix nanoseconds (for promoteLua)
//
// Returns the live waiters: 0 when released, otherwise the solve is
// still owed and nothing was released.
var releaseSolveScript = redis.NewScript(liveLua + promoteLua + `
local n = live(KEYS[1], ARGV[2])
if n > 0 then return n end
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then promote(KEYS[4], ARGV[3], true) end
promote_all(KEYS[5], ARGV[3])
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

// Admit decides what a run of an expensive single task does, in one
// round trip (admitScript).
func (s *Store) Admit(ctx context.Context, r worker.SolveRun, cap int) (worker.Admission, error) {
	keys := []string{s.k.task(r.ID), s.k.cache(r.CacheKey), s.k.solve(r.Solve), s.k.solveWaiters(r.Solve),
		s.k.ownerRunning(r.Owner), s.k.ownerParked(r.Owner)}
	v, err := admitScript.Run(ctx, s.rdb, keys, r.ID, r.Owner, leaseMS(r.LeaseOrDefault()), cap,
		int64(s.taskTTL/time.Second), ms(s.now()), r.Solve, s.k.task(""), parkedMember(r.Queue, r.AsynqID), nowNS(s.now())).StringSlice()
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
	err := renewSolveScript.Run(ctx, s.rdb, []string{s.k.solve(r.Solve), s.k.ownerRunning(r.Owner)},
		r.ID, leaseMS(r.LeaseOrDefault())).Err()
	if err != nil {
		return fmt.Errorf("store: renew solve of %s: %w", r.ID, err)
	}
	return nil
}

// FinishSolve ends every task waiting on r's solve with t's outcome
// (finishSolveScript).
func (s *Store) FinishSolve(ctx context.Context, r worker.SolveRun, t worker.Transition) (int, error) {
	cached := "0"
	if t.Cached {
		cached = "1"
	}
	keys := []string{s.k.solveWaiters(r.Solve), s.k.solve(r.Solve), s.k.ownerRunning(r.Owner), s.k.cache(r.CacheKey), s.k.task(r.ID),
		s.k.ownerParked(r.Owner), s.k.solveParked(r.Solve)}
	args := []any{ms(s.now()), r.ID, string(t.State), string(t.Result), t.Code, t.Msg, cached, s.k.events(), s.k.task("")}
	args = append(args, s.k.ownerAffixes()...)
	args = append(args, int64(s.resultTTL/time.Second), nowNS(s.now()), TaskEventKey(""))
	n, err := finishSolveScript.Run(ctx, s.rdb, keys, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("store: finish solve of %s: %w", r.ID, err)
	}
	return n, nil
}

// ReleaseSolve gives up a canceled run unless a task joined it meanwhile
// (releaseSolveScript).
func (s *Store) ReleaseSolve(ctx context.Context, r worker.SolveRun) (int, error) {
	n, err := releaseSolveScript.Run(ctx, s.rdb, []string{s.k.solveWaiters(r.Solve), s.k.solve(r.Solve), s.k.ownerRunning(r.Owner),
		s.k.ownerParked(r.Owner), s.k.solveParked(r.Solve)}, r.ID, s.k.task(""), nowNS(s.now())).Int()
	if err != nil {
		return 0, fmt.Errorf("store: release solve of %s: %w", r.ID, err)
	}
	return n, nil
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
	n, err := s.rdb.ZCount(ctx, s.k.ownerRunning(owner), strconv.FormatInt(ms(s.now())+1, 10), "+inf").Result()
	if err != nil {
		return 0, fmt.Errorf("store: running count: %w", err)
	}
	return int(n), nil
}

// admitSlotScript admits a run of an expensive batch item (its unit runs
// it alone), in this order:
//
//  1. An identical solve is in flight (a single task's, keys.solve, or
//     another batch item's, keys.solveItemLead): join it by waiting. The
//     run is parked in the solve's parked set, whose members all go back
//     onto their queue when that solve ends; they then find its answer in
//     the cache (or, if it failed or stopped, one of them leads).
//  2. The owner's live slots and reservations are at the cap and the
//     run holds none: park it in the owner's parked set and return its
//     place in line, as admitScript does for single tasks.
//  3. Otherwise run: take a slot and lead the solve (solveItemLead). A
//     run that holds its slot or leads already (a redelivery of the same
//     item) keeps them. Under the cap still, promote the owner's
//     longest-parked run too, as admitScript does.
//
// KEYS[1] the owner's slots (keys.ownerRunning)
// KEYS[2] the owner's parked runs (keys.ownerParked)
// KEYS[3] the solve's lease of single tasks (keys.solve)
// KEYS[4] the solve's batch-item lead (keys.solveItemLead)
// KEYS[5] the batch items waiting for the solve (keys.solveParked)
// KEYS[6] the puzzle's cache entry
//
// ARGV[1] the slot's member, also the lead's value (the item's ID)
// ARGV[2] lease, milliseconds
// ARGV[3] the owner's cap of slots (0: none)
// ARGV[4] the run's parked member (parkedMember; "" never parks)
// ARGV[5] the parked sets' TTL, seconds
// ARGV[6] now, Unix nanoseconds (for promoteLua)
// ARGV[7] "1" to run even behind an identical solve in flight
// (worker.SlotRun.Alone: a last delivery must not wait); such a run leads
// the solve only if no other item does
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
// to be promoted).
var admitSlotScript = redis.NewScript(quotaLua + promoteLua + passLua + `
local cap = tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[6]) == 1 then
  pass(KEYS[1], KEYS[2], ARGV[4], cap, ARGV[6])
  if ARGV[4] ~= '' then redis.call('ZREM', KEYS[5], ARGV[4]) end
  return {'hit', 0}
end
local now = clock()
local lead = redis.call('GET', KEYS[4])
if ARGV[7] ~= '1' and (redis.call('EXISTS', KEYS[3]) == 1 or (lead and lead ~= ARGV[1])) then
  pass(KEYS[1], KEYS[2], ARGV[4], cap, ARGV[6])
  if ARGV[4] == '' then return {'joined', 0} end
  redis.call('ZADD', KEYS[5], 'NX', now, ARGV[4])
  redis.call('EXPIRE', KEYS[5], ARGV[5])
  return {'joined', now - tonumber(redis.call('ZSCORE', KEYS[5], ARGV[4]))}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if cap > 0 and not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) + reserved(KEYS[2], ARGV[4], now) >= cap then
  if ARGV[4] == '' then return {'wait', 1} end
  redis.call('ZREM', KEYS[5], ARGV[4])
  redis.call('ZADD', KEYS[2], 'NX', now, ARGV[4])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
  redis.call('ZREM', KEYS[2] .. ':promoted', ARGV[4])
  return {'wait', redis.call('ZRANK', KEYS[2], ARGV[4]) + 1}
end
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease)
if not lead or lead == ARGV[1] then redis.call('SET', KEYS[4], ARGV[1], 'PX', lease) end
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[4])
  redis.call('ZREM', KEYS[2] .. ':promoted', ARGV[4])
  redis.call('ZREM', KEYS[5], ARGV[4])
end
if cap > 0 and redis.call('ZCARD', KEYS[1]) + reserved(KEYS[2], '', now) < cap then promote(KEYS[2], ARGV[6], true) end
return {'run', 0}
`)

// renewSlotScript extends a run's slot and its lead of the solve
// (admitSlotScript); the lead is taken again when it lapsed, never from
// another item that took it meanwhile.
//
// KEYS[1] the owner's slots
// KEYS[2] the solve's batch-item lead
// ARGV[1] the slot's member
// ARGV[2] lease, milliseconds
var renewSlotScript = redis.NewScript(quotaLua + `
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], clock() + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease)
local lead = redis.call('GET', KEYS[2])
if not lead or lead == ARGV[1] then redis.call('SET', KEYS[2], ARGV[1], 'PX', lease) end
return 1
`)

// releaseSlotScript ends a batch item's run (admitSlotScript): its slot
// goes to the owner's longest-parked run, and its lead of the solve ends,
// with every batch item waiting for that solve moved back onto its
// queue (promoteLua). The caller has written the item's outcome, and its
// answer to the cache, first.
//
// KEYS[1] the owner's slots
// KEYS[2] the owner's parked runs
// KEYS[3] the solve's batch-item lead
// KEYS[4] the batch items waiting for the solve
// ARGV[1] the slot's member
// ARGV[2] now, Unix nanoseconds
//
// Returns 1 when a parked run of the owner was promoted.
var releaseSlotScript = redis.NewScript(promoteLua + `
local p = 0
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then p = promote(KEYS[2], ARGV[2], true) end
if redis.call('GET', KEYS[3]) == ARGV[1] then
  redis.call('DEL', KEYS[3])
  promote_all(KEYS[4], ARGV[2])
end
return p
`)

// passSlotScript is passLua for a batch item's run that takes no slot
// after all (worker.Gate.PassSlot). With a solve named, the run also
// leaves that solve's parked items: an earlier delivery whose worker died
// before asynq moved it to the retry set stays in the set otherwise
// (promoteLua keeps members whose asynq state is active). When the
// solve's answer is cached it also moves up to 64 more of the batch
// items waiting for that solve back onto their queue: a solve's end
// moves 64, and each copy that comes back to the cached answer moves
// more, so that many copies follow one solve within a few rounds rather
// than each waiting out its own delay.
//
// KEYS[1] the owner's slots
// KEYS[2] the owner's parked runs
// KEYS[3] the batch items waiting for the solve (keys.solveParked), or
// KEYS[2] again when the run names no solve
// KEYS[4] the puzzle's cache entry, or KEYS[2] again when the run names
// no solve
// ARGV[1] the run's parked member (parkedMember; "" for none)
// ARGV[2] the owner's cap of slots (0: none)
// ARGV[3] now, Unix nanoseconds
// ARGV[4] "1" when KEYS[3] and KEYS[4] name a solve's waiting items and
// its cache entry
//
// Returns 1 when a parked run of the owner was promoted.
var passSlotScript = redis.NewScript(quotaLua + promoteLua + passLua + `
local p = pass(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), ARGV[3])
if ARGV[4] == '1' then
  if ARGV[1] ~= '' then redis.call('ZREM', KEYS[3], ARGV[1]) end
  if redis.call('EXISTS', KEYS[4]) == 1 then promote_all(KEYS[3], ARGV[3]) end
end
return p
`)

// AdmitSlot decides what a run of an expensive batch item does
// (admitSlotScript).
func (s *Store) AdmitSlot(ctx context.Context, r worker.SlotRun, cap int) (worker.SlotAdmission, error) {
	v, err := admitSlotScript.Run(ctx, s.rdb, []string{s.k.ownerRunning(r.Owner), s.k.ownerParked(r.Owner),
		s.k.solve(r.Solve), s.k.solveItemLead(r.Solve), s.k.solveParked(r.Solve), s.k.cache(r.CacheKey)},
		r.Slot, leaseMS(r.LeaseOrDefault()), cap, parkedMember(r.Queue, r.AsynqID), int64(s.taskTTL/time.Second), nowNS(s.now()), alone(r.Alone)).Slice()
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
	if err := renewSlotScript.Run(ctx, s.rdb, []string{s.k.ownerRunning(r.Owner), s.k.solveItemLead(r.Solve)}, r.Slot,
		leaseMS(r.LeaseOrDefault())).Err(); err != nil {
		return fmt.Errorf("store: renew slot %s: %w", r.Slot, err)
	}
	return nil
}

// ReleaseSlot frees r's slot and promotes the owner's longest-parked run
// (releaseSlotScript).
func (s *Store) ReleaseSlot(ctx context.Context, r worker.SlotRun) error {
	err := releaseSlotScript.Run(ctx, s.rdb, []string{s.k.ownerRunning(r.Owner), s.k.ownerParked(r.Owner),
		s.k.solveItemLead(r.Solve), s.k.solveParked(r.Solve)}, r.Slot, nowNS(s.now())).Err()
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
	keys := []string{s.k.ownerRunning(r.Owner), s.k.ownerParked(r.Owner), s.k.ownerParked(r.Owner), s.k.ownerParked(r.Owner)}
	joined := "0"
	if r.Solve != "" {
		keys[2], keys[3], joined = s.k.solveParked(r.Solve), s.k.cache(r.CacheKey), "1"
	}
	err := passSlotScript.Run(ctx, s.rdb, keys, parkedMember(r.Queue, r.AsynqID), cap, nowNS(s.now()), joined).Err()
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
