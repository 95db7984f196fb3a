//go:build fault

package fault

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// The two scenarios here kill, with SIGKILL, a worker whose batch item
// holds what other items of its key wait for: one of the key's expensive
// slots (MAX_EXPENSIVE_PER_KEY, with items over the cap parked in
// pq:owner:<key>:parked), or the lead of a solve that identical items
// wait on (pq:solve:<key>:item, the waiters in pq:solve:<key>:parked).
// Nothing of the dead worker's is given back by a script: its slot and
// lead end only with their lease (worker.SolveLease), unless a redelivery
// of the same item takes them over. Each scenario checks that every item
// completes with the optimal answer, that the batch counts end exact,
// that nothing is left holding a slot, a lead or a place in line, and
// that the key's quota count is 0; then it waits for asynq's own
// recovery of the dead worker's originals (a minute or two after the
// kill), which find their items ended, and checks that they changed none
// of it.

// batchKillBound is how long after the kill the scenarios wait for
// asynq to recover and run the dead worker's originals. They are due 60 s
// after the kill at most (their lease, 30 s, plus the recoverer's 30 s
// cutoff); a standby worker started then recovers them at once
// (waitOriginals), and without it the survivors' recoverers would at their
// second minute, about 2 min 5 s after the kill.
const batchKillBound = 150 * time.Second

// standbyAfter is when after the kill waitOriginals starts its standby
// worker: once the originals are due, with a little margin.
const standbyAfter = 62 * time.Second

// testBatchItemWorkerKill runs the two scenarios side by side: each has
// its own cluster, and both spend most of their time waiting for asynq.
func testBatchItemWorkerKill(t *testing.T) {
	for _, sc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"SlotHolder", testBatchSlotWorkerKill},
		{"SolveLead", testBatchLeadWorkerKill},
	} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			timed(t)
			sc.f(t)
		})
	}
}

