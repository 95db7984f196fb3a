package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/asynqdata"
)

// The solver slots of the cluster are shared between the API keys with
// expensive work by weighted max-min fairness, decided in the scripts
// that take, free and hand on a slot (admitScript, admitSlotScript,
// finishSolveScript, releaseSolveScript, releaseSlotScript,
// passSlotScript), so that two workers never both take the last slot.
//
// With S the cluster's solver slots (the live entries of keys.gateSlots,
// which every worker writes at start and with each heartbeat, read in
// the script that decides) and K the keys
// registered in keys.gateOwners (every key holding, reserving or parked
// for a slot), each key's demand is what it holds, reserves and has
// parked (at most the hard ceiling, when one is set), and its fair share
// is S filled over K by weight (keys.gateWeights, 1 by default): every
// key gets the same slots per unit of weight, except that a key demanding
// less keeps only its demand and leaves the rest to the others
// (water-filling). A run takes a slot when the cluster has one free and
// its key holds fewer than its share; so a key alone may use every slot.
// A slot that frees, or that a promoted run hands on, goes to the parked
// run of the key that then holds the fewest slots per unit of weight
// among the keys under their share (ties: the key whose run has waited
// longest), promoted onto its queue at once (promoteLua). A run that
// asks with worker.SolveRun.Slots 0 turns the sharing off (a task's last
// delivery, which must not wait): it then counts only against its own
// key's ceiling, and a freed slot goes to its own key's longest-parked
// run. Otherwise its Slots is S only while no worker's entry is live (a
// Redis that lost its data, before the next beats; direct calls in
// tests): the cluster's size comes from Redis at the moment of the
// decision, so workers that start together, or that KEDA adds, count at
// once rather than when each worker next looks.
//
// Each of those scripts names every key's slots and parked runs in KEYS:
// the caller passes the keys it last saw registered (fairOwners) and
// the script first checks that none is missing. When one is, it changes
// nothing and answers {"stale", registered keys...}, and the caller runs
// it again with them (runFair).

// liveSlotsLua defines live_slots(hk, now): the sum of the live entries
// ("slots:expiry") of keys.gateSlots, the cluster's solver slots S, after
// removing the expired ones. The sharing scripts and the feed read S
// with it.
const liveSlotsLua = `
local function live_slots(hk, now)
  local e = redis.call('HGETALL', hk)
  local n = 0
  for i = 1, #e, 2 do
    local c = string.find(e[i + 1], ':', 1, true)
    local s, exp = 0, 0
    if c then
      s = tonumber(string.sub(e[i + 1], 1, c - 1)) or 0
      exp = tonumber(string.sub(e[i + 1], c + 1)) or 0
    end
    if exp > now then n = n + s else redis.call('HDEL', hk, e[i]) end
  end
  return n
end
`

