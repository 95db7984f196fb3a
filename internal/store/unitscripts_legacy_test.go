package store

// The unit scripts against the per-item ones they replaced at e422c62
// (legacyUnitScripts, kept here as they were, with the Go that called
// them): the same answers, the same keys byte for byte (entries, markers,
// counts, quota, cache entries) and the same events, step by step through
// the paths of a chunk's start and finish that the fast paths must not
// change. After every step the new store's counts and quota are also
// checked against its entries and markers (checkUnitInvariants), so the
// test does not only hold the new code to the old one.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// legacyEntryLua is batchLua's entry as it was at e422c62^, the reference
// for the bytes of an ended entry: the legacy finish defines it after
// batchLua, so that a later change to batchLua's entry cannot move the
// reference along with the code it checks.
const legacyEntryLua = `
local function entry(st, started, attempts, now, head, result)
  local e = '{"state":"' .. st .. '"'
  if started then e = e .. ',"started_at":' .. started end
  e = e .. ',"completed_at":' .. now .. ',"attempts":' .. attempts
  if head ~= '' then e = e .. ',' .. head end
  if result ~= '' then e = e .. ',"size":' .. #result .. ',"result":' .. result end
  return e .. '}'
end
`

// legacyUnitScripts returns startUnitScript and finishUnitScript as they
// were before e422c62 (per item: an HMGET of every offset, the lines split
// in Lua, each entry built whole by entry). A function, not package
// variables, so that allScripts need not list them.
func legacyUnitScripts() (start, finish *redis.Script) {
	return redis.NewScript(batchLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'stride', 'total', 'expires_at', 'canceled_at')
if not b[3] then return {} end
if b[5] then return {b[1] or ''} end
local owner, stride, total = b[1] or '', tonumber(b[2]), tonumber(b[3])
local chunk, n = ARGV[2] == 'c', tonumber(ARGV[3])
local j = n
if not chunk then j = math.floor(n / stride) end
local rk = ARGV[4] .. j
local m = redis.call('HGET', KEYS[2], 'm' .. j)
if not m then return {} end
local offs = {}
if chunk then
  for k = 1, #m do
    if not is_own(string.sub(m, k, k)) then offs[#offs + 1] = k - 1 end
  end
else
  local k = n - j * stride
  if n >= total or k < 0 or k >= #m or not is_own(string.sub(m, k + 1, k + 1)) then return {} end
  offs[1] = k
end
if #offs == 0 then return {owner} end
local ents = redis.call('HMGET', rk, unpack(offs))
local run = {}
for i = 1, #offs do
  if not ents[i] then run[#run + 1] = offs[i] end
end
if #run == 0 then return {owner} end
local f = marker_field(string.sub(m, run[1] + 1, run[1] + 1), run[1])
local mv = redis.call('HGET', rk, f)
if not mv then
  redis.call('HSET', rk, f, '1 ' .. ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'pending', -#run)
  redis.call('HINCRBY', KEYS[1], 'active', #run)
else
  local a, s = parse_marker(mv)
  redis.call('HSET', rk, f, (a + 1) .. ' ' .. s)
end
redis.call('PEXPIREAT', rk, b[4])
local out = {owner}
if chunk then
  local lines = lines_of(redis.call('HGET', KEYS[2], tostring(j)) or '')
  for i = 1, #run do
    out[#out + 1] = tostring(j * stride + run[i])
    out[#out + 1] = lines[run[i] + 1] or ''
  end
else
  out[2] = tostring(n)
  out[3] = redis.call('HGET', KEYS[2], 'x' .. n) or ''
end
return out
`), redis.NewScript(quotaLua + batchLua + legacyEntryLua + `
local b = redis.call('HMGET', KEYS[1], 'owner', 'stride', 'total', 'expires_at')
if not b[3] then return 0 end
local owner, stride, total, exp = b[1] or '', tonumber(b[2]), tonumber(b[3]), tonumber(b[4])
local chunk, n = ARGV[8] == 'c', tonumber(ARGV[9])
local j = n
if not chunk then j = math.floor(n / stride) end
local rk = ARGV[10] .. j
local m = redis.call('HGET', KEYS[2], 'm' .. j)
if not m then return 0 end
local markers, delta, ended = {}, {}, 0
local rttl = tonumber(ARGV[11])
local nout = #KEYS - 2
local fields = {}
for i = 1, nout do fields[i] = tonumber(ARGV[12 + 4 * (i - 1)]) - j * stride end
local have = redis.call('HMGET', rk, unpack(fields))
local hs, hd, seen = {}, {}, {}
for i = 1, nout do
  local a = 12 + 4 * (i - 1)
  local idx = tonumber(ARGV[a])
  local k = fields[i]
  local ok = idx < total and k >= 0 and k < #m and not have[i] and not seen[k]
  local kb = ok and string.sub(m, k + 1, k + 1) or ''
  if ok then
    if chunk then ok = not is_own(kb) else ok = idx == n and is_own(kb) end
  end
  if ok then
    seen[k] = true
    local f = marker_field(kb, k)
    local mv = markers[f]
    if mv == nil then
      mv = redis.call('HGET', rk, f)
      markers[f] = mv
    end
    local attempts, started, prev = 0, nil, 'pending'
    if mv then
      attempts, started = parse_marker(mv)
      prev = 'active'
    end
    local st, res = ARGV[a + 1], ARGV[a + 3]
    local ck = KEYS[2 + i]
    if ck ~= KEYS[1] and res ~= '' then
      redis.call('SET', ck, res, 'NX', 'PX', rttl)
      redis.call('PEXPIREAT', ck, math.max(exp, clock() + rttl), 'GT')
      res = ''
    end
    hs[#hs + 1] = k
    hs[#hs + 1] = entry(st, started, attempts, ARGV[5], ARGV[a + 2], res)
    hd[#hd + 1] = 'p' .. k
    delta[prev] = (delta[prev] or 0) - 1
    delta[st] = (delta[st] or 0) + 1
    ended = ended + 1
  end
end
if ended > 0 then
  redis.call('HSET', rk, unpack(hs))
  redis.call('HDEL', rk, unpack(hd))
  redis.call('PEXPIREAT', rk, exp)
  settle(KEYS[1], ARGV[7], owner, {ARGV[1], ARGV[2], ARGV[3], ARGV[4]}, j, delta, ended, ARGV[6], ARGV[5], 'c:' .. ARGV[7] .. ':', 'b:' .. ARGV[7])
end
return ended
`)
}

// legacyStartUnit is StartUnit as it was before e422c62.
func (s *Store) legacyStartUnit(ctx context.Context, sc *redis.Script, ref tasks.UnitRef) (*worker.UnitWork, error) {
	_, n, err := tasks.ParseUnit(ref.Unit)
	if err != nil {
		return nil, err
	}
	v, err := sc.Run(ctx, s.rdb, []string{s.k.batch(ref.BatchID), s.k.batchReq(ref.BatchID)},
		ms(s.now()), ref.Unit[:1], n, s.k.batchResBase(ref.BatchID)).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("legacy start unit %s: %w", ref.TaskID(), err)
	}
	w := &worker.UnitWork{}
	if len(v) == 0 {
		return w, nil
	}
	w.Owner = v[0]
	for i := 1; i+1 < len(v); i += 2 {
		idx, err := strconv.Atoi(v[i])
		if err != nil {
			return nil, fmt.Errorf("legacy start unit %s: bad index %q", ref.TaskID(), v[i])
		}
		w.Items = append(w.Items, worker.UnitItem{Index: idx, Request: []byte(v[i+1])})
	}
	return w, nil
}

// legacyFinishUnit is FinishUnit as it was before e422c62.
func (s *Store) legacyFinishUnit(ctx context.Context, sc *redis.Script, ref tasks.UnitRef, outs []worker.ItemOutcome) (int, error) {
	if len(outs) > maxOutcomesPerCall {
		n, err := s.legacyFinishUnit(ctx, sc, ref, outs[:maxOutcomesPerCall])
		if err != nil {
			return n, err
		}
		m, err := s.legacyFinishUnit(ctx, sc, ref, outs[maxOutcomesPerCall:])
		return n + m, err
	}
	if len(outs) == 0 {
		return 0, nil
	}
	_, n, err := tasks.ParseUnit(ref.Unit)
	if err != nil {
		return 0, err
	}
	join := func(a, b string) string {
		if a == "" {
			return b
		}
		return a + "," + b
	}
	bk := s.k.batch(ref.BatchID)
	keys := []string{bk, s.k.batchReq(ref.BatchID)}
	args := append([]any{}, s.k.ownerAffixes()...)
	args = append(args, ms(s.now()), s.k.events(), ref.BatchID, ref.Unit[:1], n,
		s.k.batchResBase(ref.BatchID), s.resultTTL.Milliseconds())
	for _, o := range outs {
		ck, head := bk, ""
		var result []byte
		switch o.State {
		case apitype.TaskStateCompleted:
			result = o.Result
			if o.CacheKey != "" && len(o.Result) > 0 {
				ck = s.k.cache(o.CacheKey)
				r, _ := json.Marshal(o.CacheKey)
				head = `"ref":` + string(r)
			}
			if o.Cached {
				head = join(head, `"cached":true`)
			}
		case apitype.TaskStateFailed:
			e, _ := json.Marshal(apitype.TaskError{Code: o.Code, Message: o.Msg})
			head = `"error":` + string(e)
		default:
			return 0, fmt.Errorf("legacy finish unit %s: item %d: state %q is not an outcome", ref.TaskID(), o.Index, o.State)
		}
		keys = append(keys, ck)
		args = append(args, o.Index, string(o.State), head, result)
	}
	return sc.Run(ctx, s.rdb, keys, args...).Int()
}

// unitSide is one of the two stores the test drives alike: its start and
// finish (the current ones, or the legacy ones), and the events it
// published.
type unitSide struct {
	name   string
	s      *Store
	start  func(context.Context, tasks.UnitRef) (*worker.UnitWork, error)
	finish func(context.Context, tasks.UnitRef, []worker.ItemOutcome) (int, error)
	events *redis.PubSub
}

// drainEvents returns the messages published on the side's events
// channel since the last call: it publishes a mark of its own and reads
// up to it (pub/sub delivers in order), so no wait is guessed.
func (u *unitSide) drainEvents(t *testing.T, ctx context.Context, step int) []string {
	t.Helper()
	mark := "|step " + strconv.Itoa(step)
	if err := u.s.rdb.Publish(ctx, u.s.k.events(), mark).Err(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		m, err := u.events.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("%s: events: %v", u.name, err)
		}
		if m.Payload == mark {
			return got
		}
		got = append(got, m.Payload)
	}
}

// unitTwins are two stores on one Redis driven alike, one with the
// legacy unit scripts (old) and one with the current ones (cur), each
// holding the same batch id of owner; clk is the time both read.
type unitTwins struct {
	rdb       redis.UniversalClient
	id, owner string
	clk       time.Time
	old, cur  *unitSide
	fast      fastFinishes         // the current side's finishChunkScript calls
	exps      map[*unitSide]string // each batch's expires_at
	steps     int                  // steps run so far, to number the next
}

// fastFinishes is a go-redis hook that counts finishChunkScript's
// answers: the finishes it took (an answer >= 0) and the ones it
// declined (-1) for finishUnitScript, so that a test can show that both
// paths ran.
type fastFinishes struct{ taken, declined int }

func (h *fastFinishes) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *fastFinishes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); len(a) > 1 && a[1] == finishChunkScript.Hash() {
			if n, e := cmd.(*redis.Cmd).Int(); e == nil && n < 0 {
				h.declined++
			} else if e == nil {
				h.taken++
			}
		}
		return err
	}
}
func (h *fastFinishes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// unitStep is one step of a twins' run: do is done on each side, whose
// answers must be the same; pre, when set, must hold of the current
// store before it (it says which path of a script the step is for).
type unitStep struct {
	name string
	pre  func() bool
	do   func(*unitSide) (string, error)
}

// newUnitTwins commits on both sides a batch of total items cut into
// chunks of stride, own where isOwn says, with a custom ID on every
// third item.
func newUnitTwins(t *testing.T, stride, total int, isOwn func(int) bool) *unitTwins {
	t.Helper()
	ctx := context.Background()
	tw := &unitTwins{rdb: redistest.Start(t).Client(t), id: "0123456789abcdef0123456789abcdef", owner: "alice",
		clk: time.UnixMilli(1764633600000), exps: map[*unitSide]string{}}
	tw.rdb.AddHook(&tw.fast)
	// Cached first, so that fastFinishes sees each call as one EVALSHA
	// by its digest rather than a NOSCRIPT and an EVAL of its source.
	if err := LoadScripts(ctx, tw.rdb); err != nil {
		t.Fatal(err)
	}
	lstart, lfinish := legacyUnitScripts()
	side := func(name string, legacy bool) *unitSide {
		s := New(tw.rdb, Options{Prefix: name + ":", TaskTTL: time.Hour, ResultTTL: time.Hour})
		s.now = func() time.Time { return tw.clk }
		// The current side hands each unit's first mark to its next
		// finish, as a worker's delivery does: a finish after a
		// redelivery or a cancel then tries, and declines, the fast path.
		marks := map[string]string{}
		u := &unitSide{name: name, s: s,
			start: func(ctx context.Context, r tasks.UnitRef) (*worker.UnitWork, error) {
				w, err := s.StartUnit(ctx, r)
				if err == nil && marks[r.Unit] == "" {
					marks[r.Unit] = w.Mark
				}
				return w, err
			},
			finish: func(ctx context.Context, r tasks.UnitRef, o []worker.ItemOutcome) (int, error) {
				mark := marks[r.Unit]
				delete(marks, r.Unit)
				return s.FinishUnit(ctx, r, mark, o)
			}}
		if legacy {
			u.start = func(ctx context.Context, r tasks.UnitRef) (*worker.UnitWork, error) {
				return s.legacyStartUnit(ctx, lstart, r)
			}
			u.finish = func(ctx context.Context, r tasks.UnitRef, o []worker.ItemOutcome) (int, error) {
				return s.legacyFinishUnit(ctx, lfinish, r, o)
			}
		}
		u.events = tw.rdb.Subscribe(ctx, s.k.events())
		if _, err := u.events.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { u.events.Close() })
		return u
	}
	tw.old, tw.cur = side("old", true), side("new", false)
	for _, u := range []*unitSide{tw.old, tw.cur} {
		w := u.s.NewBatchWriter(tw.id, stride)
		for i := range total {
			it := StagedItem{Kind: puzzle.KindSliding, Request: []byte(fmt.Sprintf(`{"board":[%d,1,2]}`, i)), Timeout: time.Second}
			if isOwn(i) {
				it = StagedItem{Kind: puzzle.KindSweep, Request: []byte(fmt.Sprintf(`{"w":%d}`, i)), Own: true, Timeout: time.Minute}
			}
			if i%3 == 0 {
				it.CustomID = "c" + strconv.Itoa(i)
			}
			if err := w.Add(ctx, it); err != nil {
				t.Fatal(err)
			}
		}
		if err := u.s.CommitBatch(ctx, w, CommitBatch{ID: tw.id, Owner: tw.owner}); err != nil {
			t.Fatal(err)
		}
		tw.exps[u] = tw.rdb.HGet(ctx, u.s.k.batch(tw.id), "expires_at").Val()
		u.drainEvents(t, ctx, 0)
	}
	return tw
}

// chunk is the unit of chunk j's cheap items.
func (tw *unitTwins) chunk(j int) tasks.UnitRef {
	return tasks.UnitRef{BatchID: tw.id, Unit: tasks.ChunkUnit(j)}
}

// own is item i's own unit.
func (tw *unitTwins) own(i int) tasks.UnitRef {
	return tasks.UnitRef{BatchID: tw.id, Unit: tasks.OwnUnit(i)}
}

// exists says whether chunk j's res hash exists in the current store:
// which path of startUnitScript a start of the chunk takes.
func (tw *unitTwins) exists(j int) bool {
	return tw.rdb.Exists(context.Background(), tw.cur.s.k.batchRes(tw.id, j)).Val() == 1
}

// start starts unit r and answers its owner and items.
func (tw *unitTwins) start(r tasks.UnitRef) func(*unitSide) (string, error) {
	return func(u *unitSide) (string, error) {
		w, err := u.start(context.Background(), r)
		if err != nil {
			return "", err
		}
		var b strings.Builder
		fmt.Fprintf(&b, "owner %q:", w.Owner)
		for _, it := range w.Items {
			fmt.Fprintf(&b, " %d=%s", it.Index, it.Request)
		}
		return b.String(), nil
	}
}

// finish finishes unit r with outs and answers how many items ended.
func (tw *unitTwins) finish(r tasks.UnitRef, outs ...worker.ItemOutcome) func(*unitSide) (string, error) {
	return func(u *unitSide) (string, error) {
		n, err := u.finish(context.Background(), r, outs)
		return fmt.Sprintf("ended %d", n), err
	}
}

// cancel cancels items idx one at a time and answers their states before.
func (tw *unitTwins) cancel(idx ...int) func(*unitSide) (string, error) {
	return func(u *unitSide) (string, error) {
		ctx := context.Background()
		b, err := u.s.GetBatch(ctx, tw.id)
		if err != nil {
			return "", err
		}
		var out []string
		for _, i := range idx {
			st, err := u.s.CancelItem(ctx, b, i)
			if err != nil {
				return "", err
			}
			out = append(out, string(st))
		}
		return strings.Join(out, ","), nil
	}
}

// inTurn does steps one after the other, joining their answers.
func inTurn(steps ...func(*unitSide) (string, error)) func(*unitSide) (string, error) {
	return func(u *unitSide) (string, error) {
		var out []string
		for _, st := range steps {
			a, err := st(u)
			if err != nil {
				return "", err
			}
			out = append(out, a)
		}
		return strings.Join(out, " / "), nil
	}
}

// run does steps on both sides, a second apart, numbered after those of
// earlier calls, and after each compares their answers, events and keys,
// and checks the current store's counts and quota against its entries
// and markers.
// cancelStep is a batch cancel's answer as a step's: a batch whose items
// all ended before it is an answer too, the same for both stores.
func cancelStep(n int, err error) (string, error) {
	if errors.Is(err, ErrBatchEnded) {
		return "ended before the cancel", nil
	}
	return fmt.Sprintf("canceled %d", n), err
}

func (tw *unitTwins) run(t *testing.T, steps []unitStep) {
	t.Helper()
	ctx := context.Background()
	for _, st := range steps {
		tw.steps++
		n := tw.steps - 1
		tw.clk = tw.clk.Add(time.Second)
		if st.pre != nil && !st.pre() {
			t.Fatalf("step %d (%s): the new store is not in the state the step is for", n+1, st.name)
		}
		got := map[*unitSide]string{}
		for _, u := range []*unitSide{tw.old, tw.cur} {
			a, err := st.do(u)
			if err != nil {
				t.Fatalf("step %d (%s), %s: %v", n+1, st.name, u.name, err)
			}
			got[u] = a
		}
		if got[tw.old] != got[tw.cur] {
			t.Errorf("step %d (%s): answers differ:\n old %.2000s\n new %.2000s", n+1, st.name, got[tw.old], got[tw.cur])
		}
		if eo, en := tw.old.drainEvents(t, ctx, n+1), tw.cur.drainEvents(t, ctx, n+1); !reflect.DeepEqual(eo, en) {
			t.Errorf("step %d (%s): events differ:\n old %q\n new %q", n+1, st.name, eo, en)
		}
		do, dn := dumpKeys(t, ctx, tw.old.s, tw.exps[tw.old]), dumpKeys(t, ctx, tw.cur.s, tw.exps[tw.cur])
		if !reflect.DeepEqual(do, dn) {
			for _, l := range do {
				if !slices.Contains(dn, l) {
					t.Errorf("step %d (%s): old only: %.2000s", n+1, st.name, l)
				}
			}
			for _, l := range dn {
				if !slices.Contains(do, l) {
					t.Errorf("step %d (%s): new only: %.2000s", n+1, st.name, l)
				}
			}
		}
		checkUnitInvariants(t, ctx, tw.cur.s, tw.id, tw.owner)
		if t.Failed() {
			t.FailNow()
		}
	}
}

// outDone is item i completed with a small inline result.
func outDone(i int) worker.ItemOutcome {
	return worker.ItemOutcome{Index: i, State: apitype.TaskStateCompleted, Result: json.RawMessage(fmt.Sprintf(`{"moves":%d,"path":"LURD"}`, i))}
}

// outFailed is item i failed, with a message encoding/json escapes.
func outFailed(i int) worker.ItemOutcome {
	return worker.ItemOutcome{Index: i, State: apitype.TaskStateFailed, Code: apitype.CodeTimeout, Msg: "took \"too\" <long> é\u2028\x01"}
}

// outWith is o changed by f.
func outWith(o worker.ItemOutcome, f func(*worker.ItemOutcome)) worker.ItemOutcome { f(&o); return o }

// TestUnitScriptsMatchLegacy holds the unit scripts to the legacy ones
// through a batch whose chunks have own items among their cheap ones (one
// of them all own, the last one short): a chunk started fresh (the fast
// path) and after one of its own items started, a redelivery, items
// canceled meanwhile, progress, a yield, finishes of every outcome
// (inline, stored once, cached, failed with a message to escape,
// duplicates, indices not the unit's), a finish without a start, a
// canceled batch, a retry (which empties a chunk's res hash, so its next
// start is fresh again), and a batch gone.
func TestUnitScriptsMatchLegacy(t *testing.T) {
	const stride, total = 8, 29
	// Chunk 0: own items at 2 and 5; chunk 1: at 10 and 13; chunk 2: all
	// own; chunk 3 (5 items, the last): at 26.
	tw := newUnitTwins(t, stride, total, func(i int) bool { return i%stride == 2 || i%stride == 5 && i < 16 || i/stride == 2 })
	ctx := context.Background()
	chunk, own, exists := tw.chunk, tw.own, tw.exists
	tw.run(t, []unitStep{
		{"an own item of chunk 0 starts", nil, tw.start(own(2))},
		{"chunk 0 starts after its own item did", func() bool { return exists(0) }, tw.start(chunk(0))},
		{"chunk 1 starts fresh", func() bool { return !exists(1) }, tw.start(chunk(1))},
		{"chunk 1 is delivered again", nil, tw.start(chunk(1))},
		{"progress on an own item and a cheap one", nil, func(u *unitSide) (string, error) {
			if err := u.s.setItemProgress(ctx, tw.id, 10, `{"expanded":7}`); err != nil {
				return "", err
			}
			return "", u.s.setItemProgress(ctx, tw.id, 11, `{"expanded":1}`)
		}},
		{"an active cheap item and a pending own one are canceled", nil, tw.cancel(9, 13)},
		{"chunk 1 finishes: every outcome, duplicates and indices not its own", nil, tw.finish(chunk(1),
			outDone(8), outFailed(8), outDone(9),
			outWith(outDone(11), func(o *worker.ItemOutcome) { o.CacheKey = "kA" }),
			outWith(outDone(12), func(o *worker.ItemOutcome) { o.CacheKey, o.Cached = "kA", true }),
			outFailed(14),
			outWith(outDone(15), func(o *worker.ItemOutcome) { o.CacheKey, o.Result = "kB", nil }),
			outDone(3), outDone(10), outDone(16))},
		{"chunk 1 is delivered after it finished", nil, tw.start(chunk(1))},
		{"the all-own chunk 2 starts fresh", func() bool { return !exists(2) }, tw.start(chunk(2))},
		{"the all-own chunk 2 finishes an own item", nil, tw.finish(chunk(2), outDone(16))},
		{"own item 10 starts, with progress", nil, tw.start(own(10))},
		{"own item 10 finishes, stored once, and another index", nil, tw.finish(own(10),
			outWith(outDone(10), func(o *worker.ItemOutcome) { o.CacheKey = `k"C<` }), outDone(11))},
		{"own item 17 finishes without a start", nil, tw.finish(own(17), outFailed(17))},
		{"own item 5 starts and yields", nil, inTurn(tw.start(own(5)), func(u *unitSide) (string, error) {
			return "", u.s.YieldUnit(ctx, own(5))
		})},
		{"own item 5 starts twice and yields once", nil, inTurn(tw.start(own(5)), tw.start(own(5)), func(u *unitSide) (string, error) {
			return "", u.s.YieldUnit(ctx, own(5))
		})},
		{"own item 5 finishes cached, inline", nil, tw.finish(own(5),
			outWith(outDone(5), func(o *worker.ItemOutcome) { o.Cached = true }))},
		{"chunk 0 and own item 2 finish", nil, inTurn(
			tw.finish(chunk(0), outDone(0), outFailed(1), outDone(3), outDone(4), outDone(6), outDone(7)),
			tw.finish(own(2), outFailed(2)))},
		{"the short chunk 3 finishes without a start", func() bool { return !exists(3) }, tw.finish(chunk(3),
			outFailed(24), outFailed(25), outFailed(27), outFailed(28), outFailed(29))},
		{"the short chunk 3 starts after it finished", nil, tw.start(chunk(3))},
		{"own item 26 runs and fails", nil, inTurn(tw.start(own(26)), tw.finish(own(26), outFailed(26)))},
		{"the batch is canceled", nil, func(u *unitSide) (string, error) {
			return cancelStep(u.s.CancelBatch(ctx, tw.id, tw.owner))
		}},
		{"a chunk of the canceled batch starts", nil, tw.start(chunk(0))},
		{"the batch is retried", nil, func(u *unitSide) (string, error) {
			b, err := u.s.GetBatch(ctx, tw.id)
			if err != nil {
				return "", err
			}
			n, err := u.s.RetryBatch(ctx, b, 0, func(puzzle.Kind, bool) time.Duration { return time.Minute })
			return fmt.Sprintf("retried %d", n), err
		}},
		{"the retried short chunk 3 starts fresh", func() bool { return !exists(3) }, tw.start(chunk(3))},
		{"the retried chunk 1 starts", func() bool { return exists(1) }, tw.start(chunk(1))},
		{"the retried chunks finish", nil, inTurn(
			tw.finish(chunk(3), outDone(24), outDone(25), outDone(27), outDone(28)),
			tw.finish(chunk(1), outDone(9), outDone(14)))},
		{"the batch is gone", nil, inTurn(func(u *unitSide) (string, error) {
			return "", tw.rdb.Del(ctx, u.s.k.batch(tw.id)).Err()
		}, tw.start(chunk(0)), tw.finish(chunk(0), outDone(1)))},
	})
	// The retried chunk 3's finish: fresh again after the retry.
	if tw.fast != (fastFinishes{taken: 1}) {
		t.Errorf("finishChunkScript took %d finishes and declined %d, want 1 and 0", tw.fast.taken, tw.fast.declined)
	}
}

// TestUnitScriptsMatchLegacyWideChunk: the same through chunks of the
// largest stride, where a chunk's finish is cut into several script
// calls (maxOutcomesPerCall) and the fast start returns thousands of
// lines: a fresh start of a chunk with own items, a finish of every item
// in one FinishUnit, half of a redelivered chunk finished and the rest
// started again, and the short last chunk.
func TestUnitScriptsMatchLegacyWideChunk(t *testing.T) {
	const stride, total = maxStride, 2*maxStride + 77
	tw := newUnitTwins(t, stride, total, func(i int) bool { return i%97 == 5 })
	cheap := func(j, from, to int, out func(int) worker.ItemOutcome) []worker.ItemOutcome {
		var outs []worker.ItemOutcome
		for i := j*stride + from; i < min(total, j*stride+to); i++ {
			if i%97 != 5 {
				outs = append(outs, out(i))
			}
		}
		return outs
	}
	mixed := func(i int) worker.ItemOutcome {
		switch i % 5 {
		case 1:
			return outFailed(i)
		case 2:
			return outWith(outDone(i), func(o *worker.ItemOutcome) { o.CacheKey, o.Cached = "w"+strconv.Itoa(i%3), i%2 == 0 })
		}
		return outDone(i)
	}
	// plain outcomes store nothing in the cache, which finishChunkScript
	// is for.
	plain := func(i int) worker.ItemOutcome {
		if i%5 == 1 {
			return outFailed(i)
		}
		return outDone(i)
	}
	chunk, exists := tw.chunk, tw.exists
	tw.run(t, []unitStep{
		{"chunk 0 starts fresh", func() bool { return !exists(0) }, tw.start(chunk(0))},
		// The first maxOutcomesPerCall by finishChunkScript, the rest by
		// finishUnitScript.
		{"chunk 0 finishes every item in one call", nil, tw.finish(chunk(0), cheap(0, 0, stride, plain)...)},
		{"chunk 1 starts fresh and again", func() bool { return !exists(1) }, inTurn(tw.start(chunk(1)), tw.start(chunk(1)))},
		// The first delivery's finish: declined, the marker counts two.
		{"chunk 1 finishes its first 1500 items", nil, tw.finish(chunk(1), cheap(1, 0, 1500, plain)...)},
		{"chunk 1 is delivered again", nil, tw.start(chunk(1))},
		{"chunk 1 finishes the rest, and all again", nil, tw.finish(chunk(1), cheap(1, 0, stride, outDone)...)},
		{"the short last chunk starts fresh", func() bool { return !exists(2) }, tw.start(chunk(2))},
		{"the short last chunk finishes", nil, tw.finish(chunk(2), cheap(2, 0, stride, mixed)...)},
	})
	if tw.fast != (fastFinishes{taken: 1, declined: 1}) {
		t.Errorf("finishChunkScript took %d finishes and declined %d, want 1 and 1", tw.fast.taken, tw.fast.declined)
	}
}

// TestUnitScriptsMatchLegacyRandomRuns: the same through seeded random
// sequences of starts, redeliveries, finishes (of any subset of a unit's
// items, with duplicates, other units' indices and every kind of
// outcome), cancels of items and of the batch, yields, progress and
// retries, in orders no scripted test thinks of. The sequence depends on
// the seed alone, so a failure names its seed and step and replays.
func TestUnitScriptsMatchLegacyRandomRuns(t *testing.T) {
	const stride, total = 2, 23
	isOwn := func(i int) bool { return i%5 == 1 }
	var owns []int
	for i := range total {
		if isOwn(i) {
			owns = append(owns, i)
		}
	}
	var fast fastFinishes
	for _, seed := range []uint64{1, 2, 3, 4} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			tw := newUnitTwins(t, stride, total, isOwn)
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(seed, 0))
			outcome := func(i int) worker.ItemOutcome {
				switch rng.IntN(7) {
				case 0, 6:
					return outFailed(i)
				case 1:
					return outWith(outDone(i), func(o *worker.ItemOutcome) { o.CacheKey = "r" + strconv.Itoa(rng.IntN(3)) })
				case 2:
					return outWith(outDone(i), func(o *worker.ItemOutcome) {
						o.CacheKey, o.Cached = "r"+strconv.Itoa(rng.IntN(3)), true
					})
				case 3:
					return outWith(outDone(i), func(o *worker.ItemOutcome) { o.Cached = true })
				}
				return outDone(i)
			}
			const chunks = (total + stride - 1) / stride
			for range 100 {
				j, i, own := rng.IntN(chunks), rng.IntN(total), owns[rng.IntN(len(owns))]
				var st unitStep
				switch r := rng.IntN(100); {
				case r < 10:
					// A chunk whose res hash does not exist, if any: the
					// fast path, which few random orders would reach.
					var fresh []int
					for c := range chunks {
						if !tw.exists(c) {
							fresh = append(fresh, c)
						}
					}
					if len(fresh) > 0 {
						j = fresh[rng.IntN(len(fresh))]
					}
					st = unitStep{fmt.Sprintf("start c%d", j), nil, tw.start(tw.chunk(j))}
				case r < 25:
					st = unitStep{fmt.Sprintf("start c%d", j), nil, tw.start(tw.chunk(j))}
				case r < 36:
					st = unitStep{fmt.Sprintf("start x%d", own), nil, tw.start(tw.own(own))}
				case r < 60:
					var outs []worker.ItemOutcome
					for x := j * stride; x < min(total, (j+1)*stride); x++ {
						if rng.IntN(3) > 0 {
							outs = append(outs, outcome(x))
						}
					}
					if rng.IntN(4) == 0 {
						outs = append(outs, outcome(i)) // perhaps another chunk's, or a duplicate
					}
					st = unitStep{fmt.Sprintf("finish c%d with %d outcomes", j, len(outs)), nil, tw.finish(tw.chunk(j), outs...)}
				case r < 72:
					outs := []worker.ItemOutcome{outcome(own)}
					if rng.IntN(4) == 0 {
						outs = append(outs, outcome(i))
					}
					st = unitStep{fmt.Sprintf("finish x%d", own), nil, tw.finish(tw.own(own), outs...)}
				case r < 81:
					st = unitStep{fmt.Sprintf("cancel %d", i), nil, tw.cancel(i)}
				case r < 87:
					st = unitStep{fmt.Sprintf("yield x%d", own), nil, func(u *unitSide) (string, error) {
						return "", u.s.YieldUnit(ctx, tw.own(own))
					}}
				case r < 90:
					st = unitStep{fmt.Sprintf("progress %d", i), nil, func(u *unitSide) (string, error) {
						return "", u.s.setItemProgress(ctx, tw.id, i, `{"expanded":3}`)
					}}
				case r < 98:
					st = unitStep{"retry", nil, func(u *unitSide) (string, error) {
						b, err := u.s.GetBatch(ctx, tw.id)
						if err != nil {
							return "", err
						}
						n, err := u.s.RetryBatch(ctx, b, 0, func(puzzle.Kind, bool) time.Duration { return time.Minute })
						return fmt.Sprintf("retried %d", n), err
					}}
				default:
					st = unitStep{"cancel the batch", nil, func(u *unitSide) (string, error) {
						return cancelStep(u.s.CancelBatch(ctx, tw.id, tw.owner))
					}}
				}
				// One step at a time: the next is chosen knowing the
				// state this one leaves (the seed still decides all).
				tw.run(t, []unitStep{st})
			}
			fast.taken += tw.fast.taken
			fast.declined += tw.fast.declined
		})
	}
	// The seeds decide these too: both of finishChunkScript's answers
	// were compared with the legacy scripts.
	if fast.taken == 0 || fast.declined == 0 {
		t.Errorf("finishChunkScript took %d finishes and declined %d over the seeds, want some of each", fast.taken, fast.declined)
	}
	t.Logf("finishChunkScript took %d finishes and declined %d over the seeds", fast.taken, fast.declined)
}

// TestUnitScriptCostPerItem measures what the fast paths save Redis, the
// one shared process: two batches of 8,192 8-puzzles in 512-item chunks
// (CHUNK_SIZE's default) on one server, one started and finished by the
// legacy scripts and one by the current ones, each phase's EVALSHA usec
// (INFO commandstats) per item logged as FIGURES. The figures are read, not asserted (the
// machine is shared); what is asserted is that both sides ran and ended
// every item.
func TestUnitScriptCostPerItem(t *testing.T) {
	if testing.Short() {
		t.Skip("stages 16,384 items")
	}
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	s := New(rdb, Options{Prefix: "cost:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	LoadScripts(ctx, rdb)
	oldStart, oldFinish := legacyUnitScripts()
	oldStart.Load(ctx, rdb)
	oldFinish.Load(ctx, rdb)
	const n, stride = 8192, 512
	result := json.RawMessage(`{"solvable":true,"moves":22,"path":"LURDLURDLURDLURDLURDLU"}`)
	evalUsec := func() int64 {
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(info, "\r\n") {
			if rest, ok := strings.CutPrefix(l, "cmdstat_evalsha:"); ok {
				_, v, _ := strings.Cut(rest, "usec=")
				v, _, _ = strings.Cut(v, ",")
				u, _ := strconv.ParseInt(v, 10, 64)
				return u
			}
		}
		return 0
	}
	rng := rand.New(rand.NewPCG(7, 11))
	run := func(name string, start func(tasks.UnitRef) (*worker.UnitWork, error),
		finish func(tasks.UnitRef, []worker.ItemOutcome) (int, error)) {
		id := fmt.Sprintf("%032x", rng.Uint64())
		w := s.NewBatchWriter(id, stride)
		for range n {
			p := rng.Perm(9)
			req := fmt.Sprintf(`{"board":[[%d,%d,%d],[%d,%d,%d],[%d,%d,%d]]}`, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8])
			if err := w.Add(ctx, StagedItem{Kind: puzzle.KindSliding, Request: []byte(req), Timeout: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CommitBatch(ctx, w, CommitBatch{ID: id}); err != nil {
			t.Fatal(err)
		}
		var works []*worker.UnitWork
		u0 := evalUsec()
		for j := range n / stride {
			wk, err := start(tasks.UnitRef{BatchID: id, Unit: tasks.ChunkUnit(j)})
			if err != nil || len(wk.Items) != stride {
				t.Fatalf("%s: start chunk %d: %d items, %v", name, j, len(wk.Items), err)
			}
			works = append(works, wk)
		}
		u1 := evalUsec()
		ended := 0
		for j, wk := range works {
			outs := make([]worker.ItemOutcome, len(wk.Items))
			for i, it := range wk.Items {
				outs[i] = worker.ItemOutcome{Index: it.Index, State: apitype.TaskStateCompleted, Result: result}
			}
			e, err := finish(tasks.UnitRef{BatchID: id, Unit: tasks.ChunkUnit(j)}, outs)
			if err != nil {
				t.Fatalf("%s: finish chunk %d: %v", name, j, err)
			}
			ended += e
		}
		u2 := evalUsec()
		if ended != n {
			t.Fatalf("%s: the finishes ended %d items, want %d", name, ended, n)
		}
		t.Logf("FIGURES unit scripts, %s: start %.2f us/item, finish %.2f us/item of EVALSHA (%d items in %d-item chunks)",
			name, float64(u1-u0)/n, float64(u2-u1)/n, n, stride)
	}
	for range 2 { // alternated, so that both see the same machine
		run("legacy", func(r tasks.UnitRef) (*worker.UnitWork, error) { return s.legacyStartUnit(ctx, oldStart, r) },
			func(r tasks.UnitRef, o []worker.ItemOutcome) (int, error) {
				return s.legacyFinishUnit(ctx, oldFinish, r, o)
			})
		run("current, general finish", func(r tasks.UnitRef) (*worker.UnitWork, error) { return s.StartUnit(ctx, r) },
			func(r tasks.UnitRef, o []worker.ItemOutcome) (int, error) { return s.FinishUnit(ctx, r, "", o) })
		marks := map[string]string{}
		run("current, fast finish", func(r tasks.UnitRef) (*worker.UnitWork, error) {
			w, err := s.StartUnit(ctx, r)
			if err == nil {
				marks[r.Unit] = w.Mark
			}
			return w, err
		}, func(r tasks.UnitRef, o []worker.ItemOutcome) (int, error) {
			return s.FinishUnit(ctx, r, marks[r.Unit], o)
		})
	}
}

// TestFinishChunkDeclinesAnotherChunksMark: two chunks started in the
// same millisecond hold the same marker, so the marker alone does not tie
// a mark to its chunk; finishChunkScript also checks the mark's first
// index. Here chunk 1's mark goes with chunk 0's unit and an item of chunk
// 1: the fast path must decline, and the general one end nothing, as it
// does for an index that is not the unit's. (Found by a review that drove
// both paths through random histories; no caller passes another unit's
// mark, which this guards.)
func TestFinishChunkDeclinesAnotherChunksMark(t *testing.T) {
	tw := newUnitTwins(t, 4, 8, func(int) bool { return false })
	ctx := context.Background()
	s := tw.cur.s
	if _, err := s.StartUnit(ctx, tw.chunk(0)); err != nil {
		t.Fatal(err)
	}
	w1, err := s.StartUnit(ctx, tw.chunk(1))
	if err != nil || w1.Mark == "" {
		t.Fatalf("start chunk 1: mark %q, %v", w1.Mark, err)
	}
	n, err := s.FinishUnit(ctx, tw.chunk(0), w1.Mark, []worker.ItemOutcome{outDone(5)})
	if err != nil || n != 0 {
		t.Fatalf("chunk 0 finished with chunk 1's mark and item 5: ended %d, %v; want 0", n, err)
	}
	if tw.fast != (fastFinishes{declined: 1}) {
		t.Errorf("finishChunkScript took %d and declined %d, want 0 and 1", tw.fast.taken, tw.fast.declined)
	}
	if e, _ := tw.rdb.HGetAll(ctx, s.k.batchRes(tw.id, 0)).Result(); len(e) != 1 {
		t.Errorf("chunk 0's res hash holds %v, want only its marker", e)
	}
}
