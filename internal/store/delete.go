package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotEnded is the refusal to delete a batch some of whose items have
// not ended, or a single task that has not: it is canceled first, or
// waited for.
var ErrNotEnded = errors.New("store: not ended")

// deleteBatchScript deletes an ended batch's record: its hash (which
// every script of the batch reads first, and finds gone as it would an
// expired batch), its requests, its units and its entry in its owner's
// batch index. Its results' chunks are left to DeleteBatch, which
// unlinks them after: they are read only through the hash. A tombstone
// with the owner stays until the batch would have expired.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
// KEYS[3] batch units (keys.batchUnits)
// KEYS[4] the lock of a running retry of the batch (keys.batchRetry)
// KEYS[5] the owner's batch index (keys.ownerBatches)
// KEYS[6] the batch's tombstone (keys.batchDeleted)
// ARGV[1] the owner
// ARGV[2] the batch ID
// ARGV[3] how long a tombstone lives when the batch has no expiry (ms)
//
// The tombstone holds "<owner> <chunks>", so that a repeat (the first
// call's answer lost, its unlinks never sent) unlinks the chunks too.
//
// Returns how many result chunks the batch has, for the caller to
// unlink (its tombstone's count when owner deleted it before), or -1
// when there is none of owner's, -2 when items of it have not ended, -3
// when a retry of it runs.
var deleteBatchScript = redis.NewScript(`
local b = redis.call('HMGET', KEYS[1], 'owner', 'total', 'ended', 'expires_at', 'stride')
if not b[2] then
  local owner, n = string.match(redis.call('GET', KEYS[6]) or '', '^(.*) (%d+)$')
  if owner == ARGV[1] then return tonumber(n) end
  return -1
end
if (b[1] or '') ~= ARGV[1] then return -1 end
local total = tonumber(b[2])
if tonumber(b[3] or 0) < total then return -2 end
if redis.call('EXISTS', KEYS[4]) == 1 then return -3 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[5], ARGV[2])
local stride, chunks = tonumber(b[5]) or 0, 0
if stride > 0 then chunks = math.floor((total + stride - 1) / stride) end
local tomb, exp = ARGV[1] .. ' ' .. chunks, tonumber(b[4])
if exp then
  redis.call('SET', KEYS[6], tomb, 'PXAT', exp)
else
  redis.call('SET', KEYS[6], tomb, 'PX', ARGV[3])
end
return chunks
`)

// deletedTombstoneTTL is how long the tombstone of a batch without an
// expiry lives (a batch of a layout that kept none).
const deletedTombstoneTTL = 24 * time.Hour

// deleteChunksPerTrip is how many result chunks DeleteBatch unlinks in
// one round trip: a million-item batch's 2,000 chunks in two.
const deleteChunksPerTrip = 1000

// DeleteBatch deletes owner's batch id, whose items have all ended, and
// its results: the record in one script (deleteBatchScript), then the
// results' chunks, deleteChunksPerTrip to a round trip, each by a key of
// its own (UNLINK, freed off Redis's main thread). From the script on,
// the batch reads as not found. Chunks that a failure leaves behind are
// read by nothing and expire with the batch's other keys (RESULT_TTL),
// so a DeleteBatch cut short is complete for its caller; a repeat by
// owner finds the tombstone, unlinks the chunks again (any a cut-short
// call left go then) and answers nil.
//
// It refuses a batch with items that have not ended (ErrNotEnded) and one
// a retry is re-opening (ErrRetryRunning); one there is none of owner's
// is ErrNotFound.
func (s *Store) DeleteBatch(ctx context.Context, id, owner string) error {
	keys := []string{s.k.batch(id), s.k.batchReq(id), s.k.batchUnits(id), s.k.batchRetry(id), s.k.ownerBatches(owner), s.k.batchDeleted(id)}
	chunks, err := s.runConfirmed(ctx, deleteBatchScript, keys, owner, id, deletedTombstoneTTL.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("store: delete batch %s: %w", id, err)
	}
	switch chunks {
	case -1:
		return ErrNotFound
	case -2:
		return ErrNotEnded
	case -3:
		return ErrRetryRunning
	}
	for from := 0; from < chunks; from += deleteChunksPerTrip {
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j := from; j < min(from+deleteChunksPerTrip, chunks); j++ {
				p.Unlink(ctx, s.k.batchRes(id, j))
			}
			return nil
		})
		if err != nil {
			// The record is gone: what is left is read by nothing and
			// expires. Report it, but as the delete it is.
			return fmt.Errorf("%w: store: unlink the results of deleted batch %s from chunk %d: %w", ErrChunksLeft, id, from, err)
		}
	}
	return nil
}

// deleteTaskScript deletes an ended single task's record and its entry in
// its owner's task index, and leaves a tombstone (the owner) as long as
// the record would have lived. The result cache it may have filled is
// not the task's: it is shared by every request for the same puzzle.
//
// KEYS[1] task hash
// KEYS[2] the owner's task index (keys.ownerTasks)
// KEYS[3] the task's tombstone (keys.taskDeleted)
// ARGV[1] the owner
// ARGV[2] the task ID
// ARGV[3] how long a tombstone lives when the record has no TTL (ms)
//
// Returns 1 when it deleted the task, 0 when owner deleted it before, -1
// when there is none of owner's, -2 when it has not ended.
var deleteTaskScript = redis.NewScript(`
local t = redis.call('HMGET', KEYS[1], 'owner', 'state')
if not t[2] then
  if redis.call('GET', KEYS[3]) == ARGV[1] then return 0 end
  return -1
end
if (t[1] or '') ~= ARGV[1] then return -1 end
if t[2] ~= 'completed' and t[2] ~= 'failed' and t[2] ~= 'canceled' then return -2 end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then ttl = ARGV[3] end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('SET', KEYS[3], ARGV[1], 'PX', ttl)
return 1
`)

// DeleteTask deletes owner's single task id, which has ended, in one
// script (deleteTaskScript): from then on it reads as not found, and a
// repeat by owner answers nil as the first did. A task that has not ended
// is ErrNotEnded; one there is none of owner's, ErrNotFound.
func (s *Store) DeleteTask(ctx context.Context, id, owner string) error {
	keys := []string{s.k.task(id), s.k.ownerTasks(owner), s.k.taskDeleted(id)}
	n, err := s.runConfirmed(ctx, deleteTaskScript, keys, owner, id, deletedTombstoneTTL.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("store: delete task %s: %w", id, err)
	}
	switch n {
	case -1:
		return ErrNotFound
	case -2:
		return ErrNotEnded
	}
	return nil
}

// ErrChunksLeft wraps DeleteBatch's error when the batch is deleted but
// some of its results' chunks are not yet (they expire with RESULT_TTL).
var ErrChunksLeft = errors.New("store: batch deleted, some result chunks left to expire")
