package store_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// env is a store on the shared server with its prefix and a raw client,
// for tests that look at the keys themselves.
type env struct {
	s      *store.Store
	rdb    *redis.Client
	prefix string
	ctx    context.Context
}

func newEnv(t *testing.T, taskTTL, resultTTL time.Duration) *env {
	t.Helper()
	rdb := sharedServer(t).Client(t)
	prefix := fmt.Sprintf("t:%s:%d:", t.Name(), time.Now().UnixNano())
	return &env{
		s:   store.New(rdb, store.Options{Prefix: prefix, TaskTTL: taskTTL, ResultTTL: resultTTL}),
		rdb: rdb, prefix: prefix, ctx: context.Background(),
	}
}

// bid makes a batch ID (32 hex digits) from a short name, so item IDs
// parse.
func bid(name string) string {
	return fmt.Sprintf("%032x", []byte(name))[:32]
}

func cheap(req string) store.StagedItem {
	return store.StagedItem{Kind: puzzle.KindSliding, Request: []byte(req), Timeout: time.Second}
}

func own(req string) store.StagedItem {
	return store.StagedItem{Kind: puzzle.KindSweep, Request: []byte(req), Own: true, Timeout: time.Minute}
}

// stage writes items into a new writer and closes it.
func (e *env) stage(t *testing.T, id string, stride int, items []store.StagedItem) *store.BatchWriter {
	t.Helper()
	w := e.s.NewBatchWriter(id, stride)
	for i, it := range items {
		if err := w.Add(e.ctx, it); err != nil {
			t.Fatalf("add item %d: %v", i, err)
		}
	}
	if err := w.Close(e.ctx); err != nil {
		t.Fatal(err)
	}
	return w
}

// commit stages and commits a batch.
func (e *env) commit(t *testing.T, cb store.CommitBatch, stride int, items []store.StagedItem) *store.Batch {
	t.Helper()
	w := e.stage(t, cb.ID, stride, items)
	if err := e.s.CommitBatch(e.ctx, w, cb); err != nil {
		t.Fatalf("commit %s: %v", cb.ID, err)
	}
	b, err := e.s.GetBatch(e.ctx, cb.ID)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (e *env) counts(t *testing.T, id string, want map[apitype.TaskState]int) *store.Batch {
	t.Helper()
	b, err := e.s.GetBatch(e.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range apitype.TaskStates() {
		if b.Counts[st] != want[st] {
			t.Fatalf("counts %v, want %v", b.Counts, want)
		}
	}
	return b
}

func (e *env) pending(t *testing.T, owner string, want int) {
	t.Helper()
	if n, err := e.s.Pending(e.ctx, owner); err != nil || n != want {
		t.Fatalf("%s's quota count is %d (%v), want %d", owner, n, err, want)
	}
}

func units(refs []tasks.UnitRef) []string {
	out := make([]string, len(refs))
	for i, r := range refs {
		out[i] = r.Unit
	}
	return out
}

// feedAll takes every unit from both feeds (no asynq queue: depth is
// large), in as many Feed calls as it takes, and returns them in fair
// order (their scores in the feeds): each call takes the cheap lane's
// units and the solvers' of one window.
func (e *env) feedAll(t *testing.T) []tasks.UnitRef {
	t.Helper()
	var all []tasks.UnitRef
	for range 1000 {
		score := map[string]float64{}
		for _, f := range []string{"feed", "feed:cheap"} {
			for _, z := range e.rdb.ZRangeWithScores(e.ctx, e.prefix+f, 0, -1).Val() {
				score[z.Member.(string)] = z.Score
			}
		}
		cheapRefs, err := e.s.FeedCheap(e.ctx, "nonec-"+e.prefix, 1<<30, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		refs, err := e.s.Feed(e.ctx, "none-"+e.prefix, 1<<30, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, cheapRefs...)
		// A unit a refill moved in this call was in no feed before it;
		// it comes after those that were, as its score does.
		at := func(r tasks.UnitRef) float64 {
			if s, ok := score[r.Member()]; ok {
				return s
			}
			return math.Inf(1)
		}
		slices.SortStableFunc(refs, func(a, b tasks.UnitRef) int { return cmp.Compare(at(a), at(b)) })
		all = append(all, refs...)
		if len(refs) == 0 && e.rdb.ZCard(e.ctx, e.prefix+"feed").Val() == 0 && e.rdb.ZCard(e.ctx, e.prefix+"feed:cheap").Val() == 0 {
			return all
		}
	}
	t.Fatal("the feeds did not drain in 1000 calls")
	return nil
}

// TestStageCommitReadBack: staged items are invisible until the commit,
// which writes the record, gives the keys the batch's TTL and puts the
// units in the feed in order with their timeouts; every item reads back.
func TestStageCommitReadBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	id := bid("stage")
	a := cheap(`{"p":0}`)
	a.CustomID = "first \"one\"\n"
	items := []store.StagedItem{a, own(`{"p":1}`), {Kind: puzzle.KindFill, Request: []byte(`{"p":2}`), Timeout: 2 * time.Second},
		cheap(`{"p":3}`), own("{\n\"p\":4}")}
	w := e.s.NewBatchWriter(id, 2)
	for i, it := range items {
		if err := w.Add(e.ctx, it); err != nil {
			t.Fatal(err)
		}
		if got, err := w.CustomIDAt(e.ctx, 0); err != nil || got != a.CustomID {
			t.Fatalf("after item %d: custom_id of item 0 is %q, %v", i, got, err)
		}
		if got, err := w.CustomIDAt(e.ctx, i); err != nil || got != it.CustomID {
			t.Fatalf("custom_id of item %d is %q, %v", i, got, err)
		}
	}
	if w.Buffered() == 0 {
		t.Fatal("the last, partial chunk is buffered but Buffered is 0")
	}
	if err := w.Add(e.ctx, cheap("two\nlines")); err == nil {
		t.Fatal("a request with a newline was staged")
	}
	if err := w.Close(e.ctx); err != nil {
		t.Fatal(err)
	}
	if w.Total() != 5 || w.Buffered() != 0 {
		t.Fatalf("total %d buffered %d after close", w.Total(), w.Buffered())
	}
	if ttl := e.rdb.TTL(e.ctx, e.prefix+"batch:"+id+":req").Val(); ttl <= 0 || ttl > 15*time.Minute {
		t.Fatalf("staged TTL %v", ttl)
	}
	if _, err := e.s.GetBatch(e.ctx, id); err != store.ErrNotFound {
		t.Fatalf("a staged batch is visible: %v", err)
	}
	if _, err := e.s.GetItem(e.ctx, id, 0); err != store.ErrNotFound {
		t.Fatalf("a staged item is visible: %v", err)
	}
	if refs := e.feedAll(t); len(refs) != 0 {
		t.Fatalf("staged units were fed: %v", refs)
	}
	if err := e.s.CommitBatch(e.ctx, w, store.CommitBatch{ID: id, Owner: "alice", Format: "judge"}); err != nil {
		t.Fatal(err)
	}
	b := e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStatePending: 5})
	if b.Total != 5 || b.Stride != 2 || b.Owner != "alice" || b.Format != "judge" || b.CreatedAt.IsZero() ||
		b.ExpiresAt.Before(time.Now().Add(59*time.Minute)) {
		t.Fatalf("batch %+v", b)
	}
	for _, k := range []string{"batch:" + id, "batch:" + id + ":req"} {
		if ttl := e.rdb.TTL(e.ctx, e.prefix+k).Val(); ttl < 59*time.Minute {
			t.Fatalf("%s: TTL %v after commit", k, ttl)
		}
	}
	refs := e.feedAll(t)
	want := []tasks.UnitRef{
		{BatchID: id, Unit: "c0", Timeout: 31 * time.Second},
		{BatchID: id, Unit: "x1", Timeout: 90 * time.Second},
		{BatchID: id, Unit: "c1", Timeout: 33 * time.Second},
		{BatchID: id, Unit: "x4", Timeout: 90 * time.Second},
	}
	if fmt.Sprint(refs) != fmt.Sprint(want) {
		t.Fatalf("fed %v, want %v", refs, want)
	}
	for i, it := range items {
		got, err := e.s.GetItem(e.ctx, id, i)
		if err != nil {
			t.Fatal(err)
		}
		gotID := ""
		if got.CustomID != nil {
			gotID = *got.CustomID
		}
		if got.ID != apitype.ItemID(id, i) || got.BatchID != id || got.Kind != string(it.Kind) || got.State != apitype.TaskStatePending ||
			gotID != it.CustomID || (got.CustomID != nil && it.CustomID == "") || !got.CreatedAt.Equal(b.CreatedAt) {
			t.Fatalf("item %d: %+v", i, got)
		}
	}
	if _, err := e.s.GetItem(e.ctx, id, 5); err != store.ErrNotFound {
		t.Fatalf("item past the end: %v", err)
	}
	for _, r := range want {
		work, err := e.s.StartUnit(e.ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range work.Items {
			if string(it.Request) != string(items[it.Index].Request) {
				t.Fatalf("unit %s: item %d's request %q, want %q", r.Unit, it.Index, it.Request, items[it.Index].Request)
			}
		}
	}
}

// TestCommitRefusals: a lost claim, a full quota or staged keys that are
// gone commit nothing: no record, no feed, no quota count.
func TestCommitRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	items := []store.StagedItem{cheap(`{}`), cheap(`{}`), own(`{}`)}
	if _, _, _, err := e.s.ClaimIdempotency(e.ctx, "alice", "k1", "someone-else", "h"); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.s.ClaimIdempotency(e.ctx, "alice", "k2", bid("quota"), "h"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cb   store.CommitBatch
		drop bool // delete the staged keys first
		want error
	}{
		{"claim lost", store.CommitBatch{ID: bid("claim"), Owner: "alice", IdempotencyKey: "k1", BodyHash: "h"}, false, store.ErrClaimLost},
		{"claim never made", store.CommitBatch{ID: bid("noclaim"), Owner: "alice", IdempotencyKey: "k9", BodyHash: "h"}, false, store.ErrClaimLost},
		{"quota", store.CommitBatch{ID: bid("quota"), Owner: "alice", Quota: 2, IdempotencyKey: "k2", BodyHash: "h"}, false, store.ErrQuota},
		{"staged gone", store.CommitBatch{ID: bid("gone"), Owner: "alice"}, true, store.ErrStagedGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := e.stage(t, tc.cb.ID, 2, items)
			if tc.drop {
				e.rdb.Del(e.ctx, e.prefix+"batch:"+tc.cb.ID+":units")
			}
			if err := e.s.CommitBatch(e.ctx, w, tc.cb); err != tc.want {
				t.Fatalf("commit: %v, want %v", err, tc.want)
			}
			if _, err := e.s.GetBatch(e.ctx, tc.cb.ID); err != store.ErrNotFound {
				t.Fatalf("a refused batch was written: %v", err)
			}
			if refs := e.feedAll(t); len(refs) != 0 {
				t.Fatalf("a refused batch was fed: %v", refs)
			}
			e.pending(t, "alice", 0)
		})
	}
	// The claim, once the batch is committed under it, lives as long as
	// the batch.
	id := bid("claimed")
	if ok, _, _, err := e.s.ClaimIdempotency(e.ctx, "alice", "k3", id, "h"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	e.commit(t, store.CommitBatch{ID: id, Owner: "alice", IdempotencyKey: "k3", BodyHash: "h", Quota: 3}, 2, items)
	if ttl := e.rdb.TTL(e.ctx, e.prefix+"idem:alice:k3").Val(); ttl < 59*time.Minute {
		t.Fatalf("claim TTL %v after commit", ttl)
	}
	e.pending(t, "alice", 3)
}

