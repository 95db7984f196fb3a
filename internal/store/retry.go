package store

// Retrying a done batch's failed and canceled items
// (POST /v1/batches/{id}/retry). Each item keeps its index, so its ID and
// custom_id; its ended entry is deleted and its unit is fed again, so it
// runs as if it had never run. One script per chunk moves the counts, the
// quota and the feed together with the entries it deletes, so they stay
// exact however the retry is cut short; a retry cut short is finished by
// the next one.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/lease"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// beginRetryScript checks that a batch can be retried and readies it: the
// owner's quota must have room for its failed and canceled items. A
// canceled batch is canceled no more (so that the feed and the workers
// take its units again), and its feed accounting starts afresh: every
// unit it had counts as fed, and its backlog members go (the cancel took
// most of them already), since the retried units are counted as they are
// added.
//
// KEYS[1] batch hash
// KEYS[2] backlog
// KEYS[3..5] the owner's pending counter, open units and expiry set
//
//	(KEYS[1] thrice when there is no owner)
//
// ARGV[1] batch ID
// ARGV[2] the owner's quota (0: unlimited)
// ARGV[3] backlogUnits
// ARGV[4] the most items the retry re-opens, which the quota must have
// room for (0: every failed and canceled one)
//
// Returns how many items are failed or canceled, -1 when the quota has no
// room for those the retry re-opens and -3 when the batch does not exist.
var beginRetryScript = redis.NewScript(quotaLua + backlogLua + `
local b = redis.call('HMGET', KEYS[1], 'total', 'canceled_at', 'failed', 'canceled', 'units', 'fed', 'owner')
if not b[1] then return -3 end
local n = (tonumber(b[3]) or 0) + (tonumber(b[4]) or 0)
if n == 0 then return 0 end
local q, most = tonumber(ARGV[2]), tonumber(ARGV[4])
local need = n
if most > 0 and most < n then need = most end
if b[7] and b[7] ~= '' and q > 0 then
  prune(KEYS[3], KEYS[4], KEYS[5], clock())
  if tonumber(redis.call('GET', KEYS[3]) or '0') + need > q then return -1 end
end
if b[2] then
  local units, fed = tonumber(b[5]) or 0, tonumber(b[6]) or 0
  backlog_set(KEYS[2], ARGV[1], buckets(units - fed, tonumber(ARGV[3])), 0, 0)
  redis.call('HSET', KEYS[1], 'fed', units)
  redis.call('HDEL', KEYS[1], 'canceled_at')
end
return n
`)