// fairLua holds the functions of the sharing; it comes after quotaLua and
// promoteLua. Its part of KEYS and ARGV begins at kb and ab, which each
// script states:
//
// KEYS[kb] the registered keys (keys.gateOwners)
// KEYS[kb+1] the keys' weights (keys.gateWeights)
// KEYS[kb+2] the workers' solver slots (keys.gateSlots)
// KEYS[kb+3i], KEYS[kb+3i+1], KEYS[kb+3i+2] for i = 1..n: key i's
// slots (keys.ownerRunning), parked runs (keys.ownerParked) and promoted
// runs (keys.ownerPromoted)
// ARGV[ab] 0 for no sharing; otherwise S while no worker's entry in
// keys.gateSlots is live
// ARGV[ab+1] the hard ceiling of slots per key (0: none)
// ARGV[ab+2] n
// ARGV[ab+2+i] for i = 1..n: key i's name (the run's own key among them)
//
// fair_open(kb, ab) returns the state G, or nil and the registered keys
// when one of them is missing from the n (the script must then write
// nothing and return stale(reg)); G.S is live_slots' sum, or ARGV[ab]
// when it is 0. live_slots(hk, now) sums the live entries of
// keys.gateSlots and removes the expired ones. fair_count(G, now, keep) counts each key's
// live slots h, reservations r (promoteLua's reserved), parked runs p and
// weight w, and unregisters a key other than keep with none of the three. shares(G, a,
// extra) sets each key's fair share f, counting extra more runs for key a
// (a run asking for a slot that is not yet parked). fair_fill(G, now_ns)
// promotes one parked run of the most under-served key that may take a
// slot now (fair_candidates), and returns 1 when it moved one.
const fairLua = liveSlotsLua + `
local function stale(reg)
  local out = {'stale'}
  for i = 1, #reg do out[#out + 1] = reg[i] end
  return out
end
local function fair_open(kb, ab)
  local G = {ok = KEYS[kb], wk = KEYS[kb + 1], hk = KEYS[kb + 2], S = tonumber(ARGV[ab]), cap = tonumber(ARGV[ab + 1]), list = {}, by = {}}
  local n = tonumber(ARGV[ab + 2])
  for i = 1, n do
    local o = {name = ARGV[ab + 2 + i], sk = KEYS[kb + 3 * i], pk = KEYS[kb + 3 * i + 1], mk = KEYS[kb + 3 * i + 2], h = 0, r = 0, p = 0, w = 1, f = 0}
    G.list[i] = o
    G.by[o.name] = o
  end
  local reg = redis.call('ZRANGE', G.ok, 0, -1)
  for i = 1, #reg do
    if not G.by[reg[i]] then return nil, reg end
  end
  if G.S > 0 then
    local live = live_slots(G.hk, clock())
    if live > 0 then G.S = live end
  end
  return G
end
local function fair_register(G, name)
  redis.call('ZADD', G.ok, 'NX', 0, name)
end
local function fair_count(G, now, keep)
  G.U = 0
  for _, o in ipairs(G.list) do
    redis.call('ZREMRANGEBYSCORE', o.sk, '-inf', now)
    o.h = redis.call('ZCARD', o.sk)
    o.r = reserved(o.mk, '', now)
    o.p = redis.call('ZCARD', o.pk)
    o.w = tonumber(redis.call('HGET', G.wk, o.name)) or 1
    if o.w <= 0 then o.w = 1 end
    G.U = G.U + o.h + o.r
    if o.h + o.r + o.p == 0 and o.name ~= keep then redis.call('ZREM', G.ok, o.name) end
  end
end
local function shares(G, a, extra)
  local open, left = {}, G.S
  for _, o in ipairs(G.list) do
    o.d = o.h + o.r + o.p
    if o == a then o.d = o.d + extra end
    if G.cap > 0 and o.d > G.cap then o.d = G.cap end
    o.f = 0
    if o.d > 0 then open[#open + 1] = o end
  end
  while #open > 0 and left > 0 do
    local sw = 0
    for _, o in ipairs(open) do sw = sw + o.w end
    local level = left / sw
    local rest, done = {}, false
    for _, o in ipairs(open) do
      if o.d <= level * o.w then
        o.f = o.d
        left = left - o.d
        done = true
      else
        rest[#rest + 1] = o
      end
    end
    if not done then
      for _, o in ipairs(rest) do o.f = level * o.w end
      return
    end
    open = rest
  end
end
local function fair_candidates(G)
  local c = {}
  if G.U >= G.S then return c end
  for _, o in ipairs(G.list) do
    if o.p > 0 and o.h + o.r < o.f and (G.cap == 0 or o.h + o.r < G.cap) then
      local first = redis.call('ZRANGE', o.pk, 0, 0, 'WITHSCORES')
      o.since = tonumber(first[2]) or 0
      c[#c + 1] = o
    end
  end
  table.sort(c, function(x, y)
    local a, b = (x.h + x.r) / x.w, (y.h + y.r) / y.w
    if a ~= b then return a < b end
    if x.since ~= y.since then return x.since < y.since end
    return x.name < y.name
  end)
  return c
end
local function fair_fill(G, now_ns)
  for _, o in ipairs(fair_candidates(G)) do
    if promote(o.pk, now_ns, o.mk) == 1 then return 1 end
  end
  return 0
end
`

