package store

// Batches are stored as a whole (docs/batches.md): a batch record, its
// items' requests cut into chunks, one result hash per chunk, and a fair
// feed of the units that run them. staging.go writes and commits a batch,
// feed.go moves its units onto the queue, this file starts and ends the
// units, items.go reads the items and cancel.go cancels them; each
// file's scripts are documented beside the Go that runs them.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// unitMargin is added to a unit's items' timeouts for asynq's own timeout,
// like tasks' timeoutMargin: the handler's deadlines must fire first.
const unitMargin = 30 * time.Second

// maxOutcomesPerCall bounds the outcomes one finishUnitScript call takes,
// for the same reason; FinishUnit splits a longer list.
const maxOutcomesPerCall = 1000

// StartUnit marks a unit active (its items' counts move from pending to
// active once, however often it is delivered), counts an attempt, and
// returns the unit's items that have not ended.
func (s *Store) StartUnit(ctx context.Context, ref tasks.UnitRef) (*worker.UnitWork, error) {
	_, n, err := tasks.ParseUnit(ref.Unit)
	if err != nil {
		return nil, err
	}
	now := ms(s.now())
	v, err := startUnitScript.Run(ctx, s.rdb, []string{s.k.batch(ref.BatchID), s.k.batchReq(ref.BatchID)},
		now, ref.Unit[:1], n, s.k.batchResBase(ref.BatchID)).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("store: start unit %s: %w", ref.TaskID(), err)
	}
	w := &worker.UnitWork{}
	if len(v) == 0 {
		return w, nil
	}
	w.Owner = v[0]
	if len(v) == 3 && v[1] == "=" {
		w.Ended = []byte(v[2])
		return w, nil
	}
	if len(v) == 5 && v[1] == "*" {
		// This start wrote the chunk's marker "1 <now>" (one attempt):
		// FinishUnit's cheaper path builds the entries from it.
		w.Mark = v[2] + " " + strconv.FormatInt(now, 10)
		return w, startWhole(w, ref, v[2], v[3], v[4])
	}
	for i := 1; i+1 < len(v); i += 2 {
		idx, err := strconv.Atoi(v[i])
		if err != nil {
			return nil, fmt.Errorf("store: start unit %s: bad index %q", ref.TaskID(), v[i])
		}
		w.Items = append(w.Items, worker.UnitItem{Index: idx, Request: []byte(v[i+1])})
	}
	return w, nil
}

// startWhole fills w from startUnitScript's answer for a whole chunk:
// the item at offset k runs when its kind byte m[k] is a cheap kind's
// (lowercase), with the k-th of the newline-separated request lines.
func startWhole(w *worker.UnitWork, ref tasks.UnitRef, first, m, lines string) error {
	base, err := strconv.Atoi(first)
	if err != nil {
		return fmt.Errorf("store: start unit %s: bad first index %q", ref.TaskID(), first)
	}
	w.Items = make([]worker.UnitItem, 0, len(m))
	for k := 0; k < len(m); k++ {
		line, rest, _ := strings.Cut(lines, "\n")
		lines = rest
		if c := m[k]; c >= 'A' && c <= 'Z' {
			continue
		}
		w.Items = append(w.Items, worker.UnitItem{Index: base + k, Request: []byte(line)})
	}
	return nil
}

// YieldUnit takes back StartUnit's start of own unit ref, whose item
// waits for its owner's expensive slots (yieldUnitScript).
func (s *Store) YieldUnit(ctx context.Context, ref tasks.UnitRef) error {
	chunk, n, err := tasks.ParseUnit(ref.Unit)
	if err != nil {
		return err
	}
	if chunk {
		return fmt.Errorf("store: yield unit %s: not an own unit", ref.TaskID())
	}
	err = yieldUnitScript.Run(ctx, s.rdb, []string{s.k.batch(ref.BatchID), s.k.batchReq(ref.BatchID)},
		n, s.k.batchResBase(ref.BatchID)).Err()
	if err != nil {
		return fmt.Errorf("store: yield unit %s: %w", ref.TaskID(), err)
	}
	return nil
}