// testBatchSlotWorkerKill: one key's batch of six hard boards (1.6-3.5 s
// of CPU each, in units of their own) on the flood cluster (three workers
// of two slots, the key's cap 3): three items hold the key's slots and the
// other three are parked, waiting for one. The worker running the longest of
// the slot holders is killed, and with it whatever else it ran. The
// watchdog re-drives the dead worker's units; a redelivery holds the same
// slot (its member is the item's ID), so it runs at once, and its end
// frees the slot for the parked items. Every item completes with the
// optimal answer, the killed items on a second attempt; the batch counts
// end exact; no slot is held, nothing is parked or leads a solve; the
// key's quota count is 0. asynq's recovery of the originals later (on a
// survivor or a standby worker, see waitOriginals) changes none of it.
func testBatchSlotWorkerKill(t *testing.T) {
	hs := hardSet(t, "p75", "p74", "p73", "p75t", "p72", "p73t") // the longest first
	o := newOracle()
	expectHard(t, o, hs) // before the cluster, so that it takes no CPU from it
	c := newFloodCluster(t)
	c.key = floodKey
	w := newWorkload()
	hard := w.addHardBatch(c, hs)
	batchID := onlyBatch(t, w)
	rank := map[string]int{} // item -> its board's place in hs (0: the longest)
	for id, h := range hard {
		rank[id] = slices.IndexFunc(hs, func(x hard15) bool { return x.name == h.name })
	}

	// Kill once the key holds its cap of slots with every other item
	// parked behind them: the worker of the longest slot holder, as one
	// worker's record names it (a delivery that was told to wait stays in
	// its worker's record until the next beat, so an item that two
	// records name is passed over).
	var (
		victim         *proc
		killed         []string // the victim's slot holders
		slots          []string
		parked         int64
		holdersMessage string
	)
	if !pollUntil(60*time.Second, 5*time.Millisecond, func() bool {
		slots, parked = c.ownerSlots(t, floodOwner), c.ownerParked(t, floodOwner)
		if len(slots) != floodCap || parked != int64(len(hs)-floodCap) {
			return false
		}
		holders := c.itemHolders(t, batchID)
		holdersMessage = fmt.Sprint(holders)
		sort.Slice(slots, func(i, j int) bool { return rank[slots[i]] < rank[slots[j]] })
		for _, id := range slots {
			if ps := holders[id]; len(ps) == 1 {
				victim, killed = ps[0], nil
				for _, s := range slots {
					if ps := holders[s]; len(ps) == 1 && ps[0] == victim {
						killed = append(killed, s)
					}
				}
				return true
			}
		}
		return false
	}) {
		t.Fatalf("the key never held its %d slots with the other %d items parked and a slot holder on one worker: slots %v, parked %d, holders %s; %s",
			floodCap, len(hs)-floodCap, slots, parked, holdersMessage, c.describeQueues())
	}
	for _, id := range killed {
		if tr, _ := c.getTask(id, 0); tr.State != apitype.TaskStateActive {
			t.Fatalf("precondition: %s (%s) is %s right before the kill, want active: pick longer boards", id, hard[id].name, tr.State)
		}
	}
	k := c.killWorker(t, victim)
	t.Logf("killed %s holding the slots of %v (of the key's %v), %d items parked; its record: %v",
		victim.Name, hardNamesOf(killed, hard), hardNamesOf(slots, hard), parked, k.held)

	recs := w.verify(t, c, o, 90*time.Second)
	done := time.Since(k.at)
	checkHardRecords(t, recs, hard)
	attempts := map[string]int{}
	for _, id := range killed {
		tr := recs[id]
		attempts[hard[id].name] = tr.Attempts
		if tr.Attempts < 2 || tr.CompletedAt == nil || !tr.CompletedAt.After(k.at) {
			t.Errorf("killed item %s (%s): attempts %d, completed %v; want completed after the kill at %s, on its redelivery (2 attempts or more)",
				id, hard[id].name, tr.Attempts, tr.CompletedAt, k.at.Format(time.StampMilli))
		}
	}
	c.checkGateClear(t, floodOwner, hs, "after the batch")
	if n := c.checkOwnerQuota(t, floodOwner, "after the batch"); n != 0 {
		t.Errorf("after the batch the key's quota counts %d unfinished tasks, want 0", n)
	}

	recovered := c.waitOriginals(t, k)
	c.checkUnchanged(t, batchID, recs)
	c.checkGateClear(t, floodOwner, hs, "after asynq's originals ran")
	if n := c.checkOwnerQuota(t, floodOwner, "after asynq's originals ran"); n != 0 {
		t.Errorf("after asynq's originals ran the key's quota counts %d unfinished tasks, want 0", n)
	}
	t.Logf("FIGURES batch slot holder killed: %d hard boards, cap %d, %d parked at the kill; killed %v (attempts %v); batch done %v after the kill; asynq ran the %d originals %v after it, changing nothing; waits %d",
		len(hs), floodCap, parked, hardNamesOf(killed, hard), attempts, done.Round(100*time.Millisecond), len(k.origs),
		recovered.Round(100*time.Millisecond), c.survivorsMetric(t, victim, "puzzleq_expensive_waits_total"))
}