// fairOwners caches the keys the sharing scripts last found registered,
// so that a script names them all in KEYS without a read before it.
type fairOwners struct {
	mu    sync.Mutex
	names []string
}

func (f *fairOwners) get(owner string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.names)
	if !slices.Contains(out, owner) {
		out = append(out, owner)
	}
	return out
}

func (f *fairOwners) set(names []string) {
	f.mu.Lock()
	f.names = names
	f.mu.Unlock()
}

// fairTries bounds runFair's reruns: each one follows a change of the
// registered keys between two calls, which is rare (a key starts or
// ends its expensive work).
const fairTries = 8

// runFair runs a sharing script (fairLua) with its own keys and args,
// then the sharing's part: the keys of every registered key and of
// owner, slots (0: no sharing; otherwise S while no worker is
// registered) and the ceiling. A stale answer reruns it with the keys it
// names.
func (s *Store) runFair(ctx context.Context, sc *redis.Script, keys []string, args []any, owner string, slots, ceiling int) (any, error) {
	for range fairTries {
		names := s.fair.get(owner)
		k := append(slices.Clip(keys), s.k.gateOwners(), s.k.gateWeights(), s.k.gateSlots())
		a := append(slices.Clip(args), slots, ceiling, len(names))
		for _, n := range names {
			k = append(k, s.k.ownerRunning(n), s.k.ownerParked(n), s.k.ownerPromoted(n))
			a = append(a, n)
		}
		v, err := sc.Run(ctx, s.rdb, k, a...).Result()
		if err != nil {
			return nil, err
		}
		if l, ok := v.([]any); ok && len(l) > 0 && l[0] == "stale" {
			reg := make([]string, 0, len(l)-1)
			for _, x := range l[1:] {
				if n, ok := x.(string); ok {
					reg = append(reg, n)
				}
			}
			s.fair.set(reg)
			continue
		}
		return v, nil
	}
	return nil, fmt.Errorf("store: the keys with expensive work kept changing over %d tries", fairTries)
}

// registerSlotsScript writes a worker's entry in keys.gateSlots: its
// solver slots, live until ttl from now by Redis's clock. When S grows
// by it (the worker is new, or its entry had expired), parked runs are
// promoted at once, one per slot gained while a key under its share has
// one (fair_fill): otherwise they wait for the next admission or their
// retry delay beside the new slots.
//
// KEYS[1..] the sharing's keys (fairLua, kb = 1)
// ARGV[1] the worker's ID
// ARGV[2] its solver slots
// ARGV[3] ttl, milliseconds
// ARGV[4] now, Unix nanoseconds (for promoteLua)
// ARGV[5..] the sharing's arguments (fairLua, ab = 5; its S is 0)
//
// Returns S with the worker's entry, or stale (fairLua).
var registerSlotsScript = redis.NewScript(quotaLua + promoteLua + fairLua + `
local G, reg = fair_open(1, 5)
if not G then return stale(reg) end
local now = clock()
local before = live_slots(G.hk, now)
redis.call('HSET', G.hk, ARGV[1], string.format('%d:%d', tonumber(ARGV[2]), now + tonumber(ARGV[3])))
G.S = live_slots(G.hk, now)
for _ = 1, G.S - before do
  fair_count(G, now, nil)
  shares(G, nil, 0)
  if fair_fill(G, ARGV[4]) == 0 then break end
end
return G.S
`)

