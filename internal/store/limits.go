package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Allow takes one token from owner's bucket, kept in Redis so the limit
// holds across API replicas. It returns how long to wait when refused.
func (s *Store) Allow(ctx context.Context, owner string, perSecond, burst int) (bool, time.Duration, error) {
	res, err := redis_rate.NewLimiter(s.rdb).Allow(ctx, s.k.rateLimit(owner),
		redis_rate.Limit{Rate: perSecond, Burst: burst, Period: time.Second})
	if err != nil {
		return false, 0, fmt.Errorf("store: rate limit: %w", err)
	}
	return res.Allowed > 0, res.RetryAfter, nil
}

// AllowOperator takes one token from the bucket of who (an operator key's
// name, or a client address when auth is off) on the operator routes.
// Its buckets are apart from the API keys': dashboard polling never eats
// into a tenant's rate, nor a tenant's requests into the dashboard's.
func (s *Store) AllowOperator(ctx context.Context, who string, perSecond, burst int) (bool, time.Duration, error) {
	res, err := redis_rate.NewLimiter(s.rdb).Allow(ctx, s.k.operatorRate(who),
		redis_rate.Limit{Rate: perSecond, Burst: burst, Period: time.Second})
	if err != nil {
		return false, 0, fmt.Errorf("store: operator rate limit: %w", err)
	}
	return res.Allowed > 0, res.RetryAfter, nil
}

// AllowAuthFailure counts one failed authentication from addr against
// perMinute failures a minute (its burst as well), and reports whether
// it was still within them; when not, how long until one more is.
func (s *Store) AllowAuthFailure(ctx context.Context, addr string, perMinute int) (bool, time.Duration, error) {
	res, err := redis_rate.NewLimiter(s.rdb).Allow(ctx, s.k.authFailures(addr),
		redis_rate.Limit{Rate: perMinute, Burst: perMinute, Period: time.Minute})
	if err != nil {
		return false, 0, fmt.Errorf("store: auth failure limit: %w", err)
	}
	return res.Allowed > 0, res.RetryAfter, nil
}

// ErrQuota is returned when admitting tasks would pass an owner's quota.
var ErrQuota = errors.New("pending-task quota exceeded")

// An owner's quota counts its tasks that have not ended, exactly, whatever
// dies when: tasks are counted by the same script that records them (so a
// crash cannot count a task that was never recorded, or record one that
// was never counted), uncounted by the script that ends them (only on
// their first move to an end), and dropped when their records expire
// without ending. For the last, the count is kept per unit of work (a
// batch, or a single task) with the time its records expire, and every
// script that reads the count first prunes the units that have expired.
// Reading a counter that could drift and repairing it later would be
// cheaper to write but not exact; scanning records at admission would be
// exact but cost O(tasks) per request.

// quotaLua holds the Lua functions shared by every script that counts an
// owner's tasks; it is put in front of their source. p, o and e are the
// owner's pending counter, open-units hash and expiry set (see keys.go).
//
// clock() is Redis's own time in Unix milliseconds, the clock that
// expires the records, so a unit leaves the count exactly when its
// records do, whatever the API hosts' clocks say.
// prune(p, o, e, now) drops the units whose records expired by now.
// admit(p, o, e, unit, n, expire_at) counts n more tasks of unit.
// release(p, o, e, ends) uncounts ends[unit] tasks of each unit, never
// more than it still counts (a pruned unit counts none).
const quotaLua = `
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function prune(p, o, e, now)
  local gone = redis.call('ZRANGEBYSCORE', e, '-inf', now)
  if #gone == 0 then return end
  local drop = 0
  for i = 1, #gone do
    drop = drop + (tonumber(redis.call('HGET', o, gone[i])) or 0)
    redis.call('HDEL', o, gone[i])
    redis.call('ZREM', e, gone[i])
  end
  if redis.call('DECRBY', p, drop) < 0 then redis.call('SET', p, 0) end
end
local function admit(p, o, e, unit, n, expire_at)
  redis.call('INCRBY', p, n)
  redis.call('HINCRBY', o, unit, n)
  redis.call('ZADD', e, expire_at, unit)
  redis.call('PEXPIREAT', p, expire_at)
  redis.call('PEXPIREAT', o, expire_at)
  redis.call('PEXPIREAT', e, expire_at)
end
local function release(p, o, e, ends)
  local total = 0
  for unit, d in pairs(ends) do
    local have = tonumber(redis.call('HGET', o, unit))
    if have then
      if d >= have then
        d = have
        redis.call('HDEL', o, unit)
        redis.call('ZREM', e, unit)
      else
        redis.call('HINCRBY', o, unit, -d)
      end
      total = total + d
    end
  end
  if total > 0 and redis.call('DECRBY', p, total) < 0 then redis.call('SET', p, 0) end
end
`

