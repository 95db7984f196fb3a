package store

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// rvDelivery is one delivery of a unit in TestFinishChunkMatchesGeneral:
// the mark its start got, and whether it has written (the mark goes with
// a delivery's first write only, as the worker's handler sends it).
type rvDelivery struct {
	ref     tasks.UnitRef
	mark    string
	flushed bool
}

// TestFinishChunkMatchesGeneral drives two stores on one Redis through
// the same seeded random histories (starts leaning to fresh chunks,
// finishes from any earlier delivery, stale ones included, item and
// batch cancels, retries, progress, own units, a clock that often does
// not move, so that markers repeat): one hands each delivery's mark to
// its first finish, as a worker does, the other never does, so that it
// always takes finishUnitScript. After every step answers, events, every
// key and the count and quota invariants must be the same. (Written by a
// review of the fast path, which found it sound; 84 histories then, a
// third of them here, since each starts its own redis-server.)
func TestFinishChunkMatchesGeneral(t *testing.T) {
	if testing.Short() {
		t.Skip("28 random histories, each on its own redis-server")
	}
	var fast fastFinishes
	for _, cfg := range []struct {
		stride, total int
		seeds         int
	}{{3, 17, 10}, {5, 23, 10}, {2048, 2600, 2}, {1500, 3100, 1}} {
		for seed := uint64(1); seed <= uint64(cfg.seeds); seed++ {
			t.Run(fmt.Sprintf("s%d_seed%d", cfg.stride, seed), func(t *testing.T) {
				f := reviewRun(t, cfg.stride, cfg.total, seed)
				fast.taken += f.taken
				fast.declined += f.declined
			})
		}
	}
	// The seeds decide these: a history that never reached the fast
	// path, or never had it decline, would compare nothing new.
	if fast.taken == 0 || fast.declined == 0 {
		t.Errorf("finishChunkScript took %d finishes and declined %d over the histories, want some of each", fast.taken, fast.declined)
	}
	t.Logf("finishChunkScript took %d finishes and declined %d over the histories", fast.taken, fast.declined)
}