// retryChunkScript re-opens the listed items of one chunk that are failed
// or canceled: it deletes their entries (and their units' active markers
// and progress, so that the next start counts them active again), moves
// their counts to pending, clears done_at, counts them in the owner's
// quota again (the batch's unit) and adds their units to the feed with
// fair scores (docs/batches.md, Fairness), counted in the backlog.
//
// A cheap item is re-opened only while every cheap item of its chunk has
// ended: the chunk's unit is then idle (a unit ends nothing that has an
// entry), so its marker can go and the unit can be fed again; while the
// unit still has items to run, its marker counts them active and its task
// ID is taken, so the item waits for a later retry. An own item's unit
// holds that item alone, which has ended.
//
// KEYS[1] batch hash
// KEYS[2] res hash of the chunk
// KEYS[3] feed
// KEYS[4] the owner's virtual time
// KEYS[5] the virtual time the units start from: feed:vt, or the cheap
// lane's when the chunk's unit alone is fed
// KEYS[6] backlog
// KEYS[7] batch req hash
// KEYS[8] the cheap lane's feed, which takes the chunk's unit (the own
// units go to KEYS[3])
//
// ARGV[1..4] owner key affixes
// ARGV[5] batch ID
// ARGV[6] the chunk's unit's feed member (used when a cheap item is
// retried)
// ARGV[7] backlogUnits
// ARGV[8] the chunk
// then pairs from ARGV[9]: an item's offset in the chunk, and its own
// unit's feed member ("" for a cheap item)
//
// Returns how many items it re-opened.
var retryChunkScript = redis.NewScript(quotaLua + backlogLua + laneLua + `
-- keep(k, at) makes k live until at at least, never shorter: a newer
-- unit of the owner may expire later than this batch.
local function keep(k, at)
  if redis.call('PTTL', k) < 0 then redis.call('PEXPIREAT', k, at) else redis.call('PEXPIREAT', k, at, 'GT') end
end
local b = redis.call('HMGET', KEYS[1], 'owner', 'expires_at', 'total', 'units', 'fed', 'stride')
if not b[3] then return 0 end
local owner, exp = b[1] or '', tonumber(b[2])
local members, delta, r, cheap = {}, {failed = 0, canceled = 0}, 0, false
local del = {}
local idle = nil -- is the chunk's unit idle? asked at its first cheap item
for a = 9, #ARGV, 2 do
  local k, own = ARGV[a], ARGV[a + 1]
  local e = redis.call('HGET', KEYS[2], k)
  local st = e and string.match(e, '^{"state":"(%a+)"')
  if (st == 'failed' or st == 'canceled') and own == '' and idle == nil then
    local m = redis.call('HGET', KEYS[7], 'm' .. ARGV[8]) or ''
    idle = true
    local offs = {}
    for i = 1, #m do
      local kb = string.sub(m, i, i)
      if not (kb >= 'A' and kb <= 'Z') then offs[#offs + 1] = i - 1 end
    end
    for from = 1, #offs, 1000 do
      local got = redis.call('HMGET', KEYS[2], unpack(offs, from, math.min(#offs, from + 999)))
      for i = 1, #got do
        if not got[i] then idle = false end
      end
    end
  end
  if (st == 'failed' or st == 'canceled') and (own ~= '' or idle) then
    delta[st] = delta[st] - 1
    r = r + 1
    del[#del + 1] = k
    del[#del + 1] = 'p' .. k
    if own ~= '' then
      del[#del + 1] = 'a' .. k
      members[#members + 1] = own
    else
      cheap = true
    end
  end
end
if r == 0 then return 0 end
if cheap then
  del[#del + 1] = 'a'
  table.insert(members, 1, ARGV[6])
end
redis.call('HDEL', KEYS[2], unpack(del))
for st, d in pairs(delta) do
  if d ~= 0 then redis.call('HINCRBY', KEYS[1], st, d) end
end
redis.call('HINCRBY', KEYS[1], 'pending', r)
redis.call('HINCRBY', KEYS[1], 'ended', -r)
redis.call('HDEL', KEYS[1], 'done_at', 'canceled_at')
if owner ~= '' then
  local o = ARGV[1] .. owner
  local p, oo, e = o .. ARGV[2], o .. ARGV[3], o .. ARGV[4]
  redis.call('INCRBY', p, r)
  redis.call('HINCRBY', oo, ARGV[5], r)
  redis.call('ZADD', e, exp, ARGV[5])
  keep(p, exp); keep(oo, exp); keep(e, exp)
end
local base = math.floor(math.max(tonumber(redis.call('GET', KEYS[4]) or '0'), tonumber(redis.call('GET', KEYS[5]) or '0')))
local z, c = {}, {}
for i = 1, #members do
  local t = z
  if lane(members[i]) then t = c end
  t[#t + 1] = string.format('%d', base + i)
  t[#t + 1] = members[i]
end
if #z > 0 then redis.call('ZADD', KEYS[3], unpack(z)) end
if #c > 0 then redis.call('ZADD', KEYS[8], unpack(c)) end
redis.call('SET', KEYS[4], string.format('%d', base + #members), 'KEEPTTL')
keep(KEYS[4], exp)
local units, fed = tonumber(b[4]) or 0, tonumber(b[5]) or 0
local per = tonumber(ARGV[7])
redis.call('HSET', KEYS[1], 'units', units + #members)
backlog_set(KEYS[6], ARGV[5], buckets(units - fed, per), buckets(units + #members - fed, per), exp)
return r
`)