// TestAbandonCommit: a batch never committed, committed and not fed, and
// committed with a unit fed give the three outcomes.
func TestAbandonCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	for _, tc := range []struct {
		name           string
		items          int // own items, beyond one cheap one
		commit, feed   bool
		want           int
		batchRemains   bool
		pendingRemains int
	}{
		{"not written", 2, false, false, store.BatchNotWritten, false, 0},
		{"abandoned", 2, true, false, store.BatchAbandoned, false, 0},
		{"kept", 2, true, true, store.BatchKept, true, 3},
		{"abandoned past the first window", 1500, true, false, store.BatchAbandoned, false, 0},
		{"kept past the first window", 1500, true, true, store.BatchKept, true, 1501},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items := []store.StagedItem{cheap(`{}`)}
			for range tc.items {
				items = append(items, own(`{}`))
			}
			id := bid(tc.name)
			owner := "o-" + tc.name
			key := "k-" + tc.name
			if _, _, _, err := e.s.ClaimIdempotency(e.ctx, owner, key, id, "h"); err != nil {
				t.Fatal(err)
			}
			cb := store.CommitBatch{ID: id, Owner: owner, IdempotencyKey: key, BodyHash: "h"}
			w := e.stage(t, id, 2, items)
			if tc.commit {
				if err := e.s.CommitBatch(e.ctx, w, cb); err != nil {
					t.Fatal(err)
				}
			}
			var fed []tasks.UnitRef
			if tc.feed {
				var err error
				if fed, err = e.s.Feed(e.ctx, "none", 100, 1); err != nil || len(fed) != 1 {
					t.Fatalf("feed: %v %v", fed, err)
				}
			}
			got, err := e.s.AbandonCommit(e.ctx, w, cb)
			if err != nil || got != tc.want {
				t.Fatalf("abandon: %d %v, want %d", got, err, tc.want)
			}
			_, err = e.s.GetBatch(e.ctx, id)
			if (err == nil) != tc.batchRemains {
				t.Fatalf("batch after abandon: %v", err)
			}
			e.pending(t, owner, tc.pendingRemains)
			if !tc.batchRemains {
				n, _ := e.rdb.Exists(e.ctx, e.prefix+"batch:"+id+":req", e.prefix+"batch:"+id+":units").Result()
				if n != 0 {
					t.Fatalf("%d of the batch's staged keys are left", n)
				}
				// The claim of a batch that was written goes with it; that
				// of one never written is the caller's to release.
				claim := e.rdb.Exists(e.ctx, e.prefix+"idem:"+owner+":"+key).Val()
				if (claim == 1) != (tc.want == store.BatchNotWritten) {
					t.Fatalf("claim exists: %d", claim)
				}
				if refs := e.feedAll(t); len(refs) != 0 {
					t.Fatalf("an abandoned batch's units are fed: %v", refs)
				}
			} else if left := e.feedAll(t); len(left)+len(fed) != 1+tc.items {
				t.Fatalf("a kept batch lost units: fed %v then %v", fed, left)
			}
		})
	}
}