// testBatchLeadWorkerKill: a batch of five copies of one hard board (3.5 s
// of CPU) on the flood cluster: the first item to run leads the solve and
// the other four wait for it, parked in the solve's parked set. The
// worker running the lead is killed while they wait. The watchdog
// re-drives the lead's unit; its redelivery leads again (the lead names
// the item), and its end moves the waiting copies back onto their queue,
// where they find its answer cached. Every copy completes with the same
// optimal answer, the lead on a second attempt and the copies from the
// cache (one solve after the kill); the batch counts end exact; nothing
// is parked and no lead is left; the key's quota count is 0. asynq's
// recovery of the originals later changes none of it.
func testBatchLeadWorkerKill(t *testing.T) {
	const copies = 5
	h := hardSet(t, "p75")[0]
	o := newOracle()
	expectHard(t, o, []hard15{h})
	c := newFloodCluster(t)
	c.key = floodKey
	w := newWorkload()
	hard := w.addHardBatch(c, slices.Repeat([]hard15{h}, copies))
	batchID := onlyBatch(t, w)
	sk := solveKeyOf(t, h)
	ctx := context.Background()

	var (
		victim *proc
		lead   string
		parked int64
	)
	if !pollUntil(60*time.Second, 5*time.Millisecond, func() bool {
		var err error
		lead, err = c.rdb.Get(ctx, "pq:solve:"+sk+":item").Result()
		if err != nil {
			return false
		}
		if parked, err = c.rdb.ZCard(ctx, "pq:solve:"+sk+":parked").Result(); err != nil || parked != copies-1 {
			return false
		}
		if ps := c.itemHolders(t, batchID)[lead]; len(ps) == 1 {
			victim = ps[0]
			return true
		}
		return false
	}) {
		t.Fatalf("never saw one worker lead the solve with the other %d copies waiting: lead %q, %d parked; %s",
			copies-1, lead, parked, c.describeQueues())
	}
	if tr, _ := c.getTask(lead, 0); tr.State != apitype.TaskStateActive {
		t.Fatalf("precondition: the lead %s is %s right before the kill, want active: pick a longer board", lead, tr.State)
	}
	k := c.killWorker(t, victim)
	t.Logf("killed %s leading the solve (item %s) with %d copies waiting; its record: %v", victim.Name, lead, parked, k.held)

	recs := w.verify(t, c, o, 90*time.Second)
	done := time.Since(k.at)
	checkHardRecords(t, recs, hard)
	if tr := recs[lead]; tr.Attempts < 2 || tr.CompletedAt == nil || !tr.CompletedAt.After(k.at) {
		t.Errorf("the lead %s: attempts %d, completed %v; want completed after the kill at %s, on its redelivery (2 attempts or more)",
			lead, tr.Attempts, tr.CompletedAt, k.at.Format(time.StampMilli))
	}
	// One solve after the kill, the lead's: the survivors answered every
	// copy from the cache (the victim had cached nothing).
	hits := c.survivorsMetric(t, victim, "puzzleq_worker_cache_hits_total")
	if hits != copies-1 {
		t.Errorf("the survivors answered %d items from the cache, want the %d copies that waited for the lead", hits, copies-1)
	}
	c.checkGateClear(t, floodOwner, []hard15{h}, "after the batch")
	if n := c.checkOwnerQuota(t, floodOwner, "after the batch"); n != 0 {
		t.Errorf("after the batch the key's quota counts %d unfinished tasks, want 0", n)
	}

	recovered := c.waitOriginals(t, k)
	c.checkUnchanged(t, batchID, recs)
	c.checkGateClear(t, floodOwner, []hard15{h}, "after asynq's originals ran")
	if n := c.checkOwnerQuota(t, floodOwner, "after asynq's originals ran"); n != 0 {
		t.Errorf("after asynq's originals ran the key's quota counts %d unfinished tasks, want 0", n)
	}
	t.Logf("FIGURES batch solve lead killed: %d copies of %s, %d waiting at the kill; the lead's attempts %d, %d copies from the cache; batch done %v after the kill; asynq ran the %d originals %v after it, changing nothing",
		copies, h.name, parked, recs[lead].Attempts, hits, done.Round(100*time.Millisecond), len(k.origs), recovered.Round(100*time.Millisecond))
}

// onlyBatch is the one batch of w.
func onlyBatch(t *testing.T, w *workload) string {
	t.Helper()
	if len(w.batches) != 1 {
		t.Fatalf("%d batches, want 1", len(w.batches))
	}
	for id := range w.batches {
		return id
	}
	return ""
}

