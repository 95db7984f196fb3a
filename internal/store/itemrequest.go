package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// itemRequestScript returns one batch item's canonical request, as the
// batch keeps it for its whole life (docs/batches.md): the item's line of
// its chunk's request lines, or its own field when it runs in its own
// unit. Only that line crosses the network, not the chunk's (up to 4 MiB).
// Read-only.
//
// KEYS[1] batch req hash
// ARGV[1] the item's chunk j
// ARGV[2] the item's offset k in its chunk (0-based)
// ARGV[3] the item's index i
//
// Returns the request, or false when the hash has no such item.
var itemRequestScript = redis.NewScript(`
local m = redis.call('HGET', KEYS[1], 'm' .. ARGV[1])
if not m then return false end
local k = tonumber(ARGV[2])
local c = string.byte(m, k + 1)
if not c then return false end
if c >= 65 and c <= 90 then
  return redis.call('HGET', KEYS[1], 'x' .. ARGV[3])
end
local lines = redis.call('HGET', KEYS[1], ARGV[1])
if not lines then return false end
local from = 1
for _ = 1, k do
  local nl = string.find(lines, '\n', from, true)
  if not nl then return false end
  from = nl + 1
end
local to = string.find(lines, '\n', from, true)
return string.sub(lines, from, (to or (#lines + 1)) - 1)
`)

// ItemRequest returns item index of b's canonical request
// (puzzle.Parsed.Payload: {"kind","puzzle","options"}), which the batch
// keeps until it expires; ErrNotFound when there is no such item.
func (s *Store) ItemRequest(ctx context.Context, b *Batch, index int) ([]byte, error) {
	if index < 0 || index >= b.Total || b.Stride <= 0 {
		return nil, ErrNotFound
	}
	j, k := index/b.Stride, index%b.Stride
	v, err := itemRequestScript.RunRO(ctx, s.rdb, []string{s.k.batchReq(b.ID)}, j, k, index).Text()
	if errors.Is(err, redis.Nil) || err == nil && v == "" {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: item request %s/%d: %w", b.ID, index, err)
	}
	return []byte(v), nil
}