// TestFeedFairnessAndDepth: a key's 3 units sent after another key's 1000
// come out within the next feeds, not after the 1000; the feed fills the
// real asynq pending list only up to depth.
func TestFeedFairnessAndDepth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	big := make([]store.StagedItem, 1000)
	for i := range big {
		big[i] = own(`{}`)
	}
	e.commit(t, store.CommitBatch{ID: bid("a"), Owner: "a"}, 64, big)
	queue := "q-" + e.prefix
	first, err := e.s.Feed(e.ctx, queue, 10, 10)
	if err != nil || len(first) != 10 {
		t.Fatalf("first feed: %d %v", len(first), err)
	}
	e.commit(t, store.CommitBatch{ID: bid("b"), Owner: "b"}, 64, []store.StagedItem{own(`{}`), own(`{}`), own(`{}`)})
	seen := 0
	for range 2 {
		refs, err := e.s.Feed(e.ctx, queue, 1000, 5)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range refs {
			if r.BatchID == bid("b") {
				seen++
			}
		}
	}
	if seen != 3 {
		t.Fatalf("only %d of b's 3 units came out in the 10 units after it was sent", seen)
	}
	// Depth: with 7 tasks waiting on the queue, a feed to depth 10 takes 3.
	cl := asynq.NewClientFromRedisClient(e.rdb)
	for i := range 7 {
		if _, err := cl.Enqueue(asynq.NewTask("x", nil), asynq.Queue(queue), asynq.TaskID(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.rdb.LLen(e.ctx, asynqdata.PendingKey(queue)).Val(); n != 7 {
		t.Fatalf("asynq pending list has %d tasks, want 7: the key layout changed", n)
	}
	refs, err := e.s.Feed(e.ctx, queue, 10, 100)
	if err != nil || len(refs) != 3 {
		t.Fatalf("feed to depth 10 over 7 waiting: %d %v", len(refs), err)
	}
	if refs, _ := e.s.Feed(e.ctx, queue, 7, 100); len(refs) != 0 {
		t.Fatalf("feed over a full queue took %d", len(refs))
	}
}

// TestFeedFollowsWeights: the feed hands out the units of a key of
// weight 3 three to one against a key of weight 1 (API_KEYS_FILE's
// weight, keys.gateWeights), so that the bulk queue, which asynq runs in
// order, brings the fair share each key's demand in the ratio of its
// share. b's batch comes second and still gets 6 of the first 8 units.
func TestFeedFollowsWeights(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	if err := e.s.SetWeights(e.ctx, map[string]int{"b": 3}); err != nil {
		t.Fatal(err)
	}
	units := func() []store.StagedItem {
		items := make([]store.StagedItem, 12)
		for i := range items {
			items[i] = own(`{}`)
		}
		return items
	}
	e.commit(t, store.CommitBatch{ID: bid("a"), Owner: "a"}, 64, units())
	e.commit(t, store.CommitBatch{ID: bid("b"), Owner: "b"}, 64, units())
	count := func(n int) (a, b int) {
		t.Helper()
		refs, err := e.s.Feed(e.ctx, "q-"+e.prefix, 1000, n)
		if err != nil || len(refs) != n {
			t.Fatalf("feed %d: %d %v", n, len(refs), err)
		}
		for _, r := range refs {
			if r.BatchID == bid("b") {
				b++
			} else {
				a++
			}
		}
		return a, b
	}
	// a's units are scored 1, 2, 3, ... and b's 1, 1, 1, 2, 2, 2, ...: each
	// score holds one of a's and three of b's.
	for round := range 2 {
		if a, b := count(8); a != 2 || b != 6 {
			t.Fatalf("round %d: the feed gave a %d and b %d of 8 units, want 2 and 6", round, a, b)
		}
	}
	// b's 12 are out; a's other 8 follow.
	if a, b := count(8); a != 8 || b != 0 {
		t.Fatalf("the last 8 units: a %d, b %d, want 8 and 0", a, b)
	}
}

// TestFeedSolversQueueHoldsAtMostTheSlots: the solvers' bulk queue holds
// at most S units waiting, S the workers' live solver slots, whatever
// depth the feeder asks for (a depth below S still holds), and S is read
// at each feed: a worker that registers lets more in. asynq runs the
// queue in order, so a key's batch queued up to FEED_DEPTH deep would
// start every one of those searches before another key's first unit
// showed its demand to the fair share.
func TestFeedSolversQueueHoldsAtMostTheSlots(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	items := make([]store.StagedItem, 100)
	for i := range items {
		items[i] = own(`{}`)
	}
	e.commit(t, store.CommitBatch{ID: bid("a"), Owner: "a"}, 64, items)
	queue := "q-" + e.prefix
	feed := func(depth, want int) {
		t.Helper()
		refs, err := e.s.Feed(e.ctx, queue, depth, 100)
		if err != nil || len(refs) != want {
			t.Fatalf("feed to depth %d over %d waiting: took %d (%v), want %d",
				depth, e.rdb.LLen(e.ctx, asynqdata.PendingKey(queue)).Val(), len(refs), err, want)
		}
		if n, err := e.s.EnqueueFed(e.ctx, queue, refs); err != nil || n != len(refs) {
			t.Fatalf("enqueue %d fed units: %d %v", len(refs), n, err)
		}
	}
	// No worker registered: the depth asked for.
	feed(2, 2)
	for _, w := range []string{"w1", "w2"} {
		if _, err := e.s.RegisterSlots(e.ctx, w+e.prefix, 3, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	feed(4, 2)  // S is 6: a depth of 4 holds
	feed(64, 2) // up to S, not 64
	feed(64, 0)
	if _, err := e.s.RegisterSlots(e.ctx, "w3"+e.prefix, 2, time.Minute); err != nil {
		t.Fatal(err)
	}
	feed(64, 2) // S is 8 now
}

// TestStaleFed: fed units not acknowledged are stale once older than the
// cutoff; acknowledged ones never are.
func TestStaleFed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	e.commit(t, store.CommitBatch{ID: bid("s")}, 1, []store.StagedItem{cheap(`{}`), cheap(`{}`), cheap(`{}`)})
	refs := e.feedAll(t)
	if len(refs) != 3 {
		t.Fatalf("fed %v", refs)
	}
	if n, err := e.s.EnqueueFed(e.ctx, "q-"+e.prefix, refs[1:2]); err != nil || n != 1 {
		t.Fatalf("enqueue and acknowledge one: %d %v", n, err)
	}
	if got, err := e.s.StaleFed(e.ctx, time.Now().Add(-time.Minute), 10); err != nil || len(got) != 0 {
		t.Fatalf("stale before they were fed: %v %v", got, err)
	}
	got, err := e.s.StaleFed(e.ctx, time.Now().Add(time.Second), 10)
	if err != nil || fmt.Sprint(units(got)) != "[c0 c2]" {
		t.Fatalf("stale: %v %v", got, err)
	}
	if got, _ := e.s.StaleFed(e.ctx, time.Now().Add(time.Second), 1); len(got) != 1 {
		t.Fatalf("limit 1 gave %d", len(got))
	}
}

// TestUnitLifecycle drives a batch through start, duplicate start, a
// concurrent cancel, finish, duplicate finish and the last item's end,
// checking counts, quota, entries and events after each step.
func TestUnitLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Minute)
	id := bid("life")
	hub := store.NewHub()
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	go e.s.ListenEvents(ctx, hub)
	canceled := make(chan string, 10)
	go e.s.ListenCancels(ctx, func(id string) { canceled <- id })
	time.Sleep(100 * time.Millisecond) // let the subscriptions start

	items := []store.StagedItem{cheap(`{"i":0}`), cheap(`{"i":1}`), cheap(`{"i":2}`), own(`{"i":3}`), cheap(`{"i":4}`)}
	items[2].CustomID = "two"
	b := e.commit(t, store.CommitBatch{ID: id, Owner: "alice"}, 4, items)
	e.pending(t, "alice", 5)

	c0 := tasks.UnitRef{BatchID: id, Unit: "c0"}
	for attempt := 1; attempt <= 2; attempt++ {
		w, err := e.s.StartUnit(e.ctx, c0)
		if err != nil || w.Owner != "alice" || len(w.Items) != 3 || w.Items[2].Index != 2 {
			t.Fatalf("start %d: %+v %v", attempt, w, err)
		}
		e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStatePending: 2, apitype.TaskStateActive: 3})
		if it, _ := e.s.GetItem(e.ctx, id, 1); it.State != apitype.TaskStateActive || it.Attempts != attempt || it.StartedAt.IsZero() {
			t.Fatalf("item 1 after start %d: %+v", attempt, it)
		}
	}
	if err := e.s.SetProgress(e.ctx, apitype.ItemID(id, 0), apitype.Progress{Bound: 7, Nodes: 99}); err != nil {
		t.Fatal(err)
	}
	if it, _ := e.s.GetItem(e.ctx, id, 0); it.Progress == nil || it.Progress.Bound != 7 {
		t.Fatalf("progress %+v", it.Progress)
	}

	chunk0, release := hub.Wait(store.ChunkEventKey(id, 0))
	defer release()
	// A cancel of a running item wins over its finish.
	if prev, err := e.s.CancelItem(e.ctx, b, 1); err != nil || prev != apitype.TaskStateActive {
		t.Fatalf("cancel active: %q %v", prev, err)
	}
	select {
	case got := <-canceled:
		if got != apitype.ItemID(id, 1) {
			t.Fatalf("cancels announced %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no cancel announced for an active item")
	}
	select {
	case <-chunk0:
	case <-time.After(5 * time.Second):
		t.Fatal("no chunk event for the cancel")
	}
	if prev, _ := e.s.CancelItem(e.ctx, b, 1); prev != apitype.TaskStateCanceled {
		t.Fatalf("second cancel: %q", prev)
	}
	e.pending(t, "alice", 4)

	outs := []worker.ItemOutcome{
		{Index: 0, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":0}`)},
		{Index: 1, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":1}`)},
		{Index: 2, State: apitype.TaskStateFailed, Code: apitype.CodeTimeout, Msg: "too slow"},
		{Index: 3, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":3}`)}, // not c0's
	}
	for round, want := range []int{2, 0} {
		n, err := e.s.FinishUnit(e.ctx, c0, "", outs)
		if err != nil || n != want {
			t.Fatalf("finish round %d: %d %v, want %d", round, n, err, want)
		}
		e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStatePending: 2, apitype.TaskStateCompleted: 1,
			apitype.TaskStateFailed: 1, apitype.TaskStateCanceled: 1})
		e.pending(t, "alice", 2)
	}

	// The own item, with a cache key: the result is stored once.
	x3 := tasks.UnitRef{BatchID: id, Unit: "x3"}
	if w, err := e.s.StartUnit(e.ctx, x3); err != nil || len(w.Items) != 1 || string(w.Items[0].Request) != `{"i":3}` {
		t.Fatalf("start x3: %+v %v", w, err)
	}
	big := `{"moves":30,"path":"` + strings.Repeat("U", 1000) + `"}`
	if n, err := e.s.FinishUnit(e.ctx, x3, "", []worker.ItemOutcome{{Index: 3, State: apitype.TaskStateCompleted, Result: json.RawMessage(big), CacheKey: "h3"}}); err != nil || n != 1 {
		t.Fatalf("finish x3: %d %v", n, err)
	}
	if got, err := e.s.Cached(e.ctx, "h3"); err != nil || string(got) != big {
		t.Fatalf("cache holds %q %v", got, err)
	}
	if ttl := e.rdb.TTL(e.ctx, e.prefix+"cache:h3").Val(); ttl < 59*time.Minute {
		t.Fatalf("cache TTL %v, not raised to the batch's", ttl)
	}
	if entry := e.rdb.HGet(e.ctx, e.prefix+"batch:"+id+":res:0", "3").Val(); strings.Contains(entry, "UUU") || !strings.Contains(entry, `"ref":"h3"`) {
		t.Fatalf("entry %q holds a second copy or no ref", entry)
	}
	if got, _ := e.s.Cached(e.ctx, "nothing"); got != nil {
		t.Fatalf("a miss gave %q", got)
	}

	// The last item ends the batch: done_at and b:<batch>.
	done, release2 := hub.Wait(store.BatchEventKey(id))
	defer release2()
	c1 := tasks.UnitRef{BatchID: id, Unit: "c1"}
	e.s.StartUnit(e.ctx, c1)
	if b, _ := e.s.GetBatch(e.ctx, id); !b.DoneAt.IsZero() {
		t.Fatal("done_at before the last item ended")
	}
	if _, err := e.s.CancelItem(e.ctx, b, 0); err != nil { // ended: nothing
		t.Fatal(err)
	}
	e.s.FinishUnit(e.ctx, c1, "", []worker.ItemOutcome{{Index: 4, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":4}`), Cached: true}})
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("no batch event")
	}
	fb := e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStateCompleted: 3, apitype.TaskStateFailed: 1, apitype.TaskStateCanceled: 1})
	if fb.DoneAt.IsZero() || !fb.Done() {
		t.Fatalf("batch not done: %+v", fb)
	}
	e.pending(t, "alice", 0)
	if n, err := e.s.CancelBatch(e.ctx, id, "alice"); !errors.Is(err, store.ErrBatchEnded) || n != 0 {
		t.Fatalf("cancel of a done batch: %d %v; want ErrBatchEnded", n, err)
	}
	if fb, _ := e.s.GetBatch(e.ctx, id); !fb.CanceledAt.IsZero() {
		t.Fatal("a done batch was marked canceled")
	}

	// Every item reads back.
	for _, tc := range []struct {
		index    int
		state    apitype.TaskState
		result   string
		code     string
		cached   bool
		customID string
		attempts int
	}{
		{0, apitype.TaskStateCompleted, `{"moves":0}`, "", false, "", 2},
		{1, apitype.TaskStateCanceled, "", apitype.CodeCanceled, false, "", 2},
		{2, apitype.TaskStateFailed, "", apitype.CodeTimeout, false, "two", 2},
		{3, apitype.TaskStateCompleted, big, "", false, "", 1},
		{4, apitype.TaskStateCompleted, `{"moves":4}`, "", true, "", 1},
	} {
		it, err := e.s.GetItem(e.ctx, id, tc.index)
		if err != nil {
			t.Fatal(err)
		}
		gotID := ""
		if it.CustomID != nil {
			gotID = *it.CustomID
		}
		if it.State != tc.state || string(it.Result) != tc.result || it.ErrCode != tc.code || it.Cached != tc.cached ||
			gotID != tc.customID || it.Attempts != tc.attempts || it.CompletedAt.IsZero() || it.StartedAt.IsZero() || it.Progress != nil {
			t.Errorf("item %d: %+v", tc.index, it)
		}
	}
	page, err := e.s.ItemsPage(e.ctx, fb, 1, 10)
	if err != nil || len(page) != 4 || page[0].ID != apitype.ItemID(id, 1) || string(page[2].Result) != big || page[3].State != apitype.TaskStateCompleted {
		t.Fatalf("page: %d %v", len(page), err)
	}
}

// TestChunkInfosAndResults: infos give states, errors and result sizes
// without results; results come for the asked indexes, refs resolved.
func TestChunkInfosAndResults(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	id := bid("chunks")
	items := []store.StagedItem{cheap(`{}`), own(`{}`), cheap(`{}`), cheap(`{}`), cheap(`{}`)}
	items[1].CustomID = "own"
	b := e.commit(t, store.CommitBatch{ID: id}, 4, items)
	c0 := tasks.UnitRef{BatchID: id, Unit: "c0"}
	e.s.StartUnit(e.ctx, c0)
	e.s.FinishUnit(e.ctx, c0, "", []worker.ItemOutcome{
		{Index: 0, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"a":1}`)},
		{Index: 2, State: apitype.TaskStateFailed, Code: apitype.CodeInternal, Msg: "boom"},
	})
	x1 := tasks.UnitRef{BatchID: id, Unit: "x1"}
	e.s.StartUnit(e.ctx, x1)
	e.s.FinishUnit(e.ctx, x1, "", []worker.ItemOutcome{{Index: 1, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"bb":22}`), CacheKey: "k1"}})

	infos, err := e.s.ChunkInfos(e.ctx, b, 0)
	if err != nil || len(infos) != 4 {
		t.Fatalf("infos %v %v", infos, err)
	}
	for i, tc := range []struct {
		state apitype.TaskState
		size  int64
		code  string
		cid   string
		kind  puzzle.Kind
	}{
		{apitype.TaskStateCompleted, 7, "", "", puzzle.KindSliding},
		{apitype.TaskStateCompleted, 9, "", "own", puzzle.KindSweep},
		{apitype.TaskStateFailed, 0, apitype.CodeInternal, "", puzzle.KindSliding},
		{apitype.TaskStateActive, 0, "", "", puzzle.KindSliding},
	} {
		got := infos[i]
		code, cid := "", ""
		if got.Error != nil {
			code = got.Error.Code
		}
		if got.CustomID != nil {
			cid = *got.CustomID
		}
		if got.Index != i || got.State != tc.state || got.ResultBytes != tc.size || code != tc.code || cid != tc.cid || got.Kind != tc.kind {
			t.Errorf("info %d: %+v", i, got)
		}
	}
	if infos, _ := e.s.ChunkInfos(e.ctx, b, 1); len(infos) != 1 || infos[0].Index != 4 || infos[0].State != apitype.TaskStatePending {
		t.Fatalf("chunk 1: %+v", infos)
	}
	res, ok, err := e.s.ChunkResults(e.ctx, b, 0, []int{1, 0, 3})
	if err != nil || fmt.Sprint(res, ok) != `[{"bb":22} {"a":1} ] [true true false]` {
		t.Fatalf("results %q %v %v", res, ok, err)
	}
	e.rdb.Del(e.ctx, e.prefix+"cache:k1")
	if _, ok, _ := e.s.ChunkResults(e.ctx, b, 0, []int{1}); ok[0] {
		t.Fatal("a result whose cache entry is gone was found")
	}
	if _, _, err := e.s.ChunkResults(e.ctx, b, 0, []int{4}); err == nil {
		t.Fatal("an index of another chunk was read")
	}
}

