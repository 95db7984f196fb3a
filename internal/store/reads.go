package store

// The read path of a batch's items (docs/batches.md, Results) for
// /results, /output and the pages of GET /v1/batches/{id}: plain
// pipelined HMGETs of a chunk's fields, decoded here, in the API process
// (which scales out), rather than per-item Lua string work in Redis (the
// one shared process). Reading a chunk of 64 8-puzzles costs Redis three
// commands, not a script that makes 64 calls and cuts 64 strings.
//
// Memory stays bounded as before: every entry's size is read first
// (HSTRLEN; a chunk of 8-puzzles costs Redis about 1 us an item this way,
// against 10 for the scripts: TestReadCostPerItem). A small entry is then
// read whole, its result with it (up to smallEntriesBytes a chunk), and a
// large one as its head alone, so that its result is read later, in a
// piece whose bytes the caller took from its pool first. Nothing is
// assumed of an entry's size from its kind.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
)

// smallEntryBytes is the largest entry that ChunkInfos reads whole with
// the states, result included (an 8-puzzle's is about 150 bytes), and
// smallEntriesBytes bounds all of those of one chunk: one piece of
// results (the API's resultPiece), which the API then holds in its pool
// like any piece. Beyond either, an entry's head alone is read
// (entryHeadsScript) and its result later.
const (
	smallEntryBytes   = 4 << 10
	smallEntriesBytes = 256 << 10
)

// isOwnKind reports whether kind byte kb is an own-unit item's.
func isOwnKind(kb byte) bool { return kb >= 'A' && kb <= 'Z' }

// markerField is the field of the active marker of item k's unit, as
// batchLua's marker_field: a missing kind byte counts as a shared unit's.
func markerField(kb byte, k int) string {
	if isOwnKind(kb) {
		return "a" + strconv.Itoa(k)
	}
	return "a"
}

// resultSep is what comes before an inline result, which is always the
// entry's last member (entry in batchLua). A JSON string escapes its
// quotes, so it cannot hold this: its first occurrence is the member.
const resultSep = `,"result":`

// splitEntry cuts an ended entry into its head (every member but the
// inline result, still a JSON object) and its inline result ("" when it
// has none).
func splitEntry(e string) (head, result string) {
	pos := strings.Index(e, resultSep)
	if pos < 0 || !strings.HasSuffix(e, "}") {
		return e, ""
	}
	return e[:pos] + "}", e[pos+len(resultSep) : len(e)-1]
}

// parseHead decodes an entry's head; ok is false for one that does not
// decode (never written by this code), which reads as no entry, as in
// toTask.
func parseHead(head string) (itemEntry, bool) {
	if e, ok := parsePlainHead(head); ok {
		return e, true
	}
	var e itemEntry
	if err := json.Unmarshal([]byte(head), &e); err != nil {
		return itemEntry{}, false
	}
	return e, true
}

// parsePlainHead decodes, without reflection, the head that
// finishUnitScript writes for nearly every item: {"state":"<letters>"}
// and then integer members among started_at, completed_at, attempts and
// size. Reading /results, encoding/json's reflection was a fifth of the
// API's CPU per 8-puzzle. Anything else (a ref, cached,
// an error, a space, a sign, a leading zero, an escape, a name in another
// case) is left to encoding/json: ok is false. FuzzParsePlainHead holds
// it to encoding/json's answer wherever it answers.
func parsePlainHead(h string) (itemEntry, bool) {
	const pre = `{"state":"`
	var e itemEntry
	if !strings.HasPrefix(h, pre) {
		return e, false
	}
	rest := h[len(pre):]
	q := strings.IndexByte(rest, '"')
	if q <= 0 {
		return e, false
	}
	for i := range q {
		if c := rest[i]; c < 'a' || c > 'z' {
			return e, false
		}
	}
	e.State = apitype.TaskState(rest[:q])
	rest = rest[q+1:]
	for rest != "}" {
		if !strings.HasPrefix(rest, `,"`) {
			return e, false
		}
		rest = rest[2:]
		q = strings.IndexByte(rest, '"')
		if q < 0 || len(rest) < q+2 || rest[q+1] != ':' {
			return e, false
		}
		name := rest[:q]
		rest = rest[q+2:]
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n == 0 || n > 15 || (n > 1 && rest[0] == '0') {
			return e, false
		}
		v, err := strconv.ParseInt(rest[:n], 10, 64)
		if err != nil {
			return e, false
		}
		rest = rest[n:]
		switch name {
		case "started_at":
			e.StartedAt = v
		case "completed_at":
			e.CompletedAt = v
		case "attempts":
			e.Attempts = int(v)
		case "size":
			e.Size = v
		default:
			return e, false
		}
	}
	return e, true
}

