package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
)

// cancelChunksPerTrip is how many chunk-cancel scripts CancelBatch sends
// in one pipeline.
const cancelChunksPerTrip = 64

// cancelArgs are the arguments of cancelItemsScript up to the offsets.
func (s *Store) cancelArgs(batchID string, j int, msg string) []any {
	e, _ := json.Marshal(apitype.TaskError{Code: apitype.CodeCanceled, Message: msg})
	args := append([]any{}, s.k.ownerAffixes()...)
	return append(args, ms(s.now()), s.k.events(), batchID, j, s.k.cancels(), `"error":`+string(e),
		chunkEventsOf(batchID), BatchEventKey(batchID), itemIDsOf(batchID))
}

// CancelItem cancels batch item index of b unless it has ended, and
// returns its state before ("" when it is gone). An item that was active
// is announced to the workers, which abort it.
func (s *Store) CancelItem(ctx context.Context, b *Batch, index int) (apitype.TaskState, error) {
	if b.Stride <= 0 || index < 0 || index >= b.Total {
		return "", nil
	}
	j, k := index/b.Stride, index%b.Stride
	args := append(s.cancelArgs(b.ID, j, "canceled by request"), k)
	v, err := cancelItemsScript.Run(ctx, s.rdb,
		[]string{s.k.batch(b.ID), s.k.batchReq(b.ID), s.k.batchRes(b.ID, j)}, args...).StringSlice()
	if err != nil {
		return "", fmt.Errorf("store: cancel item: %w", err)
	}
	if len(v) < 2 {
		return "", nil
	}
	return apitype.TaskState(v[1]), nil
}

// cancelItemsScript cancels the items of one chunk that have not ended:
// the listed offsets, or all of the chunk's items. Each gets a canceled
// entry, its count moves from active (its unit's marker is set) or
// pending, the quota is given back and the events published (see
// batchLua); an item that was active is announced on the cancels
// channel, so its worker aborts it.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
// KEYS[3] res hash of the chunk
//
// ARGV[1..4] owner key affixes
// ARGV[5] now, Unix milliseconds
// ARGV[6] events channel
// ARGV[7] batch ID
// ARGV[8] the chunk
// ARGV[9] cancels channel
// ARGV[10] the entry's error JSON member
// ARGV[11] the prefix of the batch's chunk events (chunkEventsOf)
// ARGV[12] the batch's event (BatchEventKey)
// ARGV[13] the prefix of the batch's item IDs (itemIDsOf), announced on
// the cancels channel with the item's index
// ARGV[14..] the offsets in the chunk to cancel (none: every item)
//
// Returns {canceled, state_1, state_2, ...}: how many it canceled and,
// for each listed offset, its state before ("" when the batch or item is
// gone).
var cancelItemsScript = redis.NewScript(quotaLua + batchLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'stride', 'total', 'expires_at')
if not b[3] then return {'0'} end
local owner, stride, total, exp = b[1] or '', tonumber(b[2]), tonumber(b[3]), tonumber(b[4])
local j = tonumber(ARGV[8])
local m = redis.call('HGET', KEYS[2], 'm' .. j) or ''
local offs = {}
if #ARGV > 13 then
  for a = 14, #ARGV do offs[#offs + 1] = tonumber(ARGV[a]) end
else
  for k = 0, #m - 1 do offs[#offs + 1] = k end