// TestCancelBatch: every unended item is canceled once, running ones are
// announced, counts and quota follow, and the feed drops the batch's
// units.
func TestCancelBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	id := bid("cancel")
	items := make([]store.StagedItem, 10)
	for i := range items {
		items[i] = cheap(`{}`)
	}
	items[5] = own(`{}`)
	e.commit(t, store.CommitBatch{ID: id, Owner: "bob"}, 4, items)
	fed, err := e.s.FeedCheap(e.ctx, "none", 100, 1)
	if err != nil || len(fed) != 1 || fed[0].Unit != "c0" {
		t.Fatalf("fed %v %v", fed, err)
	}
	e.s.StartUnit(e.ctx, fed[0])
	e.s.FinishUnit(e.ctx, fed[0], "", []worker.ItemOutcome{{Index: 0, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{}`)}})
	n, err := e.s.CancelBatch(e.ctx, id, "bob")
	if err != nil || n != 9 {
		t.Fatalf("canceled %d %v, want 9", n, err)
	}
	b := e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStateCompleted: 1, apitype.TaskStateCanceled: 9})
	if b.CanceledAt.IsZero() || b.DoneAt.IsZero() {
		t.Fatalf("batch %+v", b)
	}
	e.pending(t, "bob", 0)
	if n, _ := e.s.CancelBatch(e.ctx, id, "bob"); n != 0 {
		t.Fatalf("second cancel canceled %d", n)
	}
	if refs := e.feedAll(t); len(refs) != 0 {
		t.Fatalf("a canceled batch's units were fed: %v", refs)
	}
	if n := e.rdb.ZCard(e.ctx, e.prefix+"feed").Val(); n != 0 {
		t.Fatalf("feed keeps %d members of a canceled batch", n)
	}
	if w, _ := e.s.StartUnit(e.ctx, tasks.UnitRef{BatchID: id, Unit: "c1"}); len(w.Items) != 0 {
		t.Fatalf("a canceled batch's unit started %v", w.Items)
	}
	if it, _ := e.s.GetItem(e.ctx, id, 1); it.State != apitype.TaskStateCanceled || it.ErrMsg != "batch canceled by request" || it.Attempts != 1 {
		t.Fatalf("item 1: %+v", it)
	}
	if n, err := e.s.CancelBatch(e.ctx, bid("nope"), "bob"); !errors.Is(err, store.ErrNotFound) || n != 0 {
		t.Fatalf("cancel of a missing batch: %d %v; want ErrNotFound", n, err)
	}
}

// TestBatchQuotaExact: the owner's count is the batch's unfinished items
// after finishes, cancels and expiry, and a late finish of an expired
// batch counts nothing.
func TestBatchQuotaExact(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second, time.Hour)
	id := bid("q")
	items := []store.StagedItem{cheap(`{}`), cheap(`{}`), cheap(`{}`), own(`{}`), own(`{}`)}
	b := e.commit(t, store.CommitBatch{ID: id, Owner: "carol", Quota: 5}, 8, items)
	e.pending(t, "carol", 5)
	c0 := tasks.UnitRef{BatchID: id, Unit: "c0"}
	e.s.StartUnit(e.ctx, c0)
	e.s.FinishUnit(e.ctx, c0, "", []worker.ItemOutcome{{Index: 0, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{}`)}})
	e.pending(t, "carol", 4)
	e.s.CancelItem(e.ctx, b, 3)
	e.s.CancelItem(e.ctx, b, 3)
	e.pending(t, "carol", 3)
	w := e.stage(t, bid("q2"), 8, items)
	if err := e.s.CommitBatch(e.ctx, w, store.CommitBatch{ID: bid("q2"), Owner: "carol", Quota: 5}); err != store.ErrQuota {
		t.Fatalf("over quota: %v", err)
	}
	time.Sleep(1100 * time.Millisecond)
	if _, err := e.s.GetBatch(e.ctx, id); err != store.ErrNotFound {
		t.Fatalf("batch after its TTL: %v", err)
	}
	if n, _ := e.rdb.Exists(e.ctx, e.prefix+"batch:"+id+":req", e.prefix+"batch:"+id+":res:0").Result(); n != 0 {
		t.Fatalf("%d of the batch's keys outlived it", n)
	}
	e.pending(t, "carol", 0)
	w = e.stage(t, bid("q3"), 8, items)
	if err := e.s.CommitBatch(e.ctx, w, store.CommitBatch{ID: bid("q3"), Owner: "carol", Quota: 5}); err != nil {
		t.Fatal(err)
	}
	if n, _ := e.s.FinishUnit(e.ctx, c0, "", []worker.ItemOutcome{{Index: 1, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{}`)}}); n != 0 {
		t.Fatalf("a late finish ended %d", n)
	}
	e.pending(t, "carol", 5)
}

// TestCommandsPerItem runs a 10,000-item batch (one item in ten its own
// unit) through stage, commit, feed, start and finish on a Redis of its
// own and logs what Redis executed per item (INFO commandstats, which
// counts the commands scripts call too), and the round trips. It fails
// when the layout costs more than a bound well above today's figure, so
// a change that goes per-item in Redis is noticed.
func TestCommandsPerItem(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 10,000 items")
	}
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	s := store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	ctx := context.Background()
	const n = 10000
	id := bid("count")
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	w := s.NewBatchWriter(id, 64)
	for i := range n {
		it := cheap(`{"puzzle":[[1,2,3],[4,5,6],[7,8,0]]}`)
		if i%10 == 9 {
			it = own(`{"puzzle":[[1,2,3,4],[5,6,7,8],[9,10,11,12],[13,14,15,0]]}`)
		}
		if err := w.Add(ctx, it); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CommitBatch(ctx, w, store.CommitBatch{ID: id, Owner: "alice"}); err != nil {
		t.Fatal(err)
	}
	trips := 0
	for cheapLane := false; ; cheapLane = !cheapLane {
		feed := s.Feed
		if cheapLane {
			feed = s.FeedCheap
		}
		refs, err := feed(ctx, "none", 100, 100)
		trips++
		if err != nil {
			t.Fatal(err)
		}
		if len(refs) == 0 {
			if cheapLane && rdb.ZCard(ctx, "pq:feed").Val()+rdb.ZCard(ctx, "pq:feed:cheap").Val() == 0 {
				break
			}
			continue
		}
		// Onto a queue the feed does not measure, as if workers had
		// taken them off at once.
		if _, err := s.EnqueueFed(ctx, "taken", refs); err != nil {
			t.Fatal(err)
		}
		trips++
		for _, r := range refs {
			work, err := s.StartUnit(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			outs := make([]worker.ItemOutcome, len(work.Items))
			for i, it := range work.Items {
				outs[i] = worker.ItemOutcome{Index: it.Index, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{"moves":22}`)}
				if r.Unit[0] == 'x' {
					outs[i].CacheKey = fmt.Sprintf("h%d", it.Index)
				}
			}
			if _, err := s.FinishUnit(ctx, r, work.Mark, outs); err != nil {
				t.Fatal(err)
			}
			trips += 2
		}
	}
	b, err := s.GetBatch(ctx, id)
	if err != nil || b.Counts[apitype.TaskStateCompleted] != n || b.DoneAt.IsZero() {
		t.Fatalf("batch %+v %v", b, err)
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls, evals := 0, 0
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		c, _, _ := strings.Cut(rest, ",")
		var v int
		fmt.Sscan(c, &v)
		if name == "cmdstat_getbatch" || name == "cmdstat_info" || name == "cmdstat_config|resetstat" {
			continue
		}
		calls += v
		if strings.HasPrefix(name, "cmdstat_eval") {
			evals += v
		}
	}
	t.Logf("%d items: %d Redis commands (%.2f per item), %d of them script calls; %d round trips after staging (%.3f per item)",
		n, calls, float64(calls)/n, evals, trips, float64(trips)/n)
	if calls > 15*n {
		t.Fatalf("%d commands for %d items", calls, n)
	}
}