// solveKeyOf is the solve key of h's board (worker.SolveKey), which names
// its lead and waiters in Redis.
func solveKeyOf(t *testing.T, h hard15) string {
	t.Helper()
	p, err := puzzle.Decode([]byte(h.req))
	if err != nil {
		t.Fatalf("%s: %v", h.name, err)
	}
	return worker.SolveKey(p)
}

// ownerSlots returns the items and tasks holding owner's live slots
// (keys.ownerRunning).
func (c *cluster) ownerSlots(t *testing.T, owner string) []string {
	t.Helper()
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	m, err := c.rdb.ZRangeByScore(context.Background(), "pq:owner:"+owner+":running", &redis.ZRangeBy{Min: now, Max: "+inf"}).Result()
	if err != nil {
		t.Errorf("%s's slots: %v", owner, err)
	}
	return m
}

// ownerParked counts owner's runs waiting for a slot (keys.ownerParked).
func (c *cluster) ownerParked(t *testing.T, owner string) int64 {
	t.Helper()
	n, err := c.rdb.ZCard(context.Background(), "pq:owner:"+owner+":parked").Result()
	if err != nil {
		t.Errorf("%s's parked runs: %v", owner, err)
	}
	return n
}

// itemHolders returns, by item ID, the workers whose heartbeat records
// name a delivery of the item's own unit of batch (the unit's asynq task,
// or a watchdog's copy of it).
func (c *cluster) itemHolders(t *testing.T, batch string) map[string][]*proc {
	t.Helper()
	out := map[string][]*proc{}
	for _, p := range c.workers {
		if p.Exited() {
			continue
		}
		_, held := c.heldBy(t, p)
		seen := map[string]bool{}
		for _, ht := range held {
			unit, ok := strings.CutPrefix(ht.ID, batch+":")
			if !ok {
				continue
			}
			unit, _, _ = strings.Cut(unit, "~") // a copy: tasks.RedriveID
			if chunk, n, err := tasks.ParseUnit(unit); err == nil && !chunk {
				if id := apitype.ItemID(batch, n); !seen[id] {
					seen[id] = true
					out[id] = append(out[id], p)
				}
			}
		}
	}
	return out
}

// workerKill is a worker killed with SIGKILL: when, and the asynq tasks its
// heartbeat record held that asynq still listed right after the kill
// (the originals its recovery runs again).
type workerKill struct {
	at    time.Time
	held  []worker.HeldTask
	origs []worker.HeldTask
}

// killWorker kills p with SIGKILL, reads what its record held (the
// watchdog cannot have reaped it yet: WORKER_DEAD_AFTER is 2 s) and waits
// for it to exit.
func (c *cluster) killWorker(t *testing.T, p *proc) workerKill {
	t.Helper()
	p.Signal(t, syscall.SIGKILL)
	k := workerKill{at: time.Now()}
	_, k.held = c.heldBy(t, p)
	if !p.WaitExit(5 * time.Second) {
		t.Fatalf("%s still runs 5 s after SIGKILL", p.Name)
	}
	for _, ht := range k.held {
		if _, err := c.insp.GetTaskInfo(ht.Queue, ht.ID); err == nil {
			k.origs = append(k.origs, ht)
		} else if !errors.Is(err, asynq.ErrTaskNotFound) {
			t.Fatalf("look up %s in %s: %v", ht.ID, ht.Queue, err)
		}
	}
	if len(k.origs) == 0 {
		t.Fatalf("precondition: asynq lists none of the tasks %s held at the kill (%v)", p.Name, k.held)
	}
	return k
}

