package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/tasks"
)

// A batch is accepted in one step: createBatchScript writes its record,
// its items' records, its outbox (the tasks that will run it) and its
// idempotency key together, or nothing. The API then enqueues the outbox's
// units and acknowledges each as it lands (AckOutbox); if the API dies
// before it is done, any replica's reconciler finds the batch in the
// outbox index and enqueues the rest. Units carry fixed asynq task IDs,
// so enqueueing one twice makes one task.

// ErrClaimLost is returned by CreateBatch when the Idempotency-Key claim
// the batch was to be written under has expired or been taken by another
// request: the batch was not written.
var ErrClaimLost = errors.New("idempotency claim lost")

// claimLease is how long an Idempotency-Key claim lasts until its batch is
// written. It outlives any request (REQUEST_TIMEOUT, default 10s), and it
// is short so that a claim whose request died (kill -9 before the batch
// was written) stops blocking the client's retries within a minute, not a
// day. CreateBatch checks the claim and makes it last as long as the
// batch in the same script, so a request that outlives its claim writes
// nothing.
const claimLease = time.Minute

// createBatchScript records a batch and its outbox in one step, counting
// its pending items against its owner's quota (see quotaLua; the batch is
// one unit).
//
// KEYS[1] batch hash
// KEYS[2] batch item list
// KEYS[3] batch outbox hash
// KEYS[4] outbox index
// KEYS[5] idempotency key (KEYS[1] again when none)
// KEYS[6..8] the owner's pending counter, open units and expiry set
//
//	(KEYS[1] thrice when there is no owner)
//
// KEYS[8+i] task i's hash, i = 1..n
//
// ARGV[1] now, Unix milliseconds
// ARGV[2] record TTL, seconds
// ARGV[3] batch ID
// ARGV[4] owner ("" when auth is off)
// ARGV[5] format ("" for JSON)
// ARGV[6] the idempotency claim's value to check and keep ("" when none)
// ARGV[7] the owner's quota of pending tasks (0: unlimited)
// ARGV[8] u, the number of units
// ARGV[8+j] unit j, tasks.Unit.MarshalBinary, j = 1..u (outbox field j-1)
// then 4 values per task i, from ARGV[9+u+4(i-1)]: ID, kind, cache key
// ("" when none), cached result ("" on a miss)
//
// Returns 1 when written, -1 when the quota would be passed and -2 when
// the claim is no longer ARGV[6] (for both, nothing is written).
var createBatchScript = redis.NewScript(quotaLua + `
local now, ttl, batch, owner = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local claim, quota, u = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
if claim ~= '' and redis.call('GET', KEYS[5]) ~= claim then return -2 end
local n = #KEYS - 8
local first = 9 + u
local cached = 0
for i = 1, n do
  if ARGV[first + 4 * (i - 1) + 3] ~= '' then cached = cached + 1 end
end
if owner ~= '' and n > cached then
  local t = clock()
  prune(KEYS[6], KEYS[7], KEYS[8], t)
  if quota > 0 and tonumber(redis.call('GET', KEYS[6]) or '0') + n - cached > quota then return -1 end
  admit(KEYS[6], KEYS[7], KEYS[8], batch, n - cached, t + ttl * 1000)
end
local ids = {}
for i = 1, n do
  local a = first + 4 * (i - 1)
  -- One HSET with literal arguments per item: building a table and
  -- unpacking it costs Redis more than the HSET itself. "owner" and "key"
  -- may be empty, which readers treat as absent.
  if ARGV[a + 3] == '' then
    redis.call('HSET', KEYS[8 + i], 'kind', ARGV[a + 1], 'state', 'pending', 'created_at', now, 'attempts', 0,
      'batch', batch, 'owner', owner, 'key', ARGV[a + 2])
  else
    redis.call('HSET', KEYS[8 + i], 'kind', ARGV[a + 1], 'state', 'completed', 'created_at', now, 'attempts', 0,
      'batch', batch, 'owner', owner, 'key', ARGV[a + 2],
      'result', ARGV[a + 3], 'cached', '1', 'completed_at', now)
  end
  redis.call('EXPIRE', KEYS[8 + i], ttl)
  ids[#ids + 1] = ARGV[a]
  if #ids == 1000 or i == n then
    redis.call('RPUSH', KEYS[2], unpack(ids))
    ids = {}
  end
end
redis.call('EXPIRE', KEYS[2], ttl)
local bf = {'total', n, 'created_at', now, 'pending', n - cached, 'active', 0,
  'completed', cached, 'failed', 0, 'canceled', 0, 'ended', cached}
if owner ~= '' then bf[#bf + 1] = 'owner'; bf[#bf + 1] = owner end
if ARGV[5] ~= '' then bf[#bf + 1] = 'format'; bf[#bf + 1] = ARGV[5] end
if cached == n then bf[#bf + 1] = 'done_at'; bf[#bf + 1] = now end
redis.call('HSET', KEYS[1], unpack(bf))
redis.call('EXPIRE', KEYS[1], ttl)
if u > 0 then
  local f = {}
  for j = 1, u do
    f[#f + 1] = j - 1; f[#f + 1] = ARGV[8 + j]
    if #f == 1000 or j == u then
      redis.call('HSET', KEYS[3], unpack(f))
      f = {}
    end
  end
  redis.call('EXPIRE', KEYS[3], ttl)
  redis.call('ZADD', KEYS[4], now, batch)
end
if claim ~= '' then redis.call('SET', KEYS[5], claim, 'EX', ttl) end
return 1
`)

