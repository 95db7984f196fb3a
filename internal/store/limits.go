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

// ErrQuota is returned when admitting tasks would pass an owner's quota.
var ErrQuota = errors.New("pending-task quota exceeded")

// ReservePending admits n more pending tasks for owner, or returns
// ErrQuota. The finish script gives them back as they end; Release gives
// them back when a submission fails before anything was queued.
func (s *Store) ReservePending(ctx context.Context, owner string, n, quota int) error {
	if owner == "" || n == 0 {
		return nil
	}
	v, err := s.evalScript(ctx, reserveScript, []string{s.k.ownerPending(owner)}, n, quota)
	if err != nil {
		return fmt.Errorf("store: reserve quota: %w", err)
	}
	if v < 0 {
		return ErrQuota
	}
	return nil
}

// ReleasePending returns n reserved slots.
func (s *Store) ReleasePending(ctx context.Context, owner string, n int) error {
	if owner == "" || n == 0 {
		return nil
	}
	return s.rdb.DecrBy(ctx, s.k.ownerPending(owner), int64(n)).Err()
}

// Pending returns how many of owner's tasks have not ended.
func (s *Store) Pending(ctx context.Context, owner string) (int, error) {
	n, err := s.rdb.Get(ctx, s.k.ownerPending(owner)).Int()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

func (s *Store) evalScript(ctx context.Context, sc *redis.Script, keys []string, args ...any) (int64, error) {
	return sc.Run(ctx, s.rdb, keys, args...).Int64()
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
	ok, err := s.rdb.SetNX(ctx, k, batchID+" "+bodyHash, claimLease).Result()
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

// ReleaseIdempotency drops a claim whose batch could not be created, so a
// retry with the same key can try again.
func (s *Store) ReleaseIdempotency(ctx context.Context, owner, key string) error {
	return s.rdb.Del(ctx, s.k.idempotency(owner, key)).Err()
}