// TestConcurrentFinishAndCancel: duplicate deliveries of a unit finish
// concurrently with cancels of its items and a batch cancel; each item
// ends exactly once, and counts, quota and the scripts' replies agree.
func TestConcurrentFinishAndCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	for _, tc := range []struct {
		name        string
		cancelBatch bool
	}{{"items", false}, {"batch", true}} {
		t.Run(tc.name, func(t *testing.T) {
			id := bid("conc-" + tc.name)
			const n = 64
			items := make([]store.StagedItem, n)
			for i := range items {
				items[i] = cheap(`{}`)
			}
			b := e.commit(t, store.CommitBatch{ID: id, Owner: tc.name}, n, items)
			c0 := tasks.UnitRef{BatchID: id, Unit: "c0"}
			outs := make([]worker.ItemOutcome, n)
			for i := range outs {
				outs[i] = worker.ItemOutcome{Index: i, State: apitype.TaskStateCompleted, Result: json.RawMessage(`{}`)}
			}
			var (
				wg              sync.WaitGroup
				finished, cncld atomic.Int64
			)
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := e.s.StartUnit(e.ctx, c0); err != nil {
						t.Error(err)
					}
					k, err := e.s.FinishUnit(e.ctx, c0, "", outs)
					if err != nil {
						t.Error(err)
					}
					finished.Add(int64(k))
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if tc.cancelBatch {
					k, err := e.s.CancelBatch(e.ctx, id, tc.name)
					if err != nil && !errors.Is(err, store.ErrBatchEnded) {
						// ErrBatchEnded: the finishes ended every item
						// before the cancel came, which is one of the
						// orders this test runs.
						t.Error(err)
					}
					cncld.Add(int64(k))
					return
				}
				for i := n - 1; i >= 0; i-- {
					prev, err := e.s.CancelItem(e.ctx, b, i)
					if err != nil {
						t.Error(err)
					}
					if prev == apitype.TaskStatePending || prev == apitype.TaskStateActive {
						cncld.Add(1)
					}
				}
			}()
			wg.Wait()
			if finished.Load()+cncld.Load() != n {
				t.Fatalf("finish ended %d and cancel %d of %d items", finished.Load(), cncld.Load(), n)
			}
			e.counts(t, id, map[apitype.TaskState]int{apitype.TaskStateCompleted: int(finished.Load()), apitype.TaskStateCanceled: int(cncld.Load())})
			if got, _ := e.s.GetBatch(e.ctx, id); got.Ended() != n || got.DoneAt.IsZero() {
				t.Fatalf("batch %+v", got)
			}
			if ended := e.rdb.HGet(e.ctx, e.prefix+"batch:"+id, "ended").Val(); ended != fmt.Sprint(n) {
				t.Fatalf("ended %s", ended)
			}
			e.pending(t, tc.name, 0)
		})
	}
}

