package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

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
// KEYS[10] the virtual time the batch starts from: feed:vt, or the cheap
// lane's when every unit of the batch runs there (keys.cheapFeedVT)
// KEYS[11] backlog
// KEYS[12] the owner's batch index (keys.ownerBatches)
// KEYS[13] the cheap lane's feed
// KEYS[14] the keys' weights (keys.gateWeights)
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
local per = 1
if owner ~= '' then per = math.max(1, math.floor(tonumber(redis.call('HGET', KEYS[14], owner)) or 1)) end
local moved = refill(KEYS[3], KEYS[8], KEYS[13], batch, base, 0, units, tonumber(ARGV[12]), per)
redis.call('HSET', KEYS[1], 'base', base, 'moved', moved, 'fed', 0, 'per', per)
backlog_set(KEYS[11], batch, 0, buckets(units, tonumber(ARGV[13])), exp)
if units > 0 then
  redis.call('PEXPIREAT', KEYS[3], exp)
  redis.call('SET', KEYS[9], string.format('%d', base + math.ceil(units / per)), 'PXAT', exp)
end
if claim ~= '' then redis.call('SET', KEYS[4], claim, 'PXAT', exp) end
return 1
`)

// abandonCommitScript undoes a commit whose reply was lost, unless one of
// the batch's units has left the feed (it is being run, so the batch is
// kept). A batch that was never committed has its staged keys deleted.
// The batch's units in the feed are the ones it moved (see feedLua),
// found among the scores base+1..base+moved (unit k is scored
// base+ceil(k/per), see feedLua) by their batch ID, and its
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
// KEYS[11] the cheap lane's feed
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
if moved < units and not (redis.call('ZSCORE', KEYS[8], mark) or redis.call('ZSCORE', KEYS[11], mark)) then return -1 end
local mine, pre = {[KEYS[8]] = {}, [KEYS[11]] = {}}, ARGV[1] .. '/'
local found = 0
if moved > 0 then
  for f, got in pairs(mine) do
    local in_f = redis.call('ZRANGEBYSCORE', f, string.format('%d', base + 1), string.format('%d', base + moved))
    for i = 1, #in_f do
      if string.sub(in_f[i], 1, #pre) == pre and in_f[i] ~= mark then
        got[#got + 1] = in_f[i]
        found = found + 1
      end
    end
  end
end
if found < moved then return -1 end
for f, got in pairs(mine) do
  for from = 1, #got, 1000 do
    redis.call('ZREM', f, unpack(got, from, math.min(#got, from + 999)))
  end
  redis.call('ZREM', f, mark)
end
backlog_set(KEYS[9], ARGV[1], buckets(units, tonumber(ARGV[5])), 0, 0)
for j = 0, chunks - 1 do redis.call('DEL', ARGV[4] .. j) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[10], ARGV[1])
if ARGV[2] ~= '' and redis.call('GET', KEYS[4]) == ARGV[2] then redis.call('DEL', KEYS[4]) end
if ARGV[3] == '1' then release(KEYS[5], KEYS[6], KEYS[7], {[ARGV[1]] = math.huge}) end
return 1
`)

// Outcomes of AbandonCommit.
const (
	// BatchNotWritten: the batch was never recorded.
	BatchNotWritten = 0
	// BatchAbandoned: the batch was recorded and is now removed.
	BatchAbandoned = 1
	// BatchKept: the batch's enqueue has begun; it stays and will run.
	BatchKept = -1
)

// StagedItem is one decoded item of a batch being uploaded.
type StagedItem struct {
	// CustomID is the caller's name for the item; "" when none.
	CustomID string
	// Kind is the item's puzzle kind.
	Kind puzzle.Kind
	// Request is the item's canonical request (puzzle.Parsed.Payload).
	Request []byte
	// Own is true for an item that runs in its own unit: an expensive
	// one (a search), or one whose request is large.
	Own bool
	// Timeout is what the item adds to its unit's asynq timeout.
	Timeout time.Duration
}

// StagingTTL is how long staged keys live until CommitBatch gives them
// the batch's TTL: longer than any upload may take (the API cuts a body
// off well before), short enough that an upload whose process died
// leaves nothing for long.
const StagingTTL = 15 * time.Minute

// ErrStagedGone is returned by CommitBatch when the staged items are gone
// or incomplete (the staging TTL passed, or a write was lost): nothing
// was committed, and the upload must be made again.
var ErrStagedGone = errors.New("store: staged batch items are gone")