// FinishUnit writes the outcomes of a unit's items. Only an item without
// an ended entry gets one (so a redelivered unit, or one whose item was
// canceled meanwhile, changes and counts nothing twice); it moves the
// batch's counts, gives back the owner's quota, publishes the chunk's
// event and, when it ended the batch's last item, sets done_at and
// publishes the batch's. It returns how many items it ended.
//
// mark is the UnitWork.Mark of the StartUnit that began this delivery.
// For a chunk's first delivery it names the chunk's first item and the
// marker the start wrote, and the outcomes go first to
// finishChunkScript, which writes them at a third of the general
// script's cost when nothing else has touched the chunk since the start.
func (s *Store) FinishUnit(ctx context.Context, ref tasks.UnitRef, mark string, outs []worker.ItemOutcome) (int, error) {
	if len(outs) > maxOutcomesPerCall {
		// Each call is exact on its own (an ended item is never counted
		// twice), so splitting keeps the counts exact. Only the first
		// part may take the cheaper path: it leaves entries behind.
		n, err := s.FinishUnit(ctx, ref, mark, outs[:maxOutcomesPerCall])
		if err != nil {
			return n, err
		}
		m, err := s.FinishUnit(ctx, ref, "", outs[maxOutcomesPerCall:])
		return n + m, err
	}
	if len(outs) == 0 {
		return 0, nil
	}
	chunk, n, err := tasks.ParseUnit(ref.Unit)
	if err != nil {
		return 0, err
	}
	rests := make([][]byte, len(outs))
	caches := make([]string, len(outs))
	fast := chunk && mark != ""
	for i, o := range outs {
		if rests[i], caches[i], err = entryRest(o); err != nil {
			return 0, fmt.Errorf("store: finish unit %s: %w", ref.TaskID(), err)
		}
		fast = fast && caches[i] == ""
	}
	now := ms(s.now())
	if fast {
		if v, ok, err := s.finishChunk(ctx, ref, n, mark, now, outs, rests); err != nil || ok {
			return v, err
		}
	}
	bk := s.k.batch(ref.BatchID)
	keys := make([]string, 0, 2+len(outs))
	keys = append(keys, bk, s.k.batchReq(ref.BatchID))
	args := make([]any, 0, 13+4*len(outs))
	args = append(args, s.k.ownerAffixes()...)
	args = append(args, now, s.k.events(), ref.BatchID, ref.Unit[:1], n,
		s.k.batchResBase(ref.BatchID), s.resultTTL.Milliseconds(), chunkEventsOf(ref.BatchID), BatchEventKey(ref.BatchID))
	for i, o := range outs {
		ck := bk
		if caches[i] != "" {
			ck = s.k.cache(o.CacheKey)
		}
		keys = append(keys, ck)
		args = append(args, o.Index, string(o.State), rests[i], caches[i])
	}
	v, err := finishUnitScript.Run(ctx, s.rdb, keys, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("store: finish unit %s: %w", ref.TaskID(), err)
	}
	return v, nil
}

// entryRest builds what follows an outcome's entry start (its state,
// times and attempts): its other members and the closing brace. cached
// is the result to store once in the cache entry the item refers to, ""
// when the result is inline or there is none.
func entryRest(o worker.ItemOutcome) (rest []byte, cached string, err error) {
	switch o.State {
	case apitype.TaskStateCompleted:
		inline := o.Result
		if o.CacheKey != "" && len(o.Result) > 0 {
			ref, _ := json.Marshal(o.CacheKey)
			rest = append(append(rest, `,"ref":`...), ref...)
			cached, inline = string(o.Result), nil
		}
		if o.Cached {
			rest = append(rest, `,"cached":true`...)
		}
		if len(inline) > 0 {
			rest = strconv.AppendInt(append(rest, `,"size":`...), int64(len(inline)), 10)
			rest = append(append(rest, `,"result":`...), inline...)
		}
	case apitype.TaskStateFailed:
		e, _ := json.Marshal(apitype.TaskError{Code: o.Code, Message: truncateMessage(o.Msg)})
		rest = append(append(rest, `,"error":`...), e...)
	default:
		return nil, "", fmt.Errorf("item %d: state %q is not an outcome", o.Index, o.State)
	}
	return append(rest, '}'), cached, nil
}

