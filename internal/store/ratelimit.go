package store

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
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
