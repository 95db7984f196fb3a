package store

// Listing an owner's batches and single tasks, newest first, from the
// per-owner indexes (keys.ownerBatches, keys.ownerTasks): sorted sets of
// IDs scored by creation time, which the commit and submit scripts keep
// and trim. A member whose record has expired or was deleted is skipped
// and removed as it is met, so the indexes never list what cannot be read.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
)

// ListFilter narrows a list; its zero value lists everything.
type ListFilter struct {
	// State keeps only records in this state ("" for any); for a batch,
	// its apitype.BatchStateOf.
	State apitype.TaskState
	// Kind keeps only tasks of this kind, or batches with an item of it.
	Kind string
	// CreatedAfter keeps only records created after it (zero for any).
	CreatedAfter time.Time
}

// ErrBadCursor is returned for a list cursor this code did not write.
var ErrBadCursor = errors.New("store: bad list cursor")

// listScanBudget bounds how many index members one list call reads: a
// filter that matches little answers a short page with a cursor rather
// than reading the whole index in one request.
const listScanBudget = 2000

// listResultBytes bounds the results one page of tasks carries: past it
// the page ends early (with a cursor), so a page of large fill results
// stays a few MiB, not limit times a result.
const listResultBytes = 8 << 20

// cursorPos is a place in an index: a member's score and ID. The next
// page starts after it.
type cursorPos struct {
	score int64
	id    string
}

func (c cursorPos) String() string { return strconv.FormatInt(c.score, 10) + "." + c.id }

// parseCursor reads a cursor made by cursorPos.String; "" is the start.
func parseCursor(v string) (*cursorPos, error) {
	if v == "" {
		return nil, nil
	}
	sc, id, ok := strings.Cut(v, ".")
	n, err := strconv.ParseInt(sc, 10, 64)
	if !ok || err != nil || n < 0 || !apitype.IsID(id) {
		return nil, ErrBadCursor
	}
	return &cursorPos{n, id}, nil
}

// scanIndex walks index key newest first from after cursor, handing
// members a slice at a time to take, which returns how many of them it
// consumed (all, unless the page filled) and whether to stop. It returns
// the position after the last member consumed, or nil when the index is
// exhausted.
func (s *Store) scanIndex(ctx context.Context, key, cursor string, after time.Time, limit int,
	take func(ids []string) (int, bool, error)) (*string, error) {
	pos, err := parseCursor(cursor)
	if err != nil {
		return nil, err
	}
	lo := ms(s.now().Add(-s.taskTTL))
	if !after.IsZero() {
		lo = max(lo, ms(after)+1)
	}
	scanned, count := 0, 100
	for scanned < listScanBudget {
		by := &redis.ZRangeBy{Min: strconv.FormatInt(lo, 10), Max: "+inf", Count: int64(count)}
		if pos != nil {
			by.Max = strconv.FormatInt(pos.score, 10)
		}
		zs, err := s.rdb.ZRevRangeByScoreWithScores(ctx, key, by).Result()
		if err != nil {
			return nil, fmt.Errorf("store: list: %w", err)
		}
		// Members of the cursor's score sort by ID, descending here:
		// those at or after the cursor's ID were on earlier pages.
		var ids []string
		var at []cursorPos
		for _, z := range zs {
			id, _ := z.Member.(string)
			sc := int64(z.Score)
			if pos != nil && sc == pos.score && id >= pos.id {
				continue
			}
			ids = append(ids, id)
			at = append(at, cursorPos{sc, id})
		}
		if len(ids) == 0 {
			if len(zs) < count {
				return nil, nil // exhausted
			}
			count *= 2 // a run of members of one millisecond
			continue
		}
		n, stop, err := take(ids)
		if err != nil {
			return nil, err
		}
		scanned += n
		if n > 0 {
			p := at[n-1]
			pos = &p
		}
		if (stop || n < len(ids)) && !(n == len(ids) && len(zs) < count) {
			c := pos.String()
			return &c, nil
		}
		if len(zs) < count {
			return nil, nil
		}
	}
	c := pos.String()
	return &c, nil
}

// ListBatches returns a page of owner's batches, newest first, that pass
// f, and the cursor of the next page (nil on the last). A page may be
// shorter than limit while a cursor is returned: the scan is bounded.
func (s *Store) ListBatches(ctx context.Context, owner string, f ListFilter, cursor string, limit int) ([]*Batch, *string, error) {
	key := s.k.ownerBatches(owner)
	var out []*Batch
	next, err := s.scanIndex(ctx, key, cursor, f.CreatedAfter, limit, func(ids []string) (int, bool, error) {
		cmds := make([]*redis.MapStringStringCmd, len(ids))
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HGetAll(ctx, s.k.batch(id))
			}
			return nil
		}); err != nil {
			return 0, false, fmt.Errorf("store: list batches: %w", err)
		}
		var gone []any
		for i, c := range cmds {
			m := c.Val()
			if len(m) == 0 || m["total"] == "" {
				gone = append(gone, ids[i])
				continue
			}
			b := decodeBatch(ids[i], m)
			if b.Owner != owner || !batchPasses(b, f) {
				continue
			}
			out = append(out, b)
			if len(out) == limit {
				s.dropGone(ctx, key, gone)
				return i + 1, true, nil
			}
		}
		s.dropGone(ctx, key, gone)
		return len(ids), false, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, next, nil
}