// reviewRun is one history of TestFinishChunkMatchesGeneral; it returns
// how often the fast path took and declined a finish.
func reviewRun(t *testing.T, stride, total int, seed uint64) fastFinishes {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	var hook fastFinishes
	rdb.AddHook(&hook)
	if err := LoadScripts(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	id := "0123456789abcdef0123456789abcdef"
	owner := "alice"
	clk := time.UnixMilli(1764633600000)
	rng := rand.New(rand.NewPCG(seed, 7))
	isOwn := func(i int) bool { return stride < 100 && i%7 == 3 }
	mk := func(name string) (*Store, *unitSide) {
		s := New(rdb, Options{Prefix: name + ":", TaskTTL: time.Hour, ResultTTL: time.Hour})
		s.now = func() time.Time { return clk }
		u := &unitSide{name: name, s: s}
		u.events = rdb.Subscribe(ctx, s.k.events())
		if _, err := u.events.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { u.events.Close() })
		w := s.NewBatchWriter(id, stride)
		for i := range total {
			it := StagedItem{Kind: puzzle.KindSliding, Request: []byte(fmt.Sprintf(`{"board":[%d,1,2]}`, i)), Timeout: time.Second}
			if isOwn(i) {
				it = StagedItem{Kind: puzzle.KindSweep, Request: []byte(fmt.Sprintf(`{"w":%d}`, i)), Own: true, Timeout: time.Minute}
			}
			if err := w.Add(ctx, it); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CommitBatch(ctx, w, CommitBatch{ID: id, Owner: owner}); err != nil {
			t.Fatal(err)
		}
		u.drainEvents(t, ctx, 0)
		return s, u
	}
	gs, gu := mk("g")
	fs, fu := mk("f")
	exps := map[*Store]string{gs: rdb.HGet(ctx, gs.k.batch(id), "expires_at").Val(), fs: rdb.HGet(ctx, fs.k.batch(id), "expires_at").Val()}
	chunks := (total + stride - 1) / stride
	var owns []int
	for i := range total {
		if isOwn(i) {
			owns = append(owns, i)
		}
	}
	var dels []*rvDelivery
	outcome := func(i int) worker.ItemOutcome {
		switch rng.IntN(14) {
		case 0:
			return worker.ItemOutcome{Index: i, State: apitype.TaskStateFailed, Code: apitype.CodeTimeout, Msg: strings.Repeat("\"é\u2028\x01<>&", 80)}
		case 1:
			return worker.ItemOutcome{Index: i, State: apitype.TaskStateFailed, Code: apitype.CodeInternal, Msg: ""}
		case 2:
			return worker.ItemOutcome{Index: i, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":1}`), Cached: true}
		case 3:
			return worker.ItemOutcome{Index: i, State: apitype.TaskStateCompleted, Result: nil}
		case 4:
			return worker.ItemOutcome{Index: i, State: apitype.TaskStateCompleted, CacheKey: "k" + strconv.Itoa(rng.IntN(3)), Cached: rng.IntN(2) == 0}
		case 5:
			if stride < 100 && rng.IntN(4) == 0 {
				return worker.ItemOutcome{Index: i, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"big":1}`), CacheKey: "k" + strconv.Itoa(rng.IntN(3))}
			}
		}
		return worker.ItemOutcome{Index: i, State: apitype.TaskStateCompleted, Result: json.RawMessage(fmt.Sprintf(`{"moves":%d}`, i))}
	}
	steps := 120
	if stride > 100 {
		steps = 40
	}
	for step := 1; step <= steps; step++ {
		if rng.IntN(3) == 0 {
			clk = clk.Add(time.Millisecond)
		}
		var name string
		var do func(s *Store, fast bool) (string, error)
		j, i := rng.IntN(chunks), rng.IntN(total)
		switch r := rng.IntN(100); {
		case r < 25:
			if rng.IntN(2) == 0 {
				var fresh []int
				for c := range chunks {
					if rdb.Exists(ctx, fs.k.batchRes(id, c)).Val() == 0 {
						fresh = append(fresh, c)
					}
				}
				if len(fresh) > 0 {
					j = fresh[rng.IntN(len(fresh))]
				}
			}
			ref := tasks.UnitRef{BatchID: id, Unit: tasks.ChunkUnit(j)}
			d := &rvDelivery{ref: ref}
			dels = append(dels, d)
			name = "start " + ref.Unit
			do = func(s *Store, fast bool) (string, error) {
				w, err := s.StartUnit(ctx, ref)
				if err != nil {
					return "", err
				}
				if fast {
					d.mark = w.Mark
				}
				return fmt.Sprintf("%q %d %q", w.Owner, len(w.Items), w.Mark), nil
			}
		case r < 60 && len(dels) > 0:
			d := dels[rng.IntN(len(dels))]
			if rng.IntN(2) == 0 {
				d = dels[len(dels)-1]
			}
			_, jj, _ := tasks.ParseUnit(d.ref.Unit)
			var outs []worker.ItemOutcome
			all := rng.IntN(2) == 0
			for x := jj * stride; x < min(total, (jj+1)*stride); x++ {
				if all || rng.IntN(3) > 0 {
					outs = append(outs, outcome(x))
				}
			}
			if rng.IntN(5) == 0 && len(outs) > 0 {
				outs = append(outs, outs[rng.IntN(len(outs))])
			}
			if rng.IntN(6) == 0 {
				outs = append(outs, outcome(i))
			}
			if rng.IntN(8) == 0 {
				rng.Shuffle(len(outs), func(a, b int) { outs[a], outs[b] = outs[b], outs[a] })
			}
			name = fmt.Sprintf("finish %s (%d outs, flushed %v)", d.ref.Unit, len(outs), d.flushed)
			do = func(s *Store, fast bool) (string, error) {
				mark := ""
				if fast && !d.flushed {
					mark = d.mark
					d.flushed = true
				}
				n, err := s.FinishUnit(ctx, d.ref, mark, outs)
				return fmt.Sprintf("ended %d", n), err
			}
		case r < 68:
			name = fmt.Sprintf("cancel %d", i)
			do = func(s *Store, _ bool) (string, error) {
				b, err := s.GetBatch(ctx, id)
				if err != nil {
					return "", err
				}
				st, err := s.CancelItem(ctx, b, i)
				return string(st), err
			}
		case r < 74:
			name = fmt.Sprintf("progress %d", i)
			do = func(s *Store, _ bool) (string, error) { return "", s.setItemProgress(ctx, id, i, `{"expanded":3}`) }
		case r < 84:
			name = "retry"
			do = func(s *Store, _ bool) (string, error) {
				b, err := s.GetBatch(ctx, id)
				if err != nil {
					return "", err
				}
				n, err := s.RetryBatch(ctx, b, 0, func(puzzle.Kind, bool) time.Duration { return time.Minute })
				return fmt.Sprintf("retried %d", n), err
			}
		case r < 88:
			name = "cancel batch"
			do = func(s *Store, _ bool) (string, error) { return cancelStep(s.CancelBatch(ctx, id, owner)) }
		case r < 96 && len(owns) > 0:
			o := owns[rng.IntN(len(owns))]
			ref := tasks.UnitRef{BatchID: id, Unit: tasks.OwnUnit(o)}
			out := outcome(o)
			name = "own " + ref.Unit
			do = func(s *Store, _ bool) (string, error) {
				w, err := s.StartUnit(ctx, ref)
				if err != nil {
					return "", err
				}
				n, err := s.FinishUnit(ctx, ref, "", []worker.ItemOutcome{out})
				return fmt.Sprintf("%d %d", len(w.Items), n), err
			}
		default:
			continue
		}
		a, err := do(gs, false)
		if err != nil {
			t.Fatalf("step %d %s g: %v", step, name, err)
		}
		b, err := do(fs, true)
		if err != nil {
			t.Fatalf("step %d %s f: %v", step, name, err)
		}
		if a != b {
			t.Fatalf("step %d %s: answers differ: g %q f %q", step, name, a, b)
		}
		if eg, ef := gu.drainEvents(t, ctx, step), fu.drainEvents(t, ctx, step); !reflect.DeepEqual(eg, ef) {
			t.Fatalf("step %d %s: events differ: %q %q", step, name, eg, ef)
		}
		dg, df := dumpKeys(t, ctx, gs, exps[gs]), dumpKeys(t, ctx, fs, exps[fs])
		if !reflect.DeepEqual(dg, df) {
			for _, l := range dg {
				if !slices.Contains(df, l) {
					t.Errorf("step %d (%s): g only: %.600s", step, name, l)
				}
			}
			for _, l := range df {
				if !slices.Contains(dg, l) {
					t.Errorf("step %d (%s): f only: %.600s", step, name, l)
				}
			}
			t.FailNow()
		}
		// exact expiry of every res hash, relative to the batch's expires_at
		for c := range chunks {
			eg, _ := strconv.ParseInt(exps[gs], 10, 64)
			ef, _ := strconv.ParseInt(exps[fs], 10, 64)
			pg := rdb.PExpireTime(ctx, gs.k.batchRes(id, c)).Val().Milliseconds()
			pf := rdb.PExpireTime(ctx, fs.k.batchRes(id, c)).Val().Milliseconds()
			if (pg > 0) != (pf > 0) || (pg > 0 && pg-eg != pf-ef) {
				t.Fatalf("step %d %s: chunk %d expiry g %d-%d f %d-%d", step, name, c, pg, eg, pf, ef)
			}
		}
		checkUnitInvariants(t, ctx, fs, id, owner)
	}
	return hook
}