// kindByte is the kind map's byte for kind k of a shared unit; own-unit
// items use its uppercase.
func kindByte(k puzzle.Kind) (byte, bool) {
	switch k {
	case puzzle.KindSliding:
		return 's', true
	case puzzle.KindSweep:
		return 'w', true
	case puzzle.KindFill:
		return 'f', true
	}
	return 0, false
}

// kindOf reads a kind map byte.
func kindOf(b byte) puzzle.Kind {
	switch b | 0x20 {
	case 's':
		return puzzle.KindSliding
	case 'w':
		return puzzle.KindSweep
	case 'f':
		return puzzle.KindFill
	}
	return ""
}

// BatchWriter stages a batch's items as they are decoded, a chunk at a
// time, so that an upload of a million items never holds more than a
// chunk (or a few, in flight to Redis) in memory. Nothing it writes is
// visible, or lasts, until CommitBatch. It is not safe for concurrent use.
type BatchWriter struct {
	s      *Store
	id     string
	stride int

	total int // items added
	units int // units staged or buffered
	owns  int // own units staged or buffered: the batch uses the solvers' lane
	// kindSet holds the kinds of the items added, for the batch record.
	kindSet map[puzzle.Kind]bool

	// The chunk being filled.
	lines    []byte   // request lines, '\n'-separated
	kinds    []byte   // kind map
	ids      []string // custom IDs, JSON strings
	anyID    bool
	own      []any // field, request pairs of own items
	members  []any // the chunk's units
	cheap    time.Duration
	anyCheap bool
	buffered int64

	// One chunk at most is in flight; its result arrives on inflight.
	inflight      chan error
	inflightBytes int64
	err           error
	closed        bool
}

// maxStride bounds a chunk's items: the scripts pass a chunk's fields to
// one command (Lua's unpack takes fewer than 8000 values: a chunk's
// entries are twice its items).
const maxStride = 2048

// NewBatchWriter starts staging batch id, stride items to a chunk. A
// stride outside [1, maxStride] is clamped into it (the batch records the
// stride it was written with).
func (s *Store) NewBatchWriter(id string, stride int) *BatchWriter {
	stride = max(1, min(stride, maxStride))
	return &BatchWriter{s: s, id: id, stride: stride}
}

// Add stages the next item. It writes to Redis when a chunk fills.
func (w *BatchWriter) Add(ctx context.Context, it StagedItem) error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return errors.New("store: batch writer: add after close")
	}
	kb, ok := kindByte(it.Kind)
	if !ok {
		return fmt.Errorf("store: batch writer: unknown kind %q", it.Kind)
	}
	if len(it.CustomID) > apitype.MaxCustomIDBytes {
		return fmt.Errorf("store: batch writer: custom_id of %d bytes", len(it.CustomID))
	}
	if !it.Own && (len(it.Request) == 0 || bytes.IndexByte(it.Request, '\n') >= 0 || string(it.Request) == "-") {
		// Canonical requests are compact JSON: no newline, never "-".
		return fmt.Errorf("store: batch writer: item %d: request is not one line of JSON", w.total)
	}
	if w.kindSet == nil {
		w.kindSet = map[puzzle.Kind]bool{}
	}
	w.kindSet[it.Kind] = true
	i := w.total
	k := len(w.kinds)
	if k > 0 {
		w.lines = append(w.lines, '\n')
	}
	if it.Own {
		w.lines = append(w.lines, '-')
		w.kinds = append(w.kinds, kb-'a'+'A')
		// A copy: the caller may reuse its buffer for the next item.
		w.own = append(w.own, "x"+strconv.Itoa(i), bytes.Clone(it.Request))
		w.members = append(w.members, tasks.UnitRef{BatchID: w.id, Unit: tasks.OwnUnit(i), Timeout: it.Timeout + unitMargin}.Member())
		w.units++
		w.owns++
	} else {
		w.lines = append(w.lines, it.Request...)
		w.kinds = append(w.kinds, kb)
		w.cheap += it.Timeout
		w.anyCheap = true
	}
	id, _ := json.Marshal(it.CustomID)
	w.ids = append(w.ids, string(id))
	if it.CustomID != "" {
		w.anyID = true
	}
	w.buffered += int64(len(it.Request) + len(id) + 2)
	w.total++
	if len(w.kinds) == w.stride {
		return w.flush(ctx)
	}
	return nil
}