// TestFeedWindows: a batch's units enter the feed a window at a time, yet
// come out all, once each and in order; a canceled batch's units still
// waiting in its list are dropped with the list.
func TestFeedWindows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	const n = 2500
	items := make([]store.StagedItem, n)
	for i := range items {
		items[i] = own(`{}`)
	}
	id := bid("windows")
	e.commit(t, store.CommitBatch{ID: id, Owner: "w"}, 64, items)
	list := e.prefix + "batch:" + id + ":units"
	if in, left := e.rdb.ZCard(e.ctx, e.prefix+"feed").Val(), e.rdb.LLen(e.ctx, list).Val(); in > 1001 || in+left != n+1 {
		t.Fatalf("after commit: %d members in the feed, %d units in the list", in, left)
	}
	// Another owner's batch, committed now, is not behind all 2500.
	e.commit(t, store.CommitBatch{ID: bid("other"), Owner: "o"}, 64, []store.StagedItem{own(`{}`)})
	refs := e.feedAll(t)
	if len(refs) != n+1 {
		t.Fatalf("fed %d units, want %d", len(refs), n+1)
	}
	next, otherAt := 0, -1
	for i, r := range refs {
		if r.BatchID != id {
			otherAt = i
			continue
		}
		if r.Unit != tasks.OwnUnit(next) {
			t.Fatalf("unit %d came out as %s, want %s", i, r.Unit, tasks.OwnUnit(next))
		}
		next++
	}
	if otherAt < 0 || otherAt > 2 {
		t.Fatalf("the other owner's unit came out at %d", otherAt)
	}
	if e.rdb.Exists(e.ctx, list).Val() != 0 {
		t.Fatal("the units list outlived its last window")
	}

	cid := bid("canceled-windows")
	e.commit(t, store.CommitBatch{ID: cid, Owner: "w"}, 64, items)
	if _, err := e.s.CancelBatch(e.ctx, cid, "w"); err != nil {
		t.Fatal(err)
	}
	if refs := e.feedAll(t); len(refs) != 0 {
		t.Fatalf("fed %d units of a canceled batch", len(refs))
	}
	if e.rdb.Exists(e.ctx, e.prefix+"batch:"+cid+":units").Val() != 0 {
		t.Fatal("a canceled batch's waiting units were kept")
	}
}

// TestLargestStride: a stride past the bound is clamped, and a full chunk
// of the largest stride starts, cancels and reads back within the
// scripts' limits.
func TestLargestStride(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	id := bid("stride")
	items := make([]store.StagedItem, 2100)
	for i := range items {
		items[i] = cheap(`{}`)
	}
	b := e.commit(t, store.CommitBatch{ID: id}, 1<<20, items)
	if b.Stride != 2048 || b.Chunks() != 2 {
		t.Fatalf("stride %d, chunks %d", b.Stride, b.Chunks())
	}
	w, err := e.s.StartUnit(e.ctx, tasks.UnitRef{BatchID: id, Unit: "c0"})
	if err != nil || len(w.Items) != 2048 {
		t.Fatalf("start: %d items, %v", len(w.Items), err)
	}
	if n, err := e.s.CancelBatch(e.ctx, id, ""); err != nil || n != 2100 {
		t.Fatalf("cancel: %d %v", n, err)
	}
	if infos, err := e.s.ChunkInfos(e.ctx, b, 0); err != nil || len(infos) != 2048 || infos[2047].State != apitype.TaskStateCanceled {
		t.Fatalf("infos: %d %v", len(infos), err)
	}
}

// TestWriterErrorsAndDiscard: a write that fails in flight surfaces from
// the writer, and Discard removes what was staged.
func TestWriterErrorsAndDiscard(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	w := e.stage(t, bid("discard"), 2, []store.StagedItem{cheap(`{}`), cheap(`{}`), cheap(`{}`)})
	if n := e.rdb.Exists(e.ctx, e.prefix+"batch:"+bid("discard")+":req", e.prefix+"batch:"+bid("discard")+":units").Val(); n != 2 {
		t.Fatalf("%d staged keys", n)
	}
	if err := w.Discard(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.rdb.Exists(e.ctx, e.prefix+"batch:"+bid("discard")+":req", e.prefix+"batch:"+bid("discard")+":units").Val(); n != 0 {
		t.Fatalf("%d staged keys after discard", n)
	}

	dead := redistest.NewClient(&redis.Options{Addr: sharedServer(t).Addr})
	dead.Close()
	s := store.New(dead, store.Options{Prefix: e.prefix, TaskTTL: time.Hour, ResultTTL: time.Hour})
	w = s.NewBatchWriter(bid("dead"), 1)
	var err error
	for i := 0; i < 3 && err == nil; i++ {
		err = w.Add(e.ctx, cheap(`{}`))
	}
	if err == nil {
		err = w.Close(e.ctx)
	}
	if err == nil {
		t.Fatal("writes to a closed client reported no error")
	}
	if err := w.Close(e.ctx); err == nil {
		t.Fatal("Close after a failed write reported no error")
	}
}

// TestPipelinesAfterScriptFlush: the pipelined reads and cancels work on
// a Redis that has forgotten its scripts (a restart), and return each
// item once.
func TestPipelinesAfterScriptFlush(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t).Client(t)
	s := store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	e := &env{s: s, rdb: rdb, prefix: "pq:", ctx: context.Background()}
	id := bid("flush")
	items := make([]store.StagedItem, 10)
	for i := range items {
		items[i] = cheap(`{}`)
	}
	b := e.commit(t, store.CommitBatch{ID: id}, 4, items)
	rdb.ScriptFlush(e.ctx)
	page, err := s.ItemsPage(e.ctx, b, 0, 10)
	if err != nil || len(page) != 10 || page[9].ID != apitype.ItemID(id, 9) {
		t.Fatalf("page after a script flush: %d items, %v", len(page), err)
	}
	rdb.ScriptFlush(e.ctx)
	if n, err := s.CancelBatch(e.ctx, id, ""); err != nil || n != 10 {
		t.Fatalf("cancel after a script flush: %d %v", n, err)
	}
}