// RegisterSlots records that worker runs slots solver slots, for ttl
// unless written again, and returns the cluster's solver slots S with
// them (registerSlotsScript): a worker calls it at start and with every
// heartbeat, and Leave (or the watchdog's Reap) removes the entry.
func (s *Store) RegisterSlots(ctx context.Context, workerID string, slots int, ttl time.Duration) (int, error) {
	if slots <= 0 || ttl <= 0 {
		return 0, fmt.Errorf("store: register %d solver slots of %s for %s: both must be positive", slots, workerID, ttl)
	}
	res, err := s.runFair(ctx, registerSlotsScript, nil, []any{workerID, slots, ttl.Milliseconds(), nowNS(s.now())}, "", 0, 0)
	n, ok := res.(int64)
	if err == nil && !ok {
		err = fmt.Errorf("reply %v", res)
	}
	if err != nil {
		return 0, fmt.Errorf("store: register the solver slots of %s: %w", workerID, err)
	}
	return int(n), nil
}

// ClusterSlots returns the solver slots of the workers registered now
// (RegisterSlots' live entries), for tests and operators.
func (s *Store) ClusterSlots(ctx context.Context) (int, error) {
	m, err := s.rdb.HGetAll(ctx, s.k.gateSlots()).Result()
	if err != nil {
		return 0, fmt.Errorf("store: cluster slots: %w", err)
	}
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("store: cluster slots: %w", err)
	}
	total := 0
	for _, v := range m {
		n, exp, ok := strings.Cut(v, ":")
		slots, err1 := strconv.Atoi(n)
		at, err2 := strconv.ParseInt(exp, 10, 64)
		if ok && err1 == nil && err2 == nil && at > now.UnixMilli() {
			total += slots
		}
	}
	return total, nil
}

// SetWeights records each API key's weight in the share of solver slots
// (keys.gateWeights), replacing what was there: a key not named has
// weight 1. The API calls it at start with the weights of API_KEYS_FILE.
func (s *Store) SetWeights(ctx context.Context, weights map[string]int) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, s.k.gateWeights())
		for name, w := range weights {
			if w > 0 && w != 1 {
				p.HSet(ctx, s.k.gateWeights(), name, w)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: set key weights: %w", err)
	}
	return nil
}

// SlotUse is one key's use of the solver slots.
type SlotUse struct {
	Owner string
	Held  int
	// Waiting counts the key's runs parked for a slot (Parking.ByOwner).
	Waiting int
}

// SlotUses returns the slots held and the runs waiting of every key with
// expensive work (keys.gateOwners), for metrics and operators.
func (s *Store) SlotUses(ctx context.Context) ([]SlotUse, error) {
	p, err := s.Parking(ctx)
	if err != nil {
		return nil, err
	}
	// Every key's held count in one round trip, so that a scrape costs
	// the same few round trips with a hundred keys as with one.
	held := make([]*redis.IntCmd, len(p.owners))
	if _, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, n := range p.owners {
			held[i] = s.runningCmd(ctx, pl, n)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("store: running count: %w", err)
	}
	out := make([]SlotUse, 0, len(p.owners))
	for i, n := range p.owners {
		out = append(out, SlotUse{Owner: n, Held: int(held[i].Val()), Waiting: p.ByOwner[n]})
	}
	return out, nil
}

// Parking is the expensive runs that wait for a solver slot: those of
// the keys' parked runs (keys.ownerParked) whose asynq task sits in its
// queue's retry set now. asynq counts them as retries; they are not, and
// GET /v1/status, the dashboard and puzzleq_waiting show them apart.
type Parking struct {
	// ByQueue and ByOwner count the waiting runs per asynq queue and per
	// API key; a queue or key with none is absent.
	ByQueue map[string]int
	ByOwner map[string]int
	// Oldest is, per queue with waiting runs, how long the
	// longest-waiting of them has waited since it was first told to wait,
	// by Redis's clock (which the scripts that park runs write).
	Oldest map[string]time.Duration
	// Retry is, per queue asked for that has parked runs, how many tasks
	// its retry set holds, read in one transaction with the waiting runs
	// of the queue, so that ByQueue[q] of them wait for a slot and the
	// rest are retries, with no run counted on both sides or neither.
	Retry  map[string]int
	owners []string
}