end
local out = {'0'}
if #offs == 0 then return out end
local ents = redis.call('HMGET', KEYS[3], unpack(offs))
local markers, delta, ended = {}, {}, 0
local hs, hd, seen = {}, {}, {}
for i = 1, #offs do
  local k = offs[i]
  local prior = ''
  if seen[k] then
    prior = 'canceled'
  elseif ents[i] then
    prior = string.match(ents[i], '^{"state":"(%a+)"') or ''
  elseif k >= 0 and k < #m and j * stride + k < total then
    seen[k] = true
    local kb = string.sub(m, k + 1, k + 1)
    local f = marker_field(kb, k)
    local mv = markers[f]
    if mv == nil then
      mv = redis.call('HGET', KEYS[3], f)
      markers[f] = mv
    end
    local attempts, started = 0, nil
    prior = 'pending'
    if mv then
      attempts, started = parse_marker(mv)
      prior = 'active'
      redis.call('PUBLISH', ARGV[9], ARGV[13] .. (j * stride + k))
    end
    hs[#hs + 1] = k
    hs[#hs + 1] = entry('canceled', started, attempts, ARGV[5], ARGV[10], '')
    hd[#hd + 1] = 'p' .. k
    delta[prior] = (delta[prior] or 0) - 1
    delta['canceled'] = (delta['canceled'] or 0) + 1
    ended = ended + 1
  end
  out[#out + 1] = prior
end
if ended > 0 then
  redis.call('HSET', KEYS[3], unpack(hs))
  redis.call('HDEL', KEYS[3], unpack(hd))
  redis.call('PEXPIREAT', KEYS[3], exp)
  settle(KEYS[1], ARGV[7], owner, {ARGV[1], ARGV[2], ARGV[3], ARGV[4]}, j, delta, ended, ARGV[6], ARGV[5], ARGV[11], ARGV[12])
end
out[1] = tostring(ended)
return out
`)

// markCanceledScript marks a batch canceled, so that the feed drops its
// units and no unit of it starts, before its chunks are canceled. A batch
// whose items have all ended is left as it is: nothing of it was
// canceled, and the answer says whether an earlier cancel had marked it,
// so that a retried cancel is told apart from one that came too late.
//
// Its members in the backlog go too: nothing of it waits any more.
//
// KEYS[1] batch hash
// KEYS[2] backlog
// ARGV[1] now, Unix milliseconds
// ARGV[2] batch ID
// ARGV[3] backlogUnits
//
// Returns the number of chunks to cancel: 0 when the batch is done and
// was canceled before, -2 when it is done and was never canceled, -1 when
// it does not exist.
var markCanceledScript = redis.NewScript(backlogLua + `
local b = redis.call('HMGET', KEYS[1], 'chunks', 'total', 'ended', 'units', 'fed')
if not b[1] then return -1 end
if tonumber(b[3]) >= tonumber(b[2]) then
  if redis.call('HEXISTS', KEYS[1], 'canceled_at') == 1 then return 0 end
  return -2
end
redis.call('HSETNX', KEYS[1], 'canceled_at', ARGV[1])
local per = tonumber(ARGV[3])
backlog_set(KEYS[2], ARGV[2], buckets((tonumber(b[4]) or 0) - (tonumber(b[5]) or 0), per), 0, 0)
return tonumber(b[1])
`)

// CancelBatch cancels every item of a batch that has not ended. It marks
// the batch canceled first (the feed then drops its units, and none of
// them starts), then cancels each chunk's unended items with one script
// call per chunk, cancelChunksPerTrip chunks to a round trip. It returns
// how many items it canceled. owner is unused: the scripts read the
// batch's owner from its record.
//
// It is safe to call again: a cancel cut off part way (a timeout, a lost
// answer, a dead API) is finished by the next, which counts only what it
// canceled itself, and a batch that a cancel ended answers 0. A batch that
// ended without ever being canceled is ErrBatchEnded; one that does not
// exist is ErrNotFound.
func (s *Store) CancelBatch(ctx context.Context, batchID, owner string) (int, error) {
	chunks, err := markCanceledScript.Run(ctx, s.rdb, []string{s.k.batch(batchID), s.k.backlog()}, ms(s.now()), batchID, backlogUnits).Int()
	if err != nil {
		return 0, fmt.Errorf("store: cancel batch: %w", err)
	}
	switch chunks {
	case -1:
		return 0, ErrNotFound
	case -2:
		return 0, ErrBatchEnded
	}
	n := 0
	for first := 0; first < chunks; first += cancelChunksPerTrip {
		last := min(chunks, first+cancelChunksPerTrip)
		cmds := make([]*redis.Cmd, 0, last-first)
		err := s.pipelineScripts(ctx, func(p redis.Pipeliner) {
			cmds = cmds[:0]
			for j := first; j < last; j++ {
				cmds = append(cmds, cancelItemsScript.EvalSha(ctx, p,
					[]string{s.k.batch(batchID), s.k.batchReq(batchID), s.k.batchRes(batchID, j)},
					s.cancelArgs(batchID, j, "batch canceled by request")...))
			}
		}, cancelItemsScript)
		if err != nil {
			return n, fmt.Errorf("store: cancel batch: %w", err)
		}
		for _, c := range cmds {
			v, err := c.StringSlice()
			if err != nil || len(v) == 0 {
				return n, fmt.Errorf("store: cancel batch chunk: %v", err)
			}
			k, _ := strconv.Atoi(v[0])
			n += k
		}
	}
	return n, nil
}