// TestBacklogCountsEveryWaitingUnit: the backlog, which KEDA scales on,
// has one member per 50 units of a batch that are not yet fed, however
// few of them are in the feed's current window; feeding lowers it,
// cancelling the batch or abandoning its commit empties it, and so does
// the batch's expiry.
func TestBacklogCountsEveryWaitingUnit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2*time.Second, time.Hour)
	card := func(when string, want int64) {
		t.Helper()
		if n, err := e.rdb.ZCard(e.ctx, e.prefix+"backlog").Result(); err != nil || n != want {
			t.Fatalf("%s: the backlog has %d members (%v), want %d", when, n, err, want)
		}
	}
	items := make([]store.StagedItem, 2600) // 2,600 own units: past two feed windows
	for i := range items {
		items[i] = own(fmt.Sprintf(`{"n":%d}`, i))
	}
	id := bid("backlog")
	e.commit(t, store.CommitBatch{ID: id, Owner: "dora"}, 64, items)
	card("after the commit", 52)
	if refs, err := e.s.Feed(e.ctx, tasks.QueueBulk, 100000, 30); err != nil || len(refs) != 30 {
		t.Fatalf("feed 30: %d %v", len(refs), err)
	}
	card("30 fed, 2,570 waiting", 52)
	if refs, err := e.s.Feed(e.ctx, tasks.QueueBulk, 100000, 1000); err != nil || len(refs) != 1000 {
		t.Fatalf("feed 1000: %d %v", len(refs), err)
	}
	card("1,030 fed, 1,570 waiting", 32)

	other := bid("backlog2")
	e.commit(t, store.CommitBatch{ID: other, Owner: "dora"}, 64, items[:120])
	card("and a second batch of 120", 35)
	if _, err := e.s.CancelBatch(e.ctx, id, "dora"); err != nil {
		t.Fatal(err)
	}
	card("after cancelling the first", 3)

	// The second batch expires unfed: the next feed call drops its
	// members.
	time.Sleep(2100 * time.Millisecond)
	if _, err := e.s.Feed(e.ctx, tasks.QueueBulk, 100000, 10); err != nil {
		t.Fatal(err)
	}
	card("after the second batch expired", 0)

	third := bid("backlog3")
	w := e.stage(t, third, 64, items[:60])
	if err := e.s.CommitBatch(e.ctx, w, store.CommitBatch{ID: third}); err != nil {
		t.Fatal(err)
	}
	card("a third batch of 60", 2)
	if v, err := e.s.AbandonCommit(e.ctx, w, store.CommitBatch{ID: third}); err != nil || v != store.BatchAbandoned {
		t.Fatalf("abandon: %d %v", v, err)
	}
	card("after abandoning its commit", 0)
}

// TestEnqueueFed: the bulk enqueue puts fed units on asynq's queue as
// asynq.Client would (the task hash with the message, state and
// pending_since; the pending list in the order one LPUSH per task leaves;
// the queue in asynq's set of queues), leaves a unit asynq already holds
// as it is, acknowledges every unit in the same call, and pages a large
// feed. asynq's own Inspector then reads every task back.
func TestEnqueueFed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	items := make([]store.StagedItem, 600)
	for i := range items {
		items[i] = own(`{}`)
	}
	e.commit(t, store.CommitBatch{ID: bid("bulk")}, 64, items)
	refs := e.feedAll(t)
	if len(refs) != len(items) {
		t.Fatalf("fed %d units, want %d", len(refs), len(items))
	}
	queue := "q-" + e.prefix
	// One unit is on the queue already, enqueued by asynq.Client with
	// another message: the bulk enqueue must leave it alone.
	pre, err := tasks.NewUnitTask(refs[3], queue)
	if err != nil {
		t.Fatal(err)
	}
	cl := asynq.NewClientFromRedisClient(e.rdb)
	if _, err := cl.Enqueue(pre, asynq.Timeout(time.Hour)); err != nil {
		t.Fatal(err)
	}
	before := e.rdb.HGet(e.ctx, "asynq:{"+queue+"}:t:"+refs[3].TaskID(), "msg").Val()
	n, err := e.s.EnqueueFed(e.ctx, queue, refs)
	if err != nil || n != len(refs) {
		t.Fatalf("EnqueueFed: %d acknowledged, %v; want %d", n, err, len(refs))
	}
	if got := e.rdb.ZCard(e.ctx, e.prefix+"feeding").Val(); got != 0 {
		t.Fatalf("%d units left in the feeding set", got)
	}
	if got := e.rdb.HGet(e.ctx, "asynq:{"+queue+"}:t:"+refs[3].TaskID(), "msg").Val(); got != before {
		t.Error("a unit asynq held already was written again")
	}
	// The pending list: the pre-enqueued unit first (oldest, at the
	// right), then the others in feed order, as one LPUSH each leaves it.
	want := []string{refs[3].TaskID()}
	for i, r := range refs {
		if i != 3 {
			want = append(want, r.TaskID())
		}
	}
	got := e.rdb.LRange(e.ctx, asynqdata.PendingKey(queue), 0, -1).Val()
	slices.Reverse(got)
	if !slices.Equal(got, want) {
		t.Fatalf("pending list (oldest first) %d IDs, first %v; want %d, first %v", len(got), got[:3], len(want), want[:3])
	}
	if !e.rdb.SIsMember(e.ctx, "asynq:queues", queue).Val() {
		t.Error("the queue is not in asynq's set of queues")
	}
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	for i, r := range refs {
		if i == 3 {
			continue
		}
		k := "asynq:{" + queue + "}:t:" + r.TaskID()
		h := e.rdb.HGetAll(e.ctx, k).Val()
		enq, _ := asynqdata.Unit(r, queue)
		if h["msg"] != string(enq.Msg) || h["state"] != "pending" || h["pending_since"] == "" {
			t.Fatalf("unit %d: task hash %q", i, h)
		}
		if i%97 != 0 {
			continue
		}
		info, err := insp.GetTaskInfo(queue, r.TaskID())
		if err != nil {
			t.Fatalf("asynq's Inspector cannot read unit %d: %v", i, err)
		}
		var back tasks.UnitRef
		if info.Type != tasks.TypeUnit || info.State != asynq.TaskStatePending || info.MaxRetry != 10 ||
			info.Timeout != r.Timeout || json.Unmarshal(info.Payload, &back) != nil || back.BatchID != r.BatchID || back.Unit != r.Unit {
			t.Fatalf("unit %d as asynq reads it: %+v", i, info)
		}
	}
	// Enqueueing the same units again (a feeder that died after the call
	// and the reconciler after it) queues nothing twice.
	if n, err := e.s.EnqueueFed(e.ctx, queue, refs[:10]); err != nil || n != 10 {
		t.Fatalf("second EnqueueFed: %d, %v", n, err)
	}
	if l := e.rdb.LLen(e.ctx, asynqdata.PendingKey(queue)).Val(); l != int64(len(refs)) {
		t.Fatalf("pending list holds %d after a second enqueue of 10, want %d", l, len(refs))
	}
}