// parkingChunk bounds the members of one ZMSCORE that Parking sends.
const parkingChunk = 1024

// Parking reads the runs waiting for a solver slot, in three round trips
// (the registered keys, their parked runs, and in one transaction those
// runs' places in their queues' retry sets, the sizes of the retry sets
// of queues and Redis's time), in time linear in the parked runs.
//
// A parked run whose task is not in the retry set is not counted: it
// runs now (it came back by its retry delay and has not yet been
// admitted), or it has just been told to wait and asynq has not yet moved
// it there, or its task is gone and the next promotion drops it. A
// parked run that asynq's lease recovery retried (its worker died while
// it waited) is counted, though its retry delay is a retry's; that is
// rare and ends with the delay. The parked runs are read a round trip
// before the transaction: a run parked for the first time in between and
// already moved to the retry set by asynq counts as a retry, for that
// one read.
func (s *Store) Parking(ctx context.Context, queues ...string) (Parking, error) {
	out := Parking{ByQueue: map[string]int{}, ByOwner: map[string]int{}, Oldest: map[string]time.Duration{}, Retry: map[string]int{}}
	names, err := s.rdb.ZRange(ctx, s.k.gateOwners(), 0, -1).Result()
	if err != nil {
		return out, fmt.Errorf("store: parked runs: %w", err)
	}
	out.owners = names
	if len(names) == 0 {
		return out, nil
	}
	parked := make([]*redis.ZSliceCmd, len(names))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, n := range names {
			parked[i] = p.ZRangeWithScores(ctx, s.k.ownerParked(n), 0, -1)
		}
		return nil
	}); err != nil {
		return out, fmt.Errorf("store: parked runs: %w", err)
	}
	type run struct {
		owner string
		since float64
	}
	byQueue := map[string][]string{}
	runs := map[string][]run{}
	for i, c := range parked {
		for _, z := range c.Val() {
			m, _ := z.Member.(string)
			q, id, ok := strings.Cut(m, "\t")
			if !ok || q == "" || id == "" {
				continue
			}
			byQueue[q] = append(byQueue[q], id)
			runs[q] = append(runs[q], run{owner: names[i], since: z.Score})
		}
	}
	type look struct {
		queue string
		from  int
		cmd   *redis.FloatSliceCmd
	}
	var looks []look
	var now *redis.TimeCmd
	cards := map[string]*redis.IntCmd{}
	if _, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		for _, q := range queues {
			if _, ok := byQueue[q]; ok {
				cards[q] = p.ZCard(ctx, asynqdata.RetryKey(q))
			}
		}
		for q, ids := range byQueue {
			for from := 0; from < len(ids); from += parkingChunk {
				to := min(from+parkingChunk, len(ids))
				looks = append(looks, look{queue: q, from: from, cmd: p.ZMScore(ctx, asynqdata.RetryKey(q), ids[from:to]...)})
			}
		}
		return nil
	}); err != nil {
		return out, fmt.Errorf("store: parked runs in the retry sets: %w", err)
	}
	for q, c := range cards {
		out.Retry[q] = int(c.Val())
	}
	for _, l := range looks {
		for j, sc := range l.cmd.Val() {
			if sc == 0 {
				continue // not in the retry set (see above)
			}
			r := runs[l.queue][l.from+j]
			out.ByQueue[l.queue]++
			out.ByOwner[r.owner]++
			waited := max(now.Val().Sub(time.UnixMilli(int64(r.since))), 0)
			out.Oldest[l.queue] = max(out.Oldest[l.queue], waited)
		}
	}
	return out, nil
}