// ErrRetryRunning is returned by RetryBatch while another retry of the
// batch runs (on any replica).
var ErrRetryRunning = errors.New("store: a retry of this batch is running")

// retryLease bounds how long a retry holds its batch's lock
// (keys.batchRetry) should its process die: a live retry renews it every
// retryLease/3, so a retry of a million items (about 15 s) keeps it, and
// the next retry after a crash is refused for seconds, not minutes (with
// a fixed 3-minute lock, the retry that finishes a killed one answered
// 409 for three minutes).
const retryLease = 6 * time.Second

// RetryTimeout says what an item adds to its unit's asynq timeout, as at
// submission (internal/ingest's staged): it depends on the item's kind and on
// whether it runs in its own unit.
type RetryTimeout func(kind puzzle.Kind, own bool) time.Duration

// RetryBatch re-opens the failed and canceled items of a batch and feeds
// their units again; it returns how many items it re-opened. A cheap item
// whose chunk still has items running waits for a later retry (see
// retryChunkScript): in a done batch, every failed and canceled item is
// re-opened. It answers ErrQuota when the owner's quota (0: unlimited)
// has no room for the failed and canceled items, and ErrNotFound for a
// batch that is gone. The caller then feeds the queue. A retry cut short
// (its context ended) has re-opened whole chunks, exactly; the next one
// re-opens the rest.
//
// Retries of one batch run one at a time (ErrRetryRunning for another):
// each reads every chunk of the batch, so concurrent ones would multiply
// that work without re-opening anything more.
func (s *Store) RetryBatch(ctx context.Context, b *Batch, quota int, timeout RetryTimeout) (int, error) {
	lock, token := s.k.batchRetry(b.ID), rand.Text()
	ok, err := s.rdb.SetNX(ctx, lock, token, retryLease).Result()
	if err != nil {
		return 0, fmt.Errorf("store: retry batch %s: lock: %w", b.ID, err)
	}
	if !ok {
		return 0, ErrRetryRunning
	}
	// Renew the lock while the retry runs (leaseScript renews only for
	// its holder). A renewal that fails leaves the retry running: its
	// chunk scripts are exact whoever else runs, the lock only saves work.
	stopRenew := lease.Renew(context.WithoutCancel(ctx), retryLease/3, func(rctx context.Context) {
		cctx, cancel := context.WithTimeout(rctx, retryLease/3)
		_ = leaseScript.Run(cctx, s.rdb, []string{lock}, token, retryLease.Milliseconds()).Err()
		cancel()
	})
	defer func() {
		stopRenew()
		// Only while it is still this retry's (releaseClaimScript is a
		// compare-and-delete); bounded, whatever ctx has left.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = releaseClaimScript.Run(uctx, s.rdb, []string{lock}, token).Err()
	}()
	return s.retryBatch(ctx, b, quota, timeout)
}

func (s *Store) retryBatch(ctx context.Context, b *Batch, quota int, timeout RetryTimeout) (int, error) {
	if n, err := s.beginRetry(ctx, b, quota, 0); err != nil || n == 0 {
		return 0, err
	}
	done := 0
	for j := 0; j < b.Chunks(); j++ {
		infos, err := s.ChunkInfos(ctx, b, j)
		if err != nil {
			return done, err
		}
		k, err := s.retryChunk(ctx, b, j, infos, timeout)
		if err != nil {
			return done, err
		}
		done += k
	}
	return done, nil
}

// beginRetry readies b for a retry that re-opens at most most of its
// failed and canceled items (0: all of them) and returns how many there
// are (beginRetryScript): ErrQuota when the owner's quota has no room for
// those, ErrNotFound when the batch is gone.
func (s *Store) beginRetry(ctx context.Context, b *Batch, quota, most int) (int, error) {
	bk := s.k.batch(b.ID)
	qk := []string{bk, bk, bk}
	if b.Owner != "" {
		qk = s.k.owner(b.Owner)
	}
	n, err := beginRetryScript.Run(ctx, s.rdb, append([]string{bk, s.k.backlog()}, qk...), b.ID, quota, backlogUnits, most).Int()
	if err != nil {
		return 0, fmt.Errorf("store: retry batch %s: %w", b.ID, err)
	}
	switch n {
	case -1:
		return 0, ErrQuota
	case -3:
		return 0, ErrNotFound
	}
	return n, nil
}