// flush sends the chunk being filled to Redis, after the previous one has
// landed, and starts a new chunk.
func (w *BatchWriter) flush(ctx context.Context) error {
	if len(w.kinds) == 0 {
		return w.err
	}
	if err := w.wait(); err != nil {
		return err
	}
	j := (w.total - 1) / w.stride
	members := w.members
	if w.anyCheap {
		// The chunk's shared unit goes first: its items are the cheap
		// ones, which run faster than a chunk's own items.
		c := tasks.UnitRef{BatchID: w.id, Unit: tasks.ChunkUnit(j), Timeout: w.cheap + unitMargin}.Member()
		members = append([]any{c}, members...)
		w.units++
	}
	fields := make([]any, 0, 6+len(w.own))
	fields = append(fields, strconv.Itoa(j), w.lines, "m"+strconv.Itoa(j), w.kinds)
	if w.anyID {
		fields = append(fields, "i"+strconv.Itoa(j), strings.Join(w.ids, "\n"))
	}
	fields = append(fields, w.own...)
	req, units := w.s.k.batchReq(w.id), w.s.k.batchUnits(w.id)
	done := make(chan error, 1)
	w.inflight, w.inflightBytes = done, w.buffered
	go func() {
		_, err := w.s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, req, fields...)
			p.RPush(ctx, units, members...)
			p.Expire(ctx, req, StagingTTL)
			p.Expire(ctx, units, StagingTTL)
			return nil
		})
		if err != nil {
			err = fmt.Errorf("store: stage chunk %d of batch %s: %w", j, w.id, err)
		}
		done <- err
	}()
	w.lines, w.kinds, w.ids, w.own, w.members = nil, nil, nil, nil, nil
	w.anyID, w.anyCheap, w.cheap, w.buffered = false, false, 0, 0
	return nil
}

// wait waits for the chunk in flight and returns the writer's first error.
func (w *BatchWriter) wait() error {
	if w.inflight != nil {
		if err := <-w.inflight; err != nil && w.err == nil {
			w.err = err
		}
		w.inflight, w.inflightBytes = nil, 0
	}
	return w.err
}

// Kinds returns the kinds of the items added, sorted.
func (w *BatchWriter) Kinds() []string {
	out := make([]string, 0, len(w.kindSet))
	for k := range w.kindSet {
		out = append(out, string(k))
	}
	slices.Sort(out)
	return out
}

// Total is the number of items added so far.
func (w *BatchWriter) Total() int { return w.total }

// Buffered is how many bytes of items the writer holds that are not yet
// written, for the API's admission by bytes.
func (w *BatchWriter) Buffered() int64 { return w.buffered + w.inflightBytes }

// CustomIDAt returns the custom_id of an item already added, reading it
// back from Redis when its chunk was written; the API uses it to confirm
// a duplicate custom_id that its hashes suggest.
func (w *BatchWriter) CustomIDAt(ctx context.Context, index int) (string, error) {
	if index < 0 || index >= w.total {
		return "", fmt.Errorf("store: batch writer: no item %d of %d", index, w.total)
	}
	j, k := index/w.stride, index%w.stride
	var line string
	if first := w.total - len(w.kinds); index >= first {
		line = w.ids[index-first]
	} else {
		if err := w.wait(); err != nil {
			return "", err
		}
		v, err := w.s.rdb.HGet(ctx, w.s.k.batchReq(w.id), "i"+strconv.Itoa(j)).Result()
		if errors.Is(err, redis.Nil) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("store: read back custom_id: %w", err)
		}
		lines := strings.Split(v, "\n")
		if k >= len(lines) {
			return "", fmt.Errorf("store: read back custom_id: chunk %d has %d lines", j, len(lines))
		}
		line = lines[k]
	}
	var id string
	if err := json.Unmarshal([]byte(line), &id); err != nil {
		return "", fmt.Errorf("store: read back custom_id: %w", err)
	}
	return id, nil
}

// Close writes what is buffered. After it, CommitBatch makes the batch.
func (w *BatchWriter) Close(ctx context.Context) error {
	if w.closed {
		return w.err
	}
	w.closed = true
	if err := w.flush(ctx); err != nil {
		return err
	}
	return w.wait()
}

// Discard deletes what was staged, for an upload that failed. The staged
// keys also expire on their own, for a process that died.
func (w *BatchWriter) Discard(ctx context.Context) error {
	w.wait()
	w.closed = true
	if err := w.s.rdb.Del(ctx, w.s.k.batchReq(w.id), w.s.k.batchUnits(w.id)).Err(); err != nil {
		return fmt.Errorf("store: discard staged batch %s: %w", w.id, err)
	}
	return nil
}

