package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrClaimLost is returned by CommitBatch when the Idempotency-Key claim
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
// with the same key can try again. A claim that another request holds
// (this one expired and that request took the key) is left alone.
func (s *Store) ReleaseIdempotency(ctx context.Context, owner, key, batchID, bodyHash string) error {
	if err := releaseClaimScript.Run(ctx, s.rdb, []string{s.k.idempotency(owner, key)}, claimValue(batchID, bodyHash)).Err(); err != nil {
		return fmt.Errorf("store: release idempotency key: %w", err)
	}
	return nil
}