// retryChunk re-opens the failed and canceled items among infos, of
// chunk j of b, with one retryChunkScript call, and returns how many it
// re-opened.
func (s *Store) retryChunk(ctx context.Context, b *Batch, j int, infos []ChunkInfo, timeout RetryTimeout) (int, error) {
	var cheap time.Duration
	owns := false
	args := append([]any{}, s.k.ownerAffixes()...)
	args = append(args, b.ID, "", backlogUnits, j)
	for _, ci := range infos {
		if ci.State != apitype.TaskStateFailed && ci.State != apitype.TaskStateCanceled {
			continue
		}
		own := ""
		if ci.own {
			own = tasks.UnitRef{BatchID: b.ID, Unit: tasks.OwnUnit(ci.Index), Timeout: timeout(ci.Kind, true) + unitMargin}.Member()
			owns = true
		} else {
			cheap += timeout(ci.Kind, false)
		}
		args = append(args, ci.Index-j*b.Stride, own)
	}
	if len(args) == 8 {
		return 0, nil
	}
	bk := s.k.batch(b.ID)
	args[5] = tasks.UnitRef{BatchID: b.ID, Unit: tasks.ChunkUnit(j), Timeout: cheap + unitMargin}.Member()
	k, err := retryChunkScript.Run(ctx, s.rdb, []string{bk, s.k.batchRes(b.ID, j), s.k.feed(),
		s.k.ownerVT(b.Owner), s.laneVT(!owns), s.k.backlog(), s.k.batchReq(b.ID), s.k.cheapFeed()}, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("store: retry batch %s chunk %d: %w", b.ID, j, err)
	}
	return k, nil
}

// ErrItemBusy is RetryItem's answer for a failed or canceled item that
// runs in its chunk's unit while that unit still runs other items: the
// unit cannot be fed again until they end.
var ErrItemBusy = errors.New("store: the item's chunk is still running")

// RetryItem re-opens item index of b when it is failed or canceled, as
// RetryBatch does for every such item: it keeps its index, so its ID and
// custom_id, and its unit is fed again. It reports whether it re-opened
// it (false when the item is pending, running or completed, or another
// retry re-opened it first); ErrQuota when the owner's quota has no room
// for one more task, ErrNotFound when the batch is gone, ErrItemBusy (see
// there). The caller then feeds the queue. It takes no lock: the chunk's
// script re-opens an item once whoever else retries.
func (s *Store) RetryItem(ctx context.Context, b *Batch, index, quota int, timeout RetryTimeout) (bool, error) {
	if b.Stride <= 0 || index < 0 || index >= b.Total {
		return false, ErrNotFound
	}
	if n, err := s.beginRetry(ctx, b, quota, 1); err != nil || n == 0 {
		return false, err
	}
	j := index / b.Stride
	infos, err := s.ChunkInfos(ctx, b, j)
	if err != nil {
		return false, err
	}
	k := index - j*b.Stride
	if k >= len(infos) {
		return false, ErrNotFound
	}
	ci := infos[k]
	if ci.State != apitype.TaskStateFailed && ci.State != apitype.TaskStateCanceled {
		return false, nil
	}
	n, err := s.retryChunk(ctx, b, j, infos[k:k+1], timeout)
	if err != nil || n == 1 || ci.own {
		return n == 1, err
	}
	// Not re-opened: its chunk still runs, unless another retry came
	// first.
	if infos, err = s.ChunkInfos(ctx, b, j); err != nil {
		return false, err
	}
	if st := infos[k].State; st == apitype.TaskStateFailed || st == apitype.TaskStateCanceled {
		return false, ErrItemBusy
	}
	return false, nil
}