// entryHeadsScript reads the heads of a chunk's large entries: each one
// cut before its inline result, so that Redis sends its size and not the
// result. Only entries too large to read whole come here: the cut costs
// Lua a copy of the entry, which is what a read of it costs anyway.
// Read-only.
//
// KEYS[1] res hash of the chunk
// ARGV[1..] the items' offsets in the chunk
//
// Returns per offset its head, or "" when it has no entry.
var entryHeadsScript = redis.NewScript(`
local out = {}
for a = 1, #ARGV do
  local e = redis.call('HGET', KEYS[1], ARGV[a]) or ''
  local pos = string.find(e, '` + resultSep + `', 1, true)
  if pos then e = string.sub(e, 1, pos - 1) .. '}' end
  out[a] = e
end
return out
`)

// hmgetStrings returns an HMGET's values as strings, "" for a missing
// field, and whether each was present.
func hmgetStrings(c *redis.SliceCmd) ([]string, []bool) {
	v := c.Val()
	out, ok := make([]string, len(v)), make([]bool, len(v))
	for i, x := range v {
		out[i], ok[i] = x.(string)
	}
	return out, ok
}

// ChunkInfos returns the items of chunk j of b, in order, without their
// results except the small ones read with the states (ChunkInfo.Result,
// at most smallEntriesBytes of them).
//
// It reads, in up to four round trips of plain commands: the batch's
// total (is it there?) and the chunk's kind map and custom IDs; then the
// chunk's active markers and the size of every entry (HSTRLEN); then the
// entries, whole when small, or their heads (entryHeadsScript); then the
// sizes of the cache entries that entries refer to (STRLEN). A chunk of
// 8-puzzles takes the first three, and no script.
func (s *Store) ChunkInfos(ctx context.Context, b *Batch, j int) ([]ChunkInfo, error) {
	if b.Stride <= 0 || j < 0 || j*b.Stride >= b.Total {
		return nil, nil
	}
	first := j * b.Stride
	n := min(b.Stride, b.Total-first)
	rk, js := s.k.batchRes(b.ID, j), strconv.Itoa(j)

	var bh, req *redis.SliceCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		bh = p.HMGet(ctx, s.k.batch(b.ID), "total")
		req = p.HMGet(ctx, s.k.batchReq(b.ID), "m"+js, "i"+js)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("store: chunk infos: %w", err)
	}
	if _, ok := bh.Val()[0].(string); !ok {
		return nil, ErrNotFound
	}
	rv, _ := hmgetStrings(req)
	kinds := rv[0]
	var ids []string
	if rv[1] != "" {
		ids = strings.Split(rv[1], "\n")
	}
	kindAt := func(k int) byte {
		if k < len(kinds) {
			return kinds[k]
		}
		return 0
	}

	// Round trip 2: the markers in one HMGET, and every entry's size.
	fields := []string{"a"}
	markerAt := make([]int, n) // 0: the chunk unit's marker "a"
	sizes := make([]*redis.IntCmd, n)
	for k := range n {
		if kb := kindAt(k); isOwnKind(kb) {
			markerAt[k] = len(fields)
			fields = append(fields, markerField(kb, k))
		}
	}
	var res *redis.SliceCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		res = p.HMGet(ctx, rk, fields...)
		for k := range n {
			sizes[k] = p.HStrLen(ctx, rk, strconv.Itoa(k))
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("store: chunk infos: %w", err)
	}
	vals, _ := hmgetStrings(res)
	entries := make([]string, n)

	// Round trip 3: the entries, whole while they are small, else their
	// heads. An entry is written once, so one sized here is the same
	// when it is read (or gone, when the batch expired meanwhile).
	var whole, heads []int
	budget := 0
	for k := range n {
		size := int(sizes[k].Val())
		switch {
		case size == 0: // no entry: an entry is never empty
		case size <= smallEntryBytes && budget+size <= smallEntriesBytes:
			budget += size
			whole = append(whole, k)
		default:
			heads = append(heads, k)
		}
	}
	if len(whole)+len(heads) > 0 {
		var wc *redis.SliceCmd
		var hc *redis.Cmd
		err := s.pipelineScripts(ctx, func(p redis.Pipeliner) {
			wc, hc = nil, nil
			if len(whole) > 0 {
				wc = p.HMGet(ctx, rk, offsets(whole)...)
			}
			if len(heads) > 0 {
				args := make([]any, len(heads))
				for i, k := range heads {
					args[i] = k
				}
				hc = entryHeadsScript.EvalShaRO(ctx, p, []string{rk}, args...)
			}
		}, entryHeadsScript)
		if err != nil {
			return nil, fmt.Errorf("store: chunk infos: %w", err)
		}
		if wc != nil {
			v, _ := hmgetStrings(wc)
			for i, k := range whole {
				entries[k] = v[i]
			}
		}
		if hc != nil {
			v, err := hc.StringSlice()
			if err != nil || len(v) != len(heads) {
				return nil, fmt.Errorf("store: chunk infos: entry heads: %v (%d for %d)", err, len(v), len(heads))
			}
			for i, k := range heads {
				entries[k] = v[i]
			}
		}
	}

	out := make([]ChunkInfo, n)
	refs := map[int]*redis.IntCmd{}
	for k := range n {
		kb := kindAt(k)
		ci := ChunkInfo{Index: first + k, State: apitype.TaskStatePending, Kind: kindOf(kb), own: isOwnKind(kb)}
		if k < len(ids) {
			ci.CustomID = customID(ids[k])
		}
		if vals[markerAt[k]] != "" { // the item's unit's marker: "a" (0) or "a<k>"
			ci.State = apitype.TaskStateActive
		}
		if entries[k] != "" {
			head, result := splitEntry(entries[k])
			if e, ok := parseHead(head); ok {
				ci.State = e.State
				if e.Error != nil {
					ci.Error = &apitype.TaskError{Code: e.Error.Code, Message: e.Error.Message}
				}
				if ci.State == apitype.TaskStateCompleted {
					switch {
					case e.Ref != "":
						ci.ref = e.Ref
					case result != "":
						ci.Result, ci.ResultBytes = result, int64(len(result))
					default:
						ci.ResultBytes = e.Size // a head: the result is read later
					}
				}
			}
		}
		out[k] = ci
	}
	// Round trip 4: the sizes of the results stored once in the cache.
	for k := range out {
		if out[k].ref != "" {
			refs[k] = nil
		}
	}
	if len(refs) > 0 {
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for k := range refs {
				refs[k] = p.StrLen(ctx, s.k.cache(out[k].ref))
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("store: chunk infos: %w", err)
		}
		for k, c := range refs {
			out[k].ResultBytes = c.Val()
		}
	}
	return out, nil
}