// finishChunk tries finishChunkScript for chunk j's outcomes, whose
// entries' rests are rests. mark is "<first index> <started_at>" from
// StartUnit. ok is false when the script declined (the chunk is not as
// the start left it) or mark does not parse: the caller then takes the
// general path, to which the script left everything as it was.
func (s *Store) finishChunk(ctx context.Context, ref tasks.UnitRef, j int, mark string, now int64,
	outs []worker.ItemOutcome, rests [][]byte) (ended int, ok bool, err error) {
	first, started, found := strings.Cut(mark, " ")
	base, perr := strconv.Atoi(first)
	if !found || perr != nil {
		return 0, false, nil
	}
	// Every entry starts as the general script's entry() builds it from
	// the marker "1 <started>": one attempt.
	nowS := strconv.FormatInt(now, 10)
	starts := map[apitype.TaskState]string{}
	done := 0
	args := make([]any, 0, 14+2*len(outs))
	args = append(args, s.k.ownerAffixes()...)
	args = append(args, now, s.k.events(), ref.BatchID, j, s.k.batchResBase(ref.BatchID), "1 "+started, 0, base,
		chunkEventsOf(ref.BatchID), BatchEventKey(ref.BatchID))
	for i, o := range outs {
		st, have := starts[o.State]
		if !have {
			st = `{"state":"` + string(o.State) + `","started_at":` + started + `,"completed_at":` + nowS + `,"attempts":1`
			starts[o.State] = st
		}
		if o.State == apitype.TaskStateCompleted {
			done++
		}
		e := make([]byte, 0, len(st)+len(rests[i]))
		args = append(args, o.Index-base, append(append(e, st...), rests[i]...))
	}
	args[10] = done
	v, err := finishChunkScript.Run(ctx, s.rdb, []string{s.k.batch(ref.BatchID), s.k.batchReq(ref.BatchID)}, args...).Int()
	if err != nil {
		return 0, false, fmt.Errorf("store: finish unit %s: %w", ref.TaskID(), err)
	}
	if v < 0 {
		return 0, false, nil
	}
	return v, true, nil
}

// maxErrorMessage bounds a failed item's message as its entry keeps it,
// so that an entry holds a head of a few hundred bytes unless its result
// is inline (tasks keeps only results up to 64 KiB inline). Messages are
// the solvers' and ours, a line each; this only guards the bound.
const maxErrorMessage = 1 << 10