// waitOriginals waits until asynq has recovered and run the originals of
// k (gone from asynq), and nothing else is queued or running, within
// batchKillBound of the kill; it returns how long after the kill that was.
// standbyAfter the kill it starts one more worker, as a restarted worker
// would come up: asynq's recoverer runs at a server's start and then every
// minute from it, and the survivors' started moments before the kill, so
// without it the originals, due 60 s after the kill, would wait for their
// second minute (2 min 3-4 s after the kill, measured).
func (c *cluster) waitOriginals(t *testing.T, k workerKill) time.Duration {
	t.Helper()
	time.Sleep(time.Until(k.at.Add(standbyAfter)))
	c.startWorker(nil)
	if !pollUntil(time.Until(k.at.Add(batchKillBound)), 250*time.Millisecond, func() bool {
		for _, og := range k.origs {
			if !c.gone(t, og.Queue, og.ID) {
				return false
			}
		}
		return c.queued() == 0 && len(c.activeTasks()) == 0
	}) {
		t.Fatalf("asynq did not recover and run the killed worker's originals %v within %v of the kill; %s", k.origs, batchKillBound, c.describeQueues())
	}
	return time.Since(k.at)
}

// checkUnchanged asserts that batch's counts are still exact and that no
// item's record changed since recs.
func (c *cluster) checkUnchanged(t *testing.T, batch string, recs map[string]apitype.Task) {
	t.Helper()
	for id, now := range c.checkBatch(batch, len(recs)) {
		was := recs[id]
		if now.State != was.State || now.Attempts != was.Attempts || string(now.Result) != string(was.Result) ||
			now.CompletedAt == nil || was.CompletedAt == nil || !now.CompletedAt.Equal(*was.CompletedAt) {
			t.Errorf("item %s changed when asynq's originals ran: %s, attempts %d, completed %v; was %s, attempts %d, completed %v",
				id, now.State, now.Attempts, now.CompletedAt, was.State, was.Attempts, was.CompletedAt)
		}
	}
}

// gateClearWait is how long checkGateClear lets a redundant run finish.
const gateClearWait = 10 * time.Second

// checkGateClear asserts that nothing of owner's expensive work is left
// in the gate's keys (internal/store/keys.go): no slot held, not even an
// expired one; no run parked for a slot or marked promoted into one; and
// for each board of hs no solve lease, waiters, batch-item lead or items
// waiting for it.
func (c *cluster) checkGateClear(t *testing.T, owner string, hs []hard15, when string) {
	t.Helper()
	ctx := context.Background()
	base := "pq:owner:" + owner
	keys := []string{base + ":running", base + ":parked", base + ":parked:promoted"}
	for _, h := range hs {
		sk := "pq:solve:" + solveKeyOf(t, h)
		keys = append(keys, sk, sk+":waiters", sk+":item", sk+":parked")
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	// A redundant copy (the watchdog's, or a redelivery) of an item that
	// has already ended may still be running when the batch is done: it
	// holds its slot and lead until it sees the item ended, a moment
	// later on a loaded machine. What is left after gateClearWait is a
	// leak.
	deadline := time.Now().Add(gateClearWait)
	for time.Now().Before(deadline) {
		n, err := c.rdb.Exists(ctx, keys...).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, k := range keys {
		n, err := c.rdb.Exists(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			continue
		}
		typ, _ := c.rdb.Type(ctx, k).Result()
		var v any
		switch typ {
		case "zset":
			v, _ = c.rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		case "hash":
			v, _ = c.rdb.HGetAll(ctx, k).Result()
		default:
			v, _ = c.rdb.Get(ctx, k).Result()
		}
		t.Errorf("%s: %s is left: %v", when, k, v)
	}
}

// survivorsMetric sums a metric over the workers of c other than dead.
func (c *cluster) survivorsMetric(t *testing.T, dead *proc, name string) int {
	t.Helper()
	n := 0
	for _, p := range c.workers {
		if p != dead {
			n += c.workerMetric(t, p, name)
		}
	}
	return n
}

// hardNamesOf names the boards of ids, sorted.
func hardNamesOf(ids []string, hard map[string]hard15) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		out = append(out, hard[id].name)
	}
	sort.Strings(out)
	return out
}