// pendingScript reads an owner's exact count.
//
// KEYS[1..3] the owner's pending counter, open units and expiry set
//
// Returns the number of the owner's tasks that have not ended.
var pendingScript = redis.NewScript(quotaLua + `
prune(KEYS[1], KEYS[2], KEYS[3], clock())
return tonumber(redis.call('GET', KEYS[1]) or '0')
`)

// releaseScript uncounts a unit whose submission failed after it was
// recorded.
//
// KEYS[1..3] the owner's pending counter, open units and expiry set
// ARGV[1] the unit: a batch ID or a single task's ID
var releaseScript = redis.NewScript(quotaLua + `
release(KEYS[1], KEYS[2], KEYS[3], {[ARGV[1]] = math.huge})
return 0
`)

// ReleasePending uncounts unit (a single task's ID or a batch ID) from
// owner's quota, for a submission that is being undone.
func (s *Store) ReleasePending(ctx context.Context, owner, unit string) error {
	if owner == "" {
		return nil
	}
	if err := releaseScript.Run(ctx, s.rdb, s.k.owner(owner), unit).Err(); err != nil {
		return fmt.Errorf("store: release quota: %w", err)
	}
	return nil
}

// Pending returns how many of owner's tasks have not ended.
func (s *Store) Pending(ctx context.Context, owner string) (int, error) {
	n, err := pendingScript.Run(ctx, s.rdb, s.k.owner(owner)).Int()
	if err != nil {
		return 0, fmt.Errorf("store: pending count: %w", err)
	}
	return n, nil
}

// ClaimIdempotency claims owner's Idempotency-Key for a new batch. It
// returns claimed=true when this call owns the key; otherwise it returns
// the batch ID and body hash recorded by the first request, whose batch
// may still be being written. The claim comes before the batch is
// written, so two concurrent retries can never both create a batch. It
// lasts claimLease until CreateBatch writes the batch under it and makes
// it last as long as the batch, so a request that died in between blocks
// its retries for a minute at most.
func (s *Store) ClaimIdempotency(ctx context.Context, owner, key, batchID, bodyHash string) (claimed bool, prevBatch, prevHash string, err error) {
	k := s.k.idempotency(owner, key)
	ok, err := s.rdb.SetNX(ctx, k, claimValue(batchID, bodyHash), claimLease).Result()
	if err != nil {
		return false, "", "", fmt.Errorf("store: claim idempotency key: %w", err)
	}
	if ok {
		return true, "", "", nil
	}
	v, err := s.rdb.Get(ctx, k).Result()
	if errors.Is(err, redis.Nil) { // expired between the two calls: claim again
		return s.ClaimIdempotency(ctx, owner, key, batchID, bodyHash)
	}
	if err != nil {
		return false, "", "", fmt.Errorf("store: read idempotency key: %w", err)
	}
	prevBatch, prevHash, _ = strings.Cut(v, " ")
	return false, prevBatch, prevHash, nil
}

// releaseClaimScript deletes an Idempotency-Key claim (or a batch retry's
// lock, RetryBatch) only while it is still the caller's: a request that
// outlived its claim (claimLease) must not drop the claim a retry has
// taken since, or a third request could create a second batch for the
// same key.
//
// KEYS[1] idempotency key (or keys.batchRetry)
// ARGV[1] the claim's value the caller set: batch ID, a space, body hash
// (or the retry's token)
//
// Returns 1 when the claim was deleted, 0 when it was not the caller's
// (or gone).
var releaseClaimScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// claimValue is the value of batchID's claim on an Idempotency-Key: what
// ClaimIdempotency stores, and what CreateBatch, AbandonBatch and
// ReleaseIdempotency compare the key with before they touch it.
func claimValue(batchID, bodyHash string) string { return batchID + " " + bodyHash }

// ReleaseIdempotency drops the claim that ClaimIdempotency made for
// batchID and bodyHash when its batch could not be created, so a retry
// with the same key can try again. A claim that is no longer this one's
// (it expired and another request took the key) is left alone.
func (s *Store) ReleaseIdempotency(ctx context.Context, owner, key, batchID, bodyHash string) error {
	if err := releaseClaimScript.Run(ctx, s.rdb, []string{s.k.idempotency(owner, key)}, claimValue(batchID, bodyHash)).Err(); err != nil {
		return fmt.Errorf("store: release idempotency key: %w", err)
	}
	return nil
}
