package store

// The cost, in Redis CPU, of reading a batch's results, against the read
// path that it replaced (per-item Lua: legacyScripts, kept here as they
// were at 6b80665), measured in one run on one server; and the answers of
// both, held equal on a batch with every kind of item and state.

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// legacyScripts returns readItemsScript (with its "info" mode) and
// chunkResultsScript as they were before reads.go. They are made by a
// function, not package variables, so that allScripts need not list them.
func legacyScripts() (readItems, chunkResults *redis.Script) {
	return redis.NewScript(`
` + batchLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'created_at', 'total', 'stride')
if not b[3] then return {} end
local total, stride = tonumber(b[3]), tonumber(b[4]) or 0
local out = {b[1] or '', b[2] or '', b[3], b[4] or '0'}
if stride <= 0 then return out end
local first, last = tonumber(ARGV[3]), math.min(total, tonumber(ARGV[3]) + tonumber(ARGV[4])) - 1
local info = ARGV[5] == 'info'
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
      local ck = ARGV[2] .. cjson.decode(ref)
      if info then
        extra = tostring(redis.call('STRLEN', ck))
      else
        extra = redis.call('GET', ck) or ''
      end
    elseif info then
      local pos = string.find(e, ',"size":', 1, true)
      if pos then e = string.sub(e, 1, pos - 1) .. '}' end
      extra = string.match(r[1], ',"size":(%d+)') or ''
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
`), redis.NewScript(`
local out = {}
local fields = {}
for a = 2, #ARGV do fields[#fields + 1] = ARGV[a] end
if #fields == 0 then return out end
local ents = redis.call('HMGET', KEYS[1], unpack(fields))
for i = 1, #fields do
  local e, res = ents[i], false
  if e then
    local ref = string.match(e, ',"ref":(%b"")')
    if ref then
      res = redis.call('GET', ARGV[1] .. cjson.decode(ref))
    else
      local pos = string.find(e, ',"result":', 1, true)
      if pos then res = string.sub(e, pos + 10, -2) end
    end
  end
  if res then
    out[#out + 1] = '1'
    out[#out + 1] = res
  else
    out[#out + 1] = '0'
    out[#out + 1] = ''
  end
end
return out
`)
}

// legacyChunkInfos is ChunkInfos as it was: one readItemsScript call in
// info mode.
func (s *Store) legacyChunkInfos(ctx context.Context, sc *redis.Script, b *Batch, j int) ([]ChunkInfo, error) {
	first := j * b.Stride
	v, err := sc.RunRO(ctx, s.rdb, []string{s.k.batch(b.ID), s.k.batchReq(b.ID)},
		s.k.batchResBase(b.ID), s.k.cache(""), first, b.Stride, "info").StringSlice()
	if err != nil {
		return nil, err
	}
	if len(v) < 4 {
		return nil, ErrNotFound
	}
	h := readHead{owner: v[0], createdAt: msTime(v[1])}
	h.total, _ = strconv.Atoi(v[2])
	var out []ChunkInfo
	for i := 4; i+5 < len(v); i += 6 {
		r := rawItem{v[i], v[i+1], v[i+2], v[i+3], v[i+4], v[i+5]}
		t := toTask(b.ID, first+len(out), h, r)
		ci := ChunkInfo{Index: first + len(out), CustomID: t.CustomID, Kind: puzzle.Kind(t.Kind), State: t.State}
		if t.ErrCode != "" {
			ci.Error = &apitype.TaskError{Code: t.ErrCode, Message: t.ErrMsg}
		}
		if t.State == apitype.TaskStateCompleted {
			ci.ResultBytes, _ = strconv.ParseInt(r.extra, 10, 64)
		}
		out = append(out, ci)
	}
	return out, nil
}

// legacyChunkResults is ChunkResults as it was: one chunkResultsScript
// call.
func (s *Store) legacyChunkResults(ctx context.Context, sc *redis.Script, b *Batch, j int, idx []int) ([]string, []bool, error) {
	args := []any{s.k.cache("")}
	for _, i := range idx {
		args = append(args, i%b.Stride)
	}
	v, err := sc.RunRO(ctx, s.rdb, []string{s.k.batchRes(b.ID, j)}, args...).StringSlice()
	if err != nil {
		return nil, nil, err
	}
	res, ok := make([]string, len(idx)), make([]bool, len(idx))
	for i := range idx {
		ok[i], res[i] = v[2*i] == "1", v[2*i+1]
	}
	return res, ok, nil
}

// readAll reads every item of b as /results does: a chunk's infos, then
// the results that the infos did not bring. It returns the lines it
// would write (state, size and result of each item).
func readAll(t testing.TB, b *Batch, infos func(j int) ([]ChunkInfo, error), results func(j int, idx []int) ([]string, []bool, error)) []string {
	t.Helper()
	var lines []string
	for j := range b.Chunks() {
		in, err := infos(j)
		if err != nil {
			t.Fatal(err)
		}
		var idx []int
		for _, c := range in {
			if c.State == apitype.TaskStateCompleted && c.Result == "" {
				idx = append(idx, c.Index)
			}
		}
		res, ok, err := results(j, idx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[int]string{}
		for i, x := range idx {
			if !ok[i] {
				t.Fatalf("item %d: result gone", x)
			}
			got[x] = res[i]
		}
		for _, c := range in {
			r := c.Result
			if r == "" {
				r = got[c.Index]
			}
			e, _ := json.Marshal(c.Error)
			cid := ""
			if c.CustomID != nil {
				cid = *c.CustomID
			}
			lines = append(lines, fmt.Sprintf("%d %s %q %s %s %d %s", c.Index, c.Kind, cid, c.State, e, c.ResultBytes, r))
		}
	}
	return lines
}

// redisCPU returns the Redis server's CPU time (user and system) so far,
// and the usec its commands took (INFO commandstats, which counts a
// script's own calls inside its EVALSHA).
func redisCPU(t testing.TB, rdb *redis.Client) (cpu time.Duration, cmdUsec int64) {
	t.Helper()
	ctx := context.Background()
	info, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			cpu += time.Duration(f * float64(time.Second))
		}
		if strings.HasPrefix(l, "cmdstat_") {
			for _, f := range strings.Split(l[strings.Index(l, ":")+1:], ",") {
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					cmdUsec += n
				}
			}
		}
	}
	return cpu, cmdUsec
}

// fillBatch commits a batch of n items and ends them through the worker's
// own calls: 8-puzzles with realistic results, or, when mixed, also
// searches (own units, results stored once in the cache), small and large
// fills (inline), failures, cancels, items left active or pending, and
// custom IDs.
func fillBatch(t testing.TB, s *Store, id string, n, stride int, mixed bool) *Batch {
	t.Helper()
	ctx := context.Background()
	w := s.NewBatchWriter(id, stride)
	for i := range n {
		it := StagedItem{Kind: puzzle.KindSliding, Request: []byte(fmt.Sprintf(`{"board":%d}`, i)), Timeout: time.Second}
		if mixed {
			switch i % 7 {
			case 1:
				it = StagedItem{Kind: puzzle.KindSweep, Request: []byte(`{"w":1}`), Own: true, Timeout: time.Minute}
			case 2:
				it.Kind = puzzle.KindFill
			case 3:
				it = StagedItem{Kind: puzzle.KindFill, Request: []byte(`{"big":1}`), Own: true, Timeout: time.Minute}
			}
			if i%3 == 0 {
				it.CustomID = "c" + strconv.Itoa(i)
			}
		}
		if err := w.Add(ctx, it); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CommitBatch(ctx, w, CommitBatch{ID: id}); err != nil {
		t.Fatal(err)
	}
	b, err := s.GetBatch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	path := strings.Repeat("LURD", 6)
	for j := range b.Chunks() {
		var units []tasks.UnitRef
		units = append(units, tasks.UnitRef{BatchID: id, Unit: tasks.ChunkUnit(j)})
		for i := j * stride; i < min(n, (j+1)*stride); i++ {
			if mixed && (i%7 == 1 || i%7 == 3) {
				units = append(units, tasks.UnitRef{BatchID: id, Unit: tasks.OwnUnit(i)})
			}
		}
		for _, u := range units {
			if mixed && j%5 == 4 {
				continue // left pending
			}
			work, err := s.StartUnit(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			var outs []worker.ItemOutcome
			for _, it := range work.Items {
				i := it.Index
				if mixed && i%11 == 5 {
					continue // left active
				}
				o := worker.ItemOutcome{Index: i, State: apitype.TaskStateCompleted,
					Result: json.RawMessage(fmt.Sprintf(`{"moves":%d,"solvable":true,"path":%q}`, len(path), path))}
				if mixed {
					switch {
					case i%13 == 6:
						o = worker.ItemOutcome{Index: i, State: apitype.TaskStateFailed, Code: apitype.CodeTimeout, Msg: "took \"too\" long"}
					case i%7 == 1:
						o.CacheKey, o.Cached = "k"+strconv.Itoa(i%4), i%2 == 0
					case i%7 == 2:
						o.Result = json.RawMessage(`{"filled":3,"placements":[` + strings.Repeat(`{"piece":[[0,0]],"hole":[[1,1]],"rotation":0},`, 20) + `{"piece":[],"hole":[],"rotation":0}]}`)
					case i%7 == 3:
						o.Result = json.RawMessage(`{"filled":1,"cells":"` + strings.Repeat("x", 300<<10) + `"}`)
					}
				}
				outs = append(outs, o)
			}
			if _, err := s.FinishUnit(ctx, u, "", outs); err != nil {
				t.Fatal(err)
			}
		}
	}
	if mixed {
		if _, err := s.CancelItem(ctx, b, 9); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// TestReadsMatchLegacy: the plain-command read path answers exactly what
// the per-item scripts did, item by item, on a batch with every kind of
// item and state, whole and in pages.
func TestReadsMatchLegacy(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := New(rdb, Options{Prefix: "m:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	ri, cr := legacyScripts()
	same := func(b *Batch) {
		t.Helper()
		old := readAll(t, b, func(j int) ([]ChunkInfo, error) { return s.legacyChunkInfos(ctx, ri, b, j) },
			func(j int, idx []int) ([]string, []bool, error) { return s.legacyChunkResults(ctx, cr, b, j, idx) })
		now := readAll(t, b, func(j int) ([]ChunkInfo, error) { return s.ChunkInfos(ctx, b, j) },
			func(j int, idx []int) ([]string, []bool, error) { return s.ChunkResults(ctx, b, j, idx) })
		if len(old) != b.Total || !reflect.DeepEqual(old, now) {
			for i := range min(len(old), len(now)) {
				if old[i] != now[i] {
					t.Errorf("item %d:\n old %.300s\n new %.300s", i, old[i], now[i])
				}
			}
			t.Fatalf("%d lines before, %d now", len(old), len(now))
		}
	}
	// A chunk of 2048 8-puzzles holds more small entries than one chunk
	// reads whole (smallEntriesBytes): the rest come as heads.
	wide := fillBatch(t, s, fmt.Sprintf("%032x", 3), 2100, 2048, false)
	same(wide)
	if infos, err := s.ChunkInfos(ctx, wide, 0); err != nil || infos[0].Result == "" || infos[2047].Result != "" || infos[2047].ResultBytes == 0 {
		t.Fatalf("a wide chunk: its first result not read with the states, or its last one read: %v", err)
	}
	b := fillBatch(t, s, fmt.Sprintf("%032x", 1), 300, 64, true)
	same(b)
	// The large inline fills were not read with the states.
	infos, err := s.ChunkInfos(ctx, b, 0)
	if err != nil || infos[3].Result != "" || infos[3].ResultBytes < 300<<10 || infos[0].Result == "" {
		t.Fatalf("chunk 0: a large result was read with the states, or a small one was not: %v", err)
	}
	// Pages, against GetItem (still one readItemsScript call each).
	for _, pg := range [][2]int{{0, 300}, {60, 10}, {250, 100}} {
		page, err := s.ItemsPage(ctx, b, pg[0], pg[1])
		if err != nil {
			t.Fatal(err)
		}
		if want := min(pg[1], b.Total-pg[0]); len(page) != want {
			t.Fatalf("page %v: %d items, want %d", pg, len(page), want)
		}
		for i, got := range page {
			want, err := s.GetItem(ctx, b.ID, pg[0]+i)
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("page %v item %d:\n page %+v\n item %+v (%v)", pg, pg[0]+i, got, want, err)
			}
		}
	}
}

// TestReadCostPerItem logs what Redis spends reading the results of
// 10,000 8-puzzles as /results does, the per-item scripts against the
// plain commands, in one run on one server; the plain commands must cost
// it less than half.
func TestReadCostPerItem(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a batch of 10,000 items")
	}
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := New(rdb, Options{Prefix: "c:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	const n = 10000
	b := fillBatch(t, s, fmt.Sprintf("%032x", 2), n, 64, false)
	ri, cr := legacyScripts()
	ri.Load(ctx, rdb)
	cr.Load(ctx, rdb)
	LoadScripts(ctx, rdb)
	measure := func(name string, read func() []string) (float64, []string) {
		rdb.ConfigResetStat(ctx)
		cpu0, _ := redisCPU(t, rdb)
		lines := read()
		cpu1, usec := redisCPU(t, rdb)
		perItem := float64(usec) / n
		t.Logf("%-14s commandstats %6.2f us/item, server CPU %6.2f us/item", name, perItem, float64((cpu1-cpu0).Microseconds())/n)
		return perItem, lines
	}
	legacy, old := measure("legacy scripts", func() []string {
		return readAll(t, b, func(j int) ([]ChunkInfo, error) { return s.legacyChunkInfos(ctx, ri, b, j) },
			func(j int, idx []int) ([]string, []bool, error) { return s.legacyChunkResults(ctx, cr, b, j, idx) })
	})
	plain, now := measure("plain commands", func() []string {
		return readAll(t, b, func(j int) ([]ChunkInfo, error) { return s.ChunkInfos(ctx, b, j) },
			func(j int, idx []int) ([]string, []bool, error) { return s.ChunkResults(ctx, b, j, idx) })
	})
	if !reflect.DeepEqual(old, now) {
		t.Fatal("the two read paths disagree")
	}
	if plain > legacy/2 {
		t.Fatalf("plain commands cost Redis %.2f us an item, not less than half of %.2f", plain, legacy)
	}
}

// TestLargeResultsReadWithoutLua: a large result written as the worker
// writes one over 64 KiB (once, in the cache, the entry referring to it)
// is sized and read with plain commands, never copied into Lua for its
// entry's head, which made forty /results streams of 4 MB fills stall
// Redis for every client; and a failed item's message, however long, is
// kept short, so that an entry is a head unless its result is inline.
func TestLargeResultsReadWithoutLua(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := New(rdb, Options{Prefix: "l:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	id := fmt.Sprintf("%032x", 7)
	w := s.NewBatchWriter(id, 8)
	for range 4 {
		if err := w.Add(ctx, StagedItem{Kind: puzzle.KindFill, Request: []byte(`{"big":1}`), Own: true, Timeout: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CommitBatch(ctx, w, CommitBatch{ID: id}); err != nil {
		t.Fatal(err)
	}
	b, err := s.GetBatch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	big := func(i int) string { return fmt.Sprintf(`{"filled":%d,"cells":"%s"}`, i, strings.Repeat("x", 200<<10)) }
	for i := range 4 {
		u := tasks.UnitRef{BatchID: id, Unit: tasks.OwnUnit(i)}
		if _, err := s.StartUnit(ctx, u); err != nil {
			t.Fatal(err)
		}
		o := worker.ItemOutcome{Index: i, State: apitype.TaskStateCompleted, Result: json.RawMessage(big(i)), CacheKey: "fill" + strconv.Itoa(i)}
		if i == 3 {
			o = worker.ItemOutcome{Index: i, State: apitype.TaskStateFailed, Code: apitype.CodeInvalidPuzzle, Msg: strings.Repeat("é", 100<<10)}
		}
		if _, err := s.FinishUnit(ctx, u, "", []worker.ItemOutcome{o}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		if n := rdb.HStrLen(ctx, "l:batch:"+id+":res:0", strconv.Itoa(i)).Val(); n == 0 || n > 2<<10 {
			t.Errorf("item %d: an entry of %d bytes, want a head", i, n)
		}
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	infos, err := s.ChunkInfos(ctx, b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if stats := rdb.Info(ctx, "commandstats").Val(); strings.Contains(stats, "cmdstat_eval") {
		t.Errorf("ChunkInfos ran a script:\n%s", stats)
	}
	for i, in := range infos[:3] {
		if in.State != apitype.TaskStateCompleted || in.Result != "" || in.ResultBytes != int64(len(big(i))) {
			t.Errorf("item %d: %s, %d result bytes inline, weighed %d; want completed, read later, weighed %d", i, in.State, len(in.Result), in.ResultBytes, len(big(i)))
		}
	}
	res, ok, err := s.ChunkResults(ctx, b, 0, []int{0, 1, 2})
	if err != nil || !ok[0] || !ok[1] || !ok[2] || res[0] != big(0) || res[2] != big(2) {
		t.Fatalf("ChunkResults of the large results: %v %v", ok, err)
	}
	f := infos[3]
	if f.State != apitype.TaskStateFailed || f.Error == nil || f.Error.Code != apitype.CodeInvalidPuzzle ||
		len(f.Error.Message) > maxErrorMessage || !strings.HasSuffix(f.Error.Message, "…") || !utf8.ValidString(f.Error.Message) {
		t.Errorf("the failed item with a long message: %+v %+v", f, f.Error)
	}
}