// BatchState is the state b is listed under (apitype.BatchStateOf).
func BatchState(b *Batch) apitype.TaskState {
	return apitype.BatchStateOf(countsOf(b), b.Total, !b.CanceledAt.IsZero())
}

func countsOf(b *Batch) apitype.Counts {
	return apitype.Counts{Pending: b.Counts[apitype.TaskStatePending], Active: b.Counts[apitype.TaskStateActive],
		Completed: b.Counts[apitype.TaskStateCompleted], Failed: b.Counts[apitype.TaskStateFailed],
		Canceled: b.Counts[apitype.TaskStateCanceled]}
}

func batchPasses(b *Batch, f ListFilter) bool {
	if f.State != "" && BatchState(b) != f.State {
		return false
	}
	return f.Kind == "" || slices.Contains(b.Kinds, f.Kind)
}

// taskListFields are the fields of a task record a list reads before
// its result, which it reads only for the tasks it returns.
var taskListFields = []string{"kind", "owner", "state", "err_code", "err_msg", "cached",
	"created_at", "started_at", "completed_at", "attempts", "progress"}

// ListTasks returns a page of owner's single tasks, newest first, that
// pass f, results included, and the cursor of the next page (nil on the
// last). The page ends early once its results pass listResultBytes.
func (s *Store) ListTasks(ctx context.Context, owner string, f ListFilter, cursor string, limit int) ([]*Task, *string, error) {
	key := s.k.ownerTasks(owner)
	var out []*Task
	var resultBytes int64
	next, err := s.scanIndex(ctx, key, cursor, f.CreatedAfter, limit, func(ids []string) (int, bool, error) {
		cmds := make([]*redis.SliceCmd, len(ids))
		sizes := make([]*redis.IntCmd, len(ids))
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HMGet(ctx, s.k.task(id), taskListFields...)
				sizes[i] = p.HStrLen(ctx, s.k.task(id), "result")
			}
			return nil
		}); err != nil {
			return 0, false, fmt.Errorf("store: list tasks: %w", err)
		}
		var gone []any
		var page []*Task
		consumed, stop := len(ids), false
		stateAt := slices.Index(taskListFields, "state")
		for i, c := range cmds {
			v, ok := hmgetStrings(c)
			if !ok[stateAt] { // no state: the record is gone
				gone = append(gone, ids[i])
				continue
			}
			m := make(map[string]string, len(taskListFields))
			for j, name := range taskListFields {
				if ok[j] {
					m[name] = v[j]
				}
			}
			t := decodeTask(ids[i], m)
			if t.Owner != owner || (f.State != "" && t.State != f.State) || (f.Kind != "" && t.Kind != f.Kind) {
				continue
			}
			size := sizes[i].Val()
			if len(out)+len(page) > 0 && resultBytes+size > listResultBytes {
				consumed, stop = i, true
				break
			}
			resultBytes += size
			page = append(page, t)
			if len(out)+len(page) == limit {
				consumed, stop = i+1, true
				break
			}
		}
		s.dropGone(ctx, key, gone)
		if err := s.readResults(ctx, page); err != nil {
			return 0, false, err
		}
		out = append(out, page...)
		return consumed, stop, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, next, nil
}

// readResults fills in the results of completed tasks.
func (s *Store) readResults(ctx context.Context, ts []*Task) error {
	cmds := map[*Task]*redis.StringCmd{}
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, t := range ts {
			if t.State == apitype.TaskStateCompleted {
				cmds[t] = p.HGet(ctx, s.k.task(t.ID), "result")
			}
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("store: list tasks: results: %w", err)
	}
	for t, c := range cmds {
		if v, err := c.Result(); err == nil {
			t.Result = []byte(v)
		}
	}
	return nil
}

// dropGone removes index members whose records are gone, best effort:
// the next list skips them again if this fails.
func (s *Store) dropGone(ctx context.Context, key string, ids []any) {
	if len(ids) > 0 {
		s.rdb.ZRem(ctx, key, ids...)
	}
}

// Backlog returns about how many batch units wait in the feed, not yet on
// the queue (the backlog's members times backlogUnits, an upper bound),
// and when the oldest batch among them was created: its members are
// scored by its expiry, which is its creation plus the record TTL.
func (s *Store) Backlog(ctx context.Context) (int, time.Time, error) {
	var card *redis.IntCmd
	var first *redis.ZSliceCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		card = p.ZCard(ctx, s.k.backlog())
		first = p.ZRangeWithScores(ctx, s.k.backlog(), 0, 0)
		return nil
	}); err != nil {
		return 0, time.Time{}, fmt.Errorf("store: backlog: %w", err)
	}
	var oldest time.Time
	if z := first.Val(); len(z) == 1 {
		oldest = time.UnixMilli(int64(z[0].Score)).Add(-s.taskTTL)
	}
	return int(card.Val()) * backlogUnits, oldest, nil
}