// CommitBatch describes the batch record CommitBatch creates.
type CommitBatch struct {
	ID    string
	Owner string
	// Format is the judge format the batch was submitted in ("" for JSON),
	// so its output can be rendered in the same format.
	Format string
	// IdempotencyKey, when set, is the caller's Idempotency-Key, claimed
	// by ClaimIdempotency for this batch ID and BodyHash. The batch is
	// committed only while that claim is still this batch's, and the
	// claim then lives as long as the batch.
	IdempotencyKey, BodyHash string
	// Quota is the owner's quota of items that have not ended; 0:
	// unlimited.
	Quota int
}

// claimOf returns the idempotency key and claim value of cb; the batch
// key and "" when it has none.
func (s *Store) claimOf(cb CommitBatch) (string, string) {
	if cb.IdempotencyKey == "" {
		return s.k.batch(cb.ID), ""
	}
	return s.k.idempotency(cb.Owner, cb.IdempotencyKey), cb.ID + " " + cb.BodyHash
}

// commitKeys are the first seven keys of the commit and abandon scripts.
func (s *Store) commitKeys(cb CommitBatch) []string {
	bk := s.k.batch(cb.ID)
	idem, _ := s.claimOf(cb)
	keys := []string{bk, s.k.batchReq(cb.ID), s.k.batchUnits(cb.ID), idem}
	if cb.Owner != "" {
		return append(keys, s.k.owner(cb.Owner)...)
	}
	return append(keys, bk, bk, bk)
}

// CommitBatch makes the batch staged by w in one script: it checks the
// claim (ErrClaimLost), admits the items against the quota (ErrQuota),
// writes the batch record, gives the staged keys the batch's TTL and puts
// every unit in the feed. On any error nothing is committed, except when
// the reply was lost: see AbandonCommit. It closes w first.
func (s *Store) CommitBatch(ctx context.Context, w *BatchWriter, cb CommitBatch) error {
	if err := w.Close(ctx); err != nil {
		return err
	}
	_, claim := s.claimOf(cb)
	keys := append(s.commitKeys(cb), s.k.feed(), s.k.ownerVT(cb.Owner), s.laneVT(w.owns == 0), s.k.backlog(), s.k.ownerBatches(cb.Owner),
		s.k.cheapFeed(), s.k.gateWeights())
	chunks := (w.total + w.stride - 1) / w.stride
	// With acks on, the confirmation goes in the same round trip: the
	// staged chunks' writes came before it, so it covers them too.
	v, err := s.runConfirmed(ctx, commitBatchScript, keys,
		ms(s.now()), s.taskTTL.Milliseconds(), cb.ID, cb.Owner, cb.Format, claim, cb.Quota,
		w.total, w.stride, chunks, w.units, feedWindow, backlogUnits, strings.Join(w.Kinds(), ",")).Int()
	if err != nil {
		return fmt.Errorf("store: commit batch %s: %w", cb.ID, err)
	}
	switch v {
	case -1:
		return ErrQuota
	case -2:
		return ErrClaimLost
	case -3:
		return ErrStagedGone
	}
	return nil
}

// AbandonCommit undoes a CommitBatch whose outcome is unknown (its reply
// was lost), unless a unit of the batch has been fed: then it runs, and
// AbandonCommit answers BatchKept. It returns BatchNotWritten,
// BatchAbandoned or BatchKept. A batch that was not written has its
// staged keys deleted.
func (s *Store) AbandonCommit(ctx context.Context, w *BatchWriter, cb CommitBatch) (int, error) {
	if w != nil {
		w.wait() // a chunk landing after the script would outlive it
	}
	_, claim := s.claimOf(cb)
	owned := "0"
	if cb.Owner != "" {
		owned = "1"
	}
	keys := append(s.commitKeys(cb), s.k.feed(), s.k.backlog(), s.k.ownerBatches(cb.Owner), s.k.cheapFeed())
	v, err := abandonCommitScript.Run(ctx, s.rdb, keys, cb.ID, claim, owned, s.k.batchResBase(cb.ID), backlogUnits).Int()
	if err != nil {
		return 0, fmt.Errorf("store: abandon batch %s: %w", cb.ID, err)
	}
	return v, nil
}
