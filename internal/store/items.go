package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/puzzle"
)

// Cached returns the cached result for key, nil on a miss.
func (s *Store) Cached(ctx context.Context, key string) (json.RawMessage, error) {
	v, err := s.rdb.Get(ctx, s.k.cache(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: cache lookup: %w", err)
	}
	return json.RawMessage(v), nil
}

// itemEntry is an ended item's entry (docs/batches.md, Results).
type itemEntry struct {
	State       apitype.TaskState  `json:"state"`
	Ref         string             `json:"ref"`
	Cached      bool               `json:"cached"`
	Error       *apitype.TaskError `json:"error"`
	StartedAt   int64              `json:"started_at"`
	CompletedAt int64              `json:"completed_at"`
	Attempts    int                `json:"attempts"`
	Size        int64              `json:"size"`
	Result      json.RawMessage    `json:"result"`
}

// readHead is what readItemsScript says of the batch.
type readHead struct {
	owner     string
	createdAt time.Time
	total     int
}

// rawItem is one item as readItemsScript returns it.
type rawItem struct {
	kind, customID, entry, marker, progress, extra string
}

// readItems runs readItemsScript for items [first, first+count) on p (a
// pipeline) or s.rdb; decode with decodeRead.
func (s *Store) readItems(ctx context.Context, c redis.Scripter, batchID string, first, count int) *redis.Cmd {
	return readItemsScript.RunRO(ctx, c, []string{s.k.batch(batchID), s.k.batchReq(batchID)},
		s.k.batchResBase(batchID), s.k.cache(""), first, count)
}

// decodeRead splits readItemsScript's reply; ok is false when the batch
// is gone.
func decodeRead(cmd *redis.Cmd) (readHead, []rawItem, bool, error) {
	v, err := cmd.StringSlice()
	if err != nil {
		return readHead{}, nil, false, err
	}
	if len(v) < 4 {
		return readHead{}, nil, false, nil
	}
	h := readHead{owner: v[0], createdAt: msTime(v[1])}
	h.total, _ = strconv.Atoi(v[2])
	items := make([]rawItem, 0, (len(v)-4)/6)
	for i := 4; i+5 < len(v); i += 6 {
		items = append(items, rawItem{v[i], v[i+1], v[i+2], v[i+3], v[i+4], v[i+5]})
	}
	return h, items, true, nil
}

// customID decodes a custom ID line: nil for none.
func customID(line string) *string {
	if line == "" || line == `""` {
		return nil
	}
	var id string
	if json.Unmarshal([]byte(line), &id) != nil || id == "" {
		return nil
	}
	return &id
}

// parseMarker reads an active marker "<attempts> <started_at ms>".
func parseMarker(v string) (int, time.Time) {
	a, st, ok := strings.Cut(v, " ")
	if !ok {
		return 0, time.Time{}
	}
	n, _ := strconv.Atoi(a)
	return n, msTime(st)
}

// toTask makes item index of batchID into a task record.
func toTask(batchID string, index int, h readHead, r rawItem) *Task {
	t := &Task{ID: apitype.ItemID(batchID, index), Owner: h.owner, BatchID: batchID,
		CustomID: customID(r.customID), CreatedAt: h.createdAt, State: apitype.TaskStatePending}
	if r.kind != "" {
		t.Kind = string(kindOf(r.kind[0]))
	}
	if r.marker != "" {
		t.State = apitype.TaskStateActive
		t.Attempts, t.StartedAt = parseMarker(r.marker)
	}
	if r.progress != "" {
		var p apitype.Progress
		if json.Unmarshal([]byte(r.progress), &p) == nil {
			t.Progress = &p
		}
	}
	if r.entry != "" {
		var e itemEntry
		if err := json.Unmarshal([]byte(r.entry), &e); err == nil {
			t.State, t.Cached, t.Attempts = e.State, e.Cached, e.Attempts
			t.StartedAt, t.CompletedAt = msTime(strconv.FormatInt(e.StartedAt, 10)), msTime(strconv.FormatInt(e.CompletedAt, 10))
			if e.Error != nil {
				t.ErrCode, t.ErrMsg = e.Error.Code, e.Error.Message
			}
			t.Result = e.Result
			if e.Ref != "" && r.extra != "" {
				t.Result = json.RawMessage(r.extra)
			}
		}
	}
	return t
}

// GetItem returns batch item index as a task record (BatchID and
// CustomID set), or ErrNotFound. It is one round trip.
func (s *Store) GetItem(ctx context.Context, batchID string, index int) (*Task, error) {
	if index < 0 {
		return nil, ErrNotFound
	}
	h, items, ok, err := decodeRead(s.readItems(ctx, s.rdb, batchID, index, 1))
	if err != nil {
		return nil, fmt.Errorf("store: get item: %w", err)
	}
	if !ok || index >= h.total || len(items) != 1 {
		return nil, ErrNotFound
	}
	return toTask(batchID, index, h, items[0]), nil
}

// ChunkInfo is one item of a chunk as a results stream first reads it:
// everything but its result, and the result's size, so the reader can
// bound the memory of reading the results before it does.
type ChunkInfo struct {
	Index    int
	CustomID *string
	Kind     puzzle.Kind
	State    apitype.TaskState
	// Error is set for a failed or canceled item.
	Error *apitype.TaskError
	// ResultBytes is the size of a completed item's result.
	ResultBytes int64
	// Result is a completed item's result when ChunkInfos read it with
	// the states (a small one: see entryIsSmall); "" when it is to be
	// read with ChunkResults, in a piece whose bytes the reader holds.
	Result string

	ref string // the cache entry holding the result, when stored once
	own bool   // the item runs in its own unit
}

// itemProgressScript records a batch item's progress while it has not
// ended.
//
// KEYS[1] batch hash
// KEYS[2] res hash of the item's chunk
// ARGV[1] the item's offset in its chunk
// ARGV[2] progress JSON
//
// Returns 1 when written.
var itemProgressScript = redis.NewScript(`
local exp = redis.call('HGET', KEYS[1], 'expires_at')
if not exp or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
redis.call('HSET', KEYS[2], 'p' .. ARGV[1], ARGV[2])
redis.call('PEXPIREAT', KEYS[2], exp)
return 1
`)

// readItemsScript reads items [first, first+count) of a batch, clamped to
// its total, as task records: the batch's owner and creation time, and per
// item its kind byte, custom ID line, entry, active marker, progress and
// (for an entry that refers to the cache) the cached result. GetItem uses
// it, one item in one round trip; reads of many items (reads.go) use
// plain commands, decoded in the API, instead. Read-only.
//
// KEYS[1] batch hash
// KEYS[2] batch req hash
//
// ARGV[1] the batch's res key without the chunk number
// ARGV[2] the cache key without the hash
// ARGV[3] first index
// ARGV[4] count
//
// Returns {} when the batch is gone, else {owner, created_at, total,
// stride, then 6 values per item}.
var readItemsScript = redis.NewScript(`
` + batchLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'created_at', 'total', 'stride')
if not b[3] then return {} end
local total, stride = tonumber(b[3]), tonumber(b[4]) or 0
local out = {b[1] or '', b[2] or '', b[3], b[4] or '0'}
if stride <= 0 then return out end
local first, last = tonumber(ARGV[3]), math.min(total, tonumber(ARGV[3]) + tonumber(ARGV[4])) - 1
local cj, m, ids, rk = -1, '', nil, ''
for idx = first, last do
  local j = math.floor(idx / stride)
  local k = idx - j * stride
  if j ~= cj then
    cj = j
    m = redis.call('HGET', KEYS[2], 'm' .. j) or ''
    local il = redis.call('HGET', KEYS[2], 'i' .. j)
    ids = il and lines_of(il) or nil
    rk = ARGV[1] .. j
  end
  local kb = string.sub(m, k + 1, k + 1)
  local r = redis.call('HMGET', rk, tostring(k), marker_field(kb == '' and 's' or kb, k), 'p' .. k)
  local e, extra = r[1] or '', ''
  if e ~= '' then
    local ref = string.match(e, ',"ref":(%b"")')
    if ref then
      extra = redis.call('GET', ARGV[2] .. cjson.decode(ref)) or ''
    end
  end
  out[#out + 1] = kb
  out[#out + 1] = ids and ids[k + 1] or ''
  out[#out + 1] = e
  out[#out + 1] = r[2] or ''
  out[#out + 1] = r[3] or ''
  out[#out + 1] = extra
end
return out
`)