// ackOutboxScript removes enqueued units from a batch's outbox, and the
// batch from the outbox index once nothing is left.
//
// KEYS[1] batch outbox hash
// KEYS[2] outbox index
// ARGV[1] batch ID
// ARGV[2..] the units' fields
//
// Returns how many units remain.
var ackOutboxScript = redis.NewScript(`
if #ARGV > 1 then redis.call('HDEL', KEYS[1], unpack(ARGV, 2)) end
local left = redis.call('HLEN', KEYS[1])
if left == 0 then redis.call('ZREM', KEYS[2], ARGV[1]) end
return left
`)

// leaseScript takes or renews a lease.
//
// KEYS[1] lease key
// ARGV[1] holder
// ARGV[2] lease length, milliseconds
//
// Returns 1 when ARGV[1] holds the lease until now + ARGV[2], 0 when
// another holder has it.
var leaseScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if cur then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`)

// CreateBatch writes a batch, all its items' records and its outbox
// (nb.Units) in one script, so a batch is either wholly recorded, with
// what it takes to run it, or not at all. Its items that are not answered
// from the cache count against the owner's quota, nb.Quota (0:
// unlimited), in the same script: ErrQuota, and nothing written, when they
// would pass it. With nb.IdempotencyKey set it writes only while the key's
// claim is this batch's (ErrClaimLost otherwise), and keeps the claim as
// long as the batch.
func (s *Store) CreateBatch(ctx context.Context, nb NewBatch, items []NewTask) error {
	batchID, owner := nb.ID, nb.Owner
	bk := s.k.batch(batchID)
	idem, claim := bk, ""
	if nb.IdempotencyKey != "" {
		idem, claim = s.k.idempotency(owner, nb.IdempotencyKey), batchID+" "+nb.BodyHash
	}
	keys := make([]string, 0, 8+len(items))
	keys = append(keys, bk, s.k.batchItems(batchID), s.k.outbox(batchID), s.k.outboxIndex(), idem)
	if owner != "" {
		keys = append(keys, s.k.owner(owner)...)
	} else {
		keys = append(keys, bk, bk, bk)
	}
	args := make([]any, 0, 8+len(nb.Units)+4*len(items))
	args = append(args, ms(s.now()), int64(s.taskTTL/time.Second), batchID, owner, nb.Format, claim, nb.Quota, len(nb.Units))
	for _, u := range nb.Units {
		b, err := u.MarshalBinary()
		if err != nil {
			return fmt.Errorf("store: create batch %s: encode unit: %w", batchID, err)
		}
		args = append(args, b)
	}
	for _, t := range items {
		keys = append(keys, s.k.task(t.ID))
		args = append(args, t.ID, t.Kind, t.CacheKey, string(t.Result))
	}
	v, err := createBatchScript.Run(ctx, s.rdb, keys, args...).Int64()
	if err != nil {
		return fmt.Errorf("store: create batch %s: %w", batchID, err)
	}
	switch v {
	case -1:
		return ErrQuota
	case -2:
		return ErrClaimLost
	}
	return nil
}

// OutboxBatches returns up to limit batches that still have units to
// enqueue and were created before before, oldest first.
func (s *Store) OutboxBatches(ctx context.Context, before time.Time, limit int) ([]string, error) {
	ids, err := s.rdb.ZRangeByScore(ctx, s.k.outboxIndex(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(ms(before), 10), Count: int64(limit)}).Result()
	if err != nil {
		return nil, fmt.Errorf("store: outbox batches: %w", err)
	}
	return ids, nil
}

// OutboxUnits returns the units of a batch that are not yet known to be
// enqueued, with their positions in the batch (for AckOutbox). A unit that
// cannot be decoded is reported in bad, so the caller can drop it rather
// than retry it forever.
func (s *Store) OutboxUnits(ctx context.Context, batchID string) (idx []int, units []tasks.Unit, bad []int, err error) {
	m, err := s.rdb.HGetAll(ctx, s.k.outbox(batchID)).Result()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("store: outbox of %s: %w", batchID, err)
	}
	for f, v := range m {
		i, err := strconv.Atoi(f)
		var u tasks.Unit
		if err == nil {
			err = u.UnmarshalBinary([]byte(v))
		}
		if err != nil {
			bad = append(bad, i)
			continue
		}
		idx, units = append(idx, i), append(units, u)
	}
	return idx, units, bad, nil
}

// AckOutbox removes the units at idx, which are on the queue, from a
// batch's outbox, and the batch from the outbox index when none are left.
// It returns how many units remain.
func (s *Store) AckOutbox(ctx context.Context, batchID string, idx []int) (int, error) {
	args := make([]any, 0, 1+len(idx))
	args = append(args, batchID)
	for _, i := range idx {
		args = append(args, i)
	}
	left, err := ackOutboxScript.Run(ctx, s.rdb, []string{s.k.outbox(batchID), s.k.outboxIndex()}, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("store: ack outbox of %s: %w", batchID, err)
	}
	return left, nil
}

// AcquireLease takes or renews the named lease for holder for ttl. It
// reports whether holder has it; another holder keeps it until it expires
// or is renewed.
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	v, err := leaseScript.Run(ctx, s.rdb, []string{s.k.lease(name)}, holder, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("store: lease %s: %w", name, err)
	}
	return v == 1, nil
}

// abandonBatchScript undoes a batch whose creation the API reported as
// failed (the reply was lost, so it may or may not have been written),
// unless its enqueue has begun.
//
// KEYS[1] batch hash
// KEYS[2] batch item list
// KEYS[3] batch outbox hash
// KEYS[4] outbox index
// KEYS[5] idempotency key (KEYS[1] again when none)
// KEYS[6..8] the owner's pending counter, open units and expiry set
//
//	(KEYS[1] thrice when there is no owner)
//
// KEYS[8+i] task i's hash
//
// ARGV[1] batch ID
// ARGV[2] the number of units the batch was written with
// ARGV[3] the idempotency claim's value ("" when none)
// ARGV[4] "1" when the batch has an owner whose quota counts it
//
// Returns 0 when the batch was never written, 1 when it was and is now
// gone (with its claim and its count in the quota), and -1 when some of
// its units have left the outbox: it is being enqueued and will run, so
// it is kept.
var abandonBatchScript = redis.NewScript(quotaLua + `
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HLEN', KEYS[3]) < tonumber(ARGV[2]) then return -1 end
for i = 9, #KEYS do redis.call('DEL', KEYS[i]) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
if ARGV[3] ~= '' and redis.call('GET', KEYS[5]) == ARGV[3] then redis.call('DEL', KEYS[5]) end
if ARGV[4] == '1' then release(KEYS[6], KEYS[7], KEYS[8], {[ARGV[1]] = math.huge}) end
return 1
`)

// Outcomes of AbandonBatch.
const (
	// BatchNotWritten: the batch was never recorded.
	BatchNotWritten = 0
	// BatchAbandoned: the batch was recorded and is now removed.
	BatchAbandoned = 1
	// BatchKept: the batch's enqueue has begun; it stays and will run.
	BatchKept = -1
)

// AbandonBatch undoes CreateBatch(nb, items) after it reported an error
// whose outcome is unknown (a lost reply), so a failed request leaves
// nothing behind: the records, the outbox, the quota count and the
// idempotency claim go,
// unless a unit has already been enqueued (BatchKept). It returns one of
// BatchNotWritten, BatchAbandoned and BatchKept.
func (s *Store) AbandonBatch(ctx context.Context, nb NewBatch, items []NewTask) (int, error) {
	bk := s.k.batch(nb.ID)
	idem, claim := bk, ""
	if nb.IdempotencyKey != "" {
		idem, claim = s.k.idempotency(nb.Owner, nb.IdempotencyKey), nb.ID+" "+nb.BodyHash
	}
	keys := make([]string, 0, 8+len(items))
	keys = append(keys, bk, s.k.batchItems(nb.ID), s.k.outbox(nb.ID), s.k.outboxIndex(), idem)
	owned := "0"
	if nb.Owner != "" {
		keys, owned = append(keys, s.k.owner(nb.Owner)...), "1"
	} else {
		keys = append(keys, bk, bk, bk)
	}
	for _, t := range items {
		keys = append(keys, s.k.task(t.ID))
	}
	v, err := abandonBatchScript.Run(ctx, s.rdb, keys, nb.ID, len(nb.Units), claim, owned).Int()
	if err != nil {
		return 0, fmt.Errorf("store: abandon batch %s: %w", nb.ID, err)
	}
	return v, nil
}