// offsets returns items' offsets in their chunk as HMGET fields.
func offsets(ks []int) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = strconv.Itoa(k)
	}
	return out
}

// ChunkResults returns the results of the completed items at indexes idx
// (all in chunk j of b), in order; ok[i] is false for one whose result is
// gone (expired). It reads their entries (one HMGET), and then the cache
// entries that those refer to.
func (s *Store) ChunkResults(ctx context.Context, b *Batch, j int, idx []int) (results []string, ok []bool, err error) {
	results, ok = make([]string, len(idx)), make([]bool, len(idx))
	if len(idx) == 0 {
		return results, ok, nil
	}
	ks := make([]int, len(idx))
	for i, x := range idx {
		if b.Stride <= 0 || x/b.Stride != j {
			return nil, nil, fmt.Errorf("store: chunk results: item %d is not in chunk %d", x, j)
		}
		ks[i] = x % b.Stride
	}
	ents, err := s.rdb.HMGet(ctx, s.k.batchRes(b.ID, j), offsets(ks)...).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("store: chunk results: %w", err)
	}
	refs := map[int]string{}
	for i, v := range ents {
		e, _ := v.(string)
		if e == "" {
			continue
		}
		head, result := splitEntry(e)
		if result != "" {
			results[i], ok[i] = result, true
		} else if h, hok := parseHead(head); hok && h.Ref != "" {
			refs[i] = h.Ref
		}
	}
	if len(refs) > 0 {
		cmds := make(map[int]*redis.StringCmd, len(refs))
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, r := range refs {
				cmds[i] = p.Get(ctx, s.k.cache(r))
			}
			return nil
		}); err != nil && !errors.Is(err, redis.Nil) {
			return nil, nil, fmt.Errorf("store: chunk results: %w", err)
		}
		for i, c := range cmds {
			if v, err := c.Result(); err == nil {
				results[i], ok[i] = v, true
			}
		}
	}
	return results, ok, nil
}

