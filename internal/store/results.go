package store

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
)

// ItemInfo is what a streamed answer needs to know of an item before it
// reads the item's result: its state and the result's size.
type ItemInfo struct {
	// State is "" for a record that does not exist (expired).
	State apitype.TaskState
	// ResultBytes is the length of the stored result, 0 without one.
	ResultBytes int64
}

// ItemInfos returns the state and result size of each record, in the order
// of ids, in one round trip and without reading any result, so that a
// caller can bound the memory of reading them before it does.
func (s *Store) ItemInfos(ctx context.Context, ids []string) ([]ItemInfo, error) {
	states := make([]*redis.StringCmd, len(ids))
	sizes := make([]*redis.IntCmd, len(ids))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			states[i] = p.HGet(ctx, s.k.task(id), "state")
			sizes[i] = p.HStrLen(ctx, s.k.task(id), "result")
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, fmt.Errorf("store: item infos: %w", err)
	}
	out := make([]ItemInfo, len(ids))
	for i := range ids {
		out[i] = ItemInfo{State: apitype.TaskState(states[i].Val()), ResultBytes: sizes[i].Val()}
	}
	return out, nil
}

// Results returns the stored result of each record, in the order of ids;
// a record without one gives "" (ok false). Strings, not json.RawMessage:
// a caller that writes them out need not copy them again.
func (s *Store) Results(ctx context.Context, ids []string) ([]string, []bool, error) {
	cmds := make([]*redis.StringCmd, len(ids))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HGet(ctx, s.k.task(id), "result")
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, nil, fmt.Errorf("store: results: %w", err)
	}
	out, ok := make([]string, len(ids)), make([]bool, len(ids))
	for i, c := range cmds {
		out[i], ok[i] = c.Val(), c.Err() == nil
	}
	return out, ok, nil
}