// truncateMessage cuts msg to maxErrorMessage bytes on a rune boundary.
func truncateMessage(msg string) string {
	if len(msg) <= maxErrorMessage {
		return msg
	}
	cut := maxErrorMessage - len("…")
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

// The scripts of a batch's units (docs/batches.md). Every change to a
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
// batch record names its quota keys; each script hands them to settle.
//
// is_own(kb) is true for an own-unit item's kind byte (uppercase).
// marker_field(kb, k) is the field of the active marker of item k's unit.
// parse_marker(v) returns attempts and started_at of a marker value.
// entry(st, started, attempts, now, head, result) builds an ended entry;
// head is extra JSON members ("" for none), result the inline result
// ("" for none), always last so that a reader can cut it off.
// settle(bk, batch, owner, aff, j, delta, n, events, now, chunk_ev,
// batch_ev) moves the batch's counts by delta, counts n more ended items,
// gives the owner's quota back (aff: the owner key affixes, {ARGV[1],
// ..., ARGV[4]}), publishes chunk_ev .. j on events (chunk_ev is
// chunkEventsOf(batch): ChunkEventKey) and, when this ended the batch's
// last item, sets done_at and publishes batch_ev (BatchEventKey).
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
local function settle(bk, batch, owner, aff, j, delta, n, events, now, chunk_ev, batch_ev)
  if n == 0 then return end
  for st, d in pairs(delta) do
    if d ~= 0 then redis.call('HINCRBY', bk, st, d) end
  end
  local after = redis.call('HINCRBY', bk, 'ended', n)
  if owner ~= '' then
    local o = aff[1] .. owner
    release(o .. aff[2], o .. aff[3], o .. aff[4], {[batch] = n})
  end
  redis.call('PUBLISH', events, chunk_ev .. j)
  local total = tonumber(redis.call('HGET', bk, 'total'))
  if after - n < total and after >= total then
    redis.call('HSET', bk, 'done_at', now)
    redis.call('PUBLISH', events, batch_ev)
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
// Returns {} when the batch is gone; {owner} when it is canceled or
// every item of a chunk has ended (no item runs, but the worker hands on
// its owner's slot: worker.Gate's PassSlot); {owner, "=", request} when
// the own item has ended or its batch is canceled (the request names the
// solve whose parked set the run may still be in); else {owner, index_1,
// request_1, index_2, request_2, ...},
// or, for a chunk's first delivery with no entry or marker yet, {owner,
// "*", the chunk's first index, the chunk's kind bytes, its request
// lines}: every item whose kind byte is lowercase runs, with
// the line of its offset.
var startUnitScript = redis.NewScript(batchLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'stride', 'total', 'expires_at', 'canceled_at')
if not b[3] then return {} end
local owner, stride, total = b[1] or '', tonumber(b[2]), tonumber(b[3])
local chunk, n = ARGV[2] == 'c', tonumber(ARGV[3])
local function ended(rq)
  if chunk then return {owner} end
  return {owner, '=', redis.call('HGET', rq, 'x' .. n) or ''}
end
if b[5] then return ended(KEYS[2]) end
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
if #run == 0 then return ended(KEYS[2]) end
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
// the string building and parsing that cost 5-6 µs of Redis per item.
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
// ARGV[12] the prefix of the batch's chunk events (chunkEventsOf)
// ARGV[13] the batch's event (BatchEventKey)
// then 4 values per outcome i, from ARGV[14+4(i-1)]: item index, state
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
for i = 1, nout do fields[i] = tonumber(ARGV[14 + 4 * (i - 1)]) - base end
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
  local a = 14 + 4 * (i - 1)
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
  settle(KEYS[1], ARGV[7], owner, {ARGV[1], ARGV[2], ARGV[3], ARGV[4]}, j, delta, ended, ARGV[6], ARGV[5], ARGV[12], ARGV[13])
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
// finishUnitScript per item (docs/performance.md, "Batches"):
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
// ARGV[13] the prefix of the batch's chunk events (chunkEventsOf)
// ARGV[14] the batch's event (BatchEventKey)
// then pairs from ARGV[15]: an item's offset in the chunk, its entry
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
for a = 15, #ARGV, 2 do
  local k = tonumber(ARGV[a])
  if not k or k < 0 or k >= nm or seen[k] then return -1 end
  local c = string.byte(m, k + 1)
  if c >= 65 and c <= 90 then return -1 end
  seen[k] = true
end
local ended = (#ARGV - 14) / 2
if ended == 0 then return 0 end
local done = tonumber(ARGV[11])
redis.call('HSET', rk, unpack(ARGV, 15, #ARGV))
redis.call('PEXPIREAT', rk, b[4])
settle(KEYS[1], ARGV[7], b[1] or '', {ARGV[1], ARGV[2], ARGV[3], ARGV[4]}, j, {active = -ended, completed = done, failed = ended - done}, ended, ARGV[6], ARGV[5], ARGV[13], ARGV[14])
return ended
`)
