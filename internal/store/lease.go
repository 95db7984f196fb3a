package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

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