// TestEnqueueFedOverAsynqStates: a unit whose fixed task ID names a task
// asynq holds is fed by the state of that task. Archived (asynq gave up on
// it, and a batch retry feeds it again) or completed: queued afresh, or
// the retried items would never run. Running: not acknowledged, so that
// the reconciler feeds it again once the task is gone, since the run may
// be past the items the feed is for. Waiting to run (retry here): left as
// it is and acknowledged.
func TestEnqueueFedOverAsynqStates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	e.commit(t, store.CommitBatch{ID: bid("states")}, 64, []store.StagedItem{own(`{}`), own(`{}`), own(`{}`), own(`{}`)})
	refs := e.feedAll(t)
	if len(refs) != 4 {
		t.Fatalf("fed %d units", len(refs))
	}
	queue := "q-" + e.prefix
	cl := asynq.NewClientFromRedisClient(e.rdb)
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	key := func(r tasks.UnitRef) string { return "asynq:{" + queue + "}:t:" + r.TaskID() }
	for _, r := range refs {
		task, err := tasks.NewUnitTask(r, queue)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Enqueue(task); err != nil {
			t.Fatal(err)
		}
	}
	// refs[0]: archived, as asynq leaves a unit it gave up on.
	if err := insp.ArchiveTask(queue, refs[0].TaskID()); err != nil {
		t.Fatal(err)
	}
	// refs[1]: completed and kept, as asynq leaves a task with a retention.
	e.rdb.LRem(e.ctx, asynqdata.PendingKey(queue), 0, refs[1].TaskID())
	e.rdb.HSet(e.ctx, key(refs[1]), "state", "completed")
	e.rdb.ZAdd(e.ctx, "asynq:{"+queue+"}:completed", redis.Z{Score: 1, Member: refs[1].TaskID()})
	// refs[2]: running, as asynq's dequeue leaves it.
	e.rdb.LRem(e.ctx, asynqdata.PendingKey(queue), 0, refs[2].TaskID())
	e.rdb.LPush(e.ctx, "asynq:{"+queue+"}:active", refs[2].TaskID())
	e.rdb.HSet(e.ctx, key(refs[2]), "state", "active")
	// refs[3]: waiting for a retry.
	e.rdb.LRem(e.ctx, asynqdata.PendingKey(queue), 0, refs[3].TaskID())
	e.rdb.HSet(e.ctx, key(refs[3]), "state", "retry")
	e.rdb.ZAdd(e.ctx, "asynq:{"+queue+"}:retry", redis.Z{Score: 1, Member: refs[3].TaskID()})

	n, err := e.s.EnqueueFed(e.ctx, queue, refs)
	if err != nil || n != 3 {
		t.Fatalf("EnqueueFed: %d acknowledged, %v; want 3 (all but the running one)", n, err)
	}
	pending := e.rdb.LRange(e.ctx, asynqdata.PendingKey(queue), 0, -1).Val()
	slices.Sort(pending)
	want := []string{refs[0].TaskID(), refs[1].TaskID()}
	slices.Sort(want)
	if !slices.Equal(pending, want) {
		t.Errorf("pending list %v, want the archived and the completed units queued afresh %v", pending, want)
	}
	for _, r := range refs[:2] {
		info, err := insp.GetTaskInfo(queue, r.TaskID())
		if err != nil || info.State != asynq.TaskStatePending || info.Type != tasks.TypeUnit {
			t.Errorf("unit %s after the feed: %+v %v, want pending", r.Unit, info, err)
		}
	}
	if e.rdb.ZCard(e.ctx, "asynq:{"+queue+"}:archived").Val() != 0 || e.rdb.ZCard(e.ctx, "asynq:{"+queue+"}:completed").Val() != 0 {
		t.Error("the revived units are still in asynq's archived or completed set")
	}
	if st := e.rdb.HGet(e.ctx, key(refs[3]), "state").Val(); st != "retry" {
		t.Errorf("the unit waiting for a retry is %q now, want it left as it was", st)
	}
	stale, err := e.s.StaleFed(e.ctx, time.Now().Add(time.Hour), 10)
	if err != nil || len(stale) != 1 || stale[0].Unit != refs[2].Unit {
		t.Fatalf("left unacknowledged: %v %v, want the running unit alone", stale, err)
	}
	// Once the running task is gone (asynq's Done), the next feed of it
	// queues it.
	e.rdb.LRem(e.ctx, "asynq:{"+queue+"}:active", 0, refs[2].TaskID())
	e.rdb.Del(e.ctx, key(refs[2]))
	if n, err := e.s.EnqueueFed(e.ctx, queue, stale); err != nil || n != 1 {
		t.Fatalf("the running unit's second feed: %d, %v", n, err)
	}
	if info, err := insp.GetTaskInfo(queue, refs[2].TaskID()); err != nil || info.State != asynq.TaskStatePending {
		t.Errorf("the once-running unit: %+v %v, want pending", info, err)
	}
}

// TestUnitsTakeTheirLanes: a batch's chunk units of cheap items go to the
// cheap lane's feed and its items' own units to the solvers' feed, window
// after window, and each lane drains its feed alone: the cheap lane gets
// every chunk unit while the solvers' feed is never fed (searches filling
// the bulk queue), then the solvers' lane gets every own unit. An
// abandoned commit takes its units out of both feeds.
func TestUnitsTakeTheirLanes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	const n = 2600 // 1,300 chunks of a cheap and an own item: 2,600 units, three windows
	items := make([]store.StagedItem, n)
	for i := range items {
		items[i] = cheap(`{}`)
		if i%2 == 1 {
			items[i] = own(`{}`)
		}
	}
	id := bid("lanes")
	e.commit(t, store.CommitBatch{ID: id, Owner: "l"}, 2, items)
	drain := func(feed func(context.Context, string, int, int) ([]tasks.UnitRef, error), queue string) []tasks.UnitRef {
		var all []tasks.UnitRef
		for range 100 {
			refs, err := feed(e.ctx, queue, 1<<30, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if len(refs) == 0 {
				return all
			}
			all = append(all, refs...)
		}
		t.Fatal("a feed did not drain in 100 calls")
		return nil
	}
	chunks := drain(e.s.FeedCheap, "lane-c-"+e.prefix)
	if len(chunks) != n/2 {
		t.Fatalf("the cheap lane got %d units, want the %d chunks' units", len(chunks), n/2)
	}
	for j, r := range chunks {
		if r.Unit != tasks.ChunkUnit(j) || tasks.UnitQueue(r.Unit) != tasks.QueueCheapBulk {
			t.Fatalf("cheap lane unit %d is %s, want %s", j, r.Unit, tasks.ChunkUnit(j))
		}
	}
	owns := drain(e.s.Feed, "lane-x-"+e.prefix)
	if len(owns) != n/2 {
		t.Fatalf("the solvers' lane got %d units, want the %d own units", len(owns), n/2)
	}
	for k, r := range owns {
		if r.Unit != tasks.OwnUnit(2*k+1) || tasks.UnitQueue(r.Unit) != tasks.QueueBulk {
			t.Fatalf("solvers' lane unit %d is %s, want %s", k, r.Unit, tasks.OwnUnit(2*k+1))
		}
	}
	for _, f := range []string{"feed", "feed:cheap"} {
		if left := e.rdb.ZCard(e.ctx, e.prefix+f).Val(); left != 0 {
			t.Fatalf("%s holds %d members once both lanes drained", f, left)
		}
	}

	// An abandoned commit of a mixed batch leaves neither feed holding
	// its units or its refill marks.
	aid := bid("lanes-abandon")
	cb := store.CommitBatch{ID: aid, Owner: "a"}
	w := e.stage(t, aid, 2, items)
	if err := e.s.CommitBatch(e.ctx, w, cb); err != nil {
		t.Fatal(err)
	}
	if got, err := e.s.AbandonCommit(e.ctx, w, cb); err != nil || got != store.BatchAbandoned {
		t.Fatalf("abandon: %d %v", got, err)
	}
	for _, f := range []string{"feed", "feed:cheap"} {
		if left := e.rdb.ZCard(e.ctx, e.prefix+f).Val(); left != 0 {
			t.Fatalf("%s holds %d members of an abandoned batch", f, left)
		}
	}
}

// TestCheapLaneFairness: in the cheap lane as in the solvers', a key's
// chunks sent after another key's 1,500 come out within the next feeds,
// not after them, though the solvers' feed never moves; and a batch of
// cheap items leaves no refill mark in the solvers' feed, whose feeds
// would otherwise move its windows ahead of the cheap lane.
func TestCheapLaneFairness(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	big := make([]store.StagedItem, 1500)
	for i := range big {
		big[i] = cheap(`{}`)
	}
	e.commit(t, store.CommitBatch{ID: bid("ca"), Owner: "ca"}, 1, big)
	if n := e.rdb.ZCard(e.ctx, e.prefix+"feed").Val(); n != 0 {
		t.Fatalf("a batch of cheap items put %d members in the solvers' feed", n)
	}
	queue := "cq-" + e.prefix
	if first, err := e.s.FeedCheap(e.ctx, queue, 10, 10); err != nil || len(first) != 10 {
		t.Fatalf("first feed: %d %v", len(first), err)
	}
	// The solvers' lane feeds too, as workers do after each unit; it
	// has nothing, and must move nothing.
	if refs, err := e.s.Feed(e.ctx, "q-"+e.prefix, 10, 10); err != nil || len(refs) != 0 {
		t.Fatalf("the solvers' feed gave %v %v", refs, err)
	}
	e.commit(t, store.CommitBatch{ID: bid("cb"), Owner: "cb"}, 1, []store.StagedItem{cheap(`{}`), cheap(`{}`), cheap(`{}`)})
	seen := 0
	for range 2 {
		refs, err := e.s.FeedCheap(e.ctx, queue, 1000, 5)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range refs {
			if r.BatchID == bid("cb") {
				seen++
			}
		}
	}
	if seen != 3 {
		t.Fatalf("only %d of cb's 3 chunks came out in the 10 units after it was sent", seen)
	}
}