// ItemsPage returns items [start, start+limit) of b as task records,
// results included, for GET /v1/batches/{id}. Items past the batch's end
// are left out.
func (s *Store) ItemsPage(ctx context.Context, b *Batch, start, limit int) ([]*Task, error) {
	if start < 0 || limit <= 0 || start >= b.Total || b.Stride <= 0 {
		return nil, nil
	}
	end := min(b.Total, start+limit)
	idx := make([]int, 0, end-start)
	for i := start; i < end; i++ {
		idx = append(idx, i)
	}
	return s.ItemsAt(ctx, b, idx)
}

// ItemsAt returns the items of b at indexes idx (ascending) as task
// records, results included, for GET /v1/batches/{id} and its items
// list. It reads the batch record, and each chunk the items are in with
// one HMGET of its kind map and custom IDs and one of their entries,
// markers and progress, all in one pipeline; then the results that
// entries refer to. Indexes past the batch's end are left out.
func (s *Store) ItemsAt(ctx context.Context, b *Batch, idx []int) ([]*Task, error) {
	if b.Stride <= 0 {
		return nil, nil
	}
	idx = slices.DeleteFunc(slices.Clone(idx), func(i int) bool { return i < 0 || i >= b.Total })
	if len(idx) == 0 {
		return nil, nil
	}
	type part struct {
		items    []int
		req, res *redis.SliceCmd
	}
	var parts []*part
	var bh *redis.SliceCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		bh = p.HMGet(ctx, s.k.batch(b.ID), "owner", "created_at", "total")
		for x := 0; x < len(idx); {
			j := idx[x] / b.Stride
			pt := &part{}
			for x < len(idx) && idx[x]/b.Stride == j {
				pt.items = append(pt.items, idx[x])
				x++
			}
			js := strconv.Itoa(j)
			pt.req = p.HMGet(ctx, s.k.batchReq(b.ID), "m"+js, "i"+js)
			// Per item its entry, its own unit's marker and its progress,
			// and last the chunk unit's marker.
			fields := make([]string, 0, 3*len(pt.items)+1)
			for _, i := range pt.items {
				k := strconv.Itoa(i - j*b.Stride)
				fields = append(fields, k, "a"+k, "p"+k)
			}
			pt.res = p.HMGet(ctx, s.k.batchRes(b.ID, j), append(fields, "a")...)
			parts = append(parts, pt)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("store: items page: %w", err)
	}
	hv, hok := hmgetStrings(bh)
	if !hok[2] {
		return nil, ErrNotFound
	}
	h := readHead{owner: hv[0], createdAt: msTime(hv[1])}
	h.total, _ = strconv.Atoi(hv[2])

	raws := make([]rawItem, 0, len(idx))
	refs := map[int]string{} // raws' index: the cache entry its entry refers to
	for _, pt := range parts {
		rv, _ := hmgetStrings(pt.req)
		kinds, ids := rv[0], []string(nil)
		if rv[1] != "" {
			ids = strings.Split(rv[1], "\n")
		}
		v, _ := hmgetStrings(pt.res)
		chunkMarker := v[len(v)-1]
		for x, i := range pt.items {
			k := i % b.Stride
			r := rawItem{entry: v[3*x], progress: v[3*x+2]}
			var kb byte
			if k < len(kinds) {
				kb = kinds[k]
				r.kind = kinds[k : k+1]
			}
			if k < len(ids) {
				r.customID = ids[k]
			}
			r.marker = chunkMarker
			if isOwnKind(kb) {
				r.marker = v[3*x+1]
			}
			if r.entry != "" {
				if head, result := splitEntry(r.entry); result == "" {
					if e, ok := parseHead(head); ok && e.Ref != "" {
						refs[len(raws)] = e.Ref
					}
				}
			}
			raws = append(raws, r)
		}
	}
	if len(refs) > 0 {
		cmds := make(map[int]*redis.StringCmd, len(refs))
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, r := range refs {
				cmds[i] = p.Get(ctx, s.k.cache(r))
			}
			return nil
		}); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("store: items page: %w", err)
		}
		for i, c := range cmds {
			raws[i].extra = c.Val() // "" when gone, as readItemsScript
		}
	}
	out := make([]*Task, len(raws))
	for i, r := range raws {
		out[i] = toTask(b.ID, idx[i], h, r)
	}
	return out, nil
}
