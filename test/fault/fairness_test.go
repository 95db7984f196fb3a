//go:build fault

package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestFairness proves issue 11's fairness clause against real processes:
// while key A's big batch runs on one worker, key B's batch of 100 items
// is fed next to A's running units (docs/batches.md, "Fairness") and is
// done, with the exact answers, while most of A is still unfinished;
// meanwhile the backlog and the bulk queue, what KEDA's triggers read,
// count every unit of A that waits, however little of it the feed's
// window holds.
// The same run with a bulk queue deep enough to hold all of A (FEED_DEPTH
// 100000) shows the contrast, B queued behind A; that run only logs.
func TestFairness(t *testing.T) {
	for _, tc := range []struct {
		name   string
		depth  int
		assert bool
	}{{"FeedDepth64", 64, true}, {"FeedDepth100000", 100000, false}} {
		t.Run(tc.name, func(t *testing.T) { testFairness(t, tc.depth, tc.assert) })
	}
}

// The two keys of the fairness scenario.
const (
	bigOwner, bigKey     = "big", "big-secret-key-0123"
	smallOwner, smallKey = "small", "small-secret-key"
)

// Sizes of the fairness scenario. An 8-puzzle is a table lookup (tens of
// microseconds with its decoding and its write), so A needs many: 750,000
// items, 11,719 units of 64 (eleven feed windows, so the refill marks are
// in play), which one worker with two slots needs about 30 s for on this
// 2-core machine. There are only 181,440 8-puzzles: A is 150,000 distinct
// ones five times over (cheap items are solved, never looked up in the
// result cache, so a repeat costs what the first did), and B's are 100
// others.
const (
	fairBig      = 750000
	fairDistinct = 150000
	fairSmall    = 100
	fairChunk    = 64
	fairSlots    = 2 // the worker's WORKER_CONCURRENCY
)

func testFairness(t *testing.T, depth int, assert bool) {
	settings := map[string]string{
		"API_KEYS":            bigOwner + ":" + bigKey + "," + smallOwner + ":" + smallKey,
		"MAX_PENDING_PER_KEY": "1000000", "RATE_LIMIT_BURST": "1000", "CHUNK_SIZE": strconv.Itoa(fairChunk),
		"FEED_DEPTH": strconv.Itoa(depth),
	}
	c := newCluster(t, clusterOpts{api: settings, worker: map[string]string{"FEED_DEPTH": strconv.Itoa(depth), "WORKER_CONCURRENCY": strconv.Itoa(fairSlots)}, workers: 1})
	hc := &http.Client{Timeout: 60 * time.Second}
	base := c.api.URL()
	reqs := eightPuzzles(fairDistinct+fairSmall, 41)
	small := reqs[fairDistinct:]
	big := make([]string, 0, fairBig)
	for len(big) < fairBig {
		big = append(big, reqs[:min(fairDistinct, fairBig-len(big))]...)
	}

	start := time.Now()
	aID := submitAs(t, hc, base, bigKey, ndjsonBody(big), "application/x-ndjson")
	submitted := time.Since(start)
	// B comes once A is running and the feeders have filled the bulk
	// queue as deep as it may go: with a deep queue that takes a second or
	// two more, as all of A's units move onto it.
	ctx := context.Background()
	if !pollUntil(20*time.Second, 10*time.Millisecond, func() bool {
		s := c.signal(t, ctx, aID, "-")
		return s.aEnded > 0 && s.feeding == 0 && (s.pending >= int64(depth)/2 || s.unmoved == 0 && s.feed == 0)
	}) {
		t.Fatalf("A's batch did not start and fill the queue within 20 s: %s", describe(c.signal(t, ctx, aID, "-")))
	}
	aAtB := batchStateAs(t, hc, base, bigKey, aID)
	bStart := time.Now()
	bID := submitAs(t, hc, base, smallKey, batchBody(small), "application/json")

	// Sample what KEDA reads while B runs and a little after.
	var samples []signalSample
	sample := func() signalSample {
		s := c.signal(t, ctx, aID, bID)
		samples = append(samples, s)
		return s
	}
	first := sample()
	var bDone time.Duration
	var aAtBDone apitype.Batch
	bLimit := 40 * time.Second
	if !assert {
		bLimit = 10 * time.Second // B waits behind A: look only this long
	}
	for deadline := bStart.Add(bLimit); time.Now().Before(deadline); {
		b := batchStateAs(t, hc, base, smallKey, bID)
		if b.Done {
			bDone = time.Since(bStart)
			aAtBDone = batchStateAs(t, hc, base, bigKey, aID)
			if b.Counts.Completed != fairSmall {
				t.Errorf("B done with %+v, want %d completed", b.Counts, fairSmall)
			}
			break
		}
		if time.Since(samples[len(samples)-1].at) > 250*time.Millisecond {
			sample()
		}
		time.Sleep(20 * time.Millisecond)
	}
	bState := batchStateAs(t, hc, base, smallKey, bID)
	aNow := batchStateAs(t, hc, base, bigKey, aID)
	// A few more seconds of A alone, for the signal's trend.
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		sample()
	}
	last := samples[len(samples)-1]
	aRate := float64(last.aEnded-first.aEnded) / last.at.Sub(first.at).Seconds()
	var bAhead int64
	for _, s := range samples {
		bAhead = max(bAhead, s.bAhead)
	}

	if bDone == 0 {
		t.Logf("FIGURES fairness feed_depth=%d big=%d small=%d submit_big=%v small_done=NO after %v (small %d/%d ended) units_ahead_of_small=%d (est. wait %.0fs) big_ended_at_small_submit=%.1f%% big_ended_now=%.1f%% big_rate=%.0f items/s est_big_total=%.0fs",
			depth, fairBig, fairSmall, submitted.Round(time.Millisecond), bLimit, bState.Counts.Completed+bState.Counts.Failed, fairSmall,
			bAhead, float64(bAhead*fairChunk)/aRate, percent(ended(aAtB), fairBig), percent(ended(aNow), fairBig), aRate, fairBig/aRate)
	} else {
		t.Logf("FIGURES fairness feed_depth=%d big=%d small=%d submit_big=%v small_done=%v units_ahead_of_small=%d big_ended_at_small_submit=%.1f%% big_ended_at_small_done=%.1f%% big_rate=%.0f items/s est_big_total=%.0fs",
			depth, fairBig, fairSmall, submitted.Round(time.Millisecond), bDone.Round(time.Millisecond), bAhead,
			percent(ended(aAtB), fairBig), percent(ended(aAtBDone), fairBig), aRate, fairBig/aRate)
	}
	logSignal(t, samples)
	t.Logf("redis used_memory with A running: %s", c.usedMemory(t, ctx))
	if !assert {
		return
	}
	if bDone == 0 {
		t.Fatalf("B (%d items) not done %v after it was submitted; A at %.1f%% ended; counts %+v",
			fairSmall, bLimit, percent(ended(aNow), fairBig), bState.Counts)
	}
	checkResultsAs(t, hc, base, smallKey, bID, small)
	if f := percent(ended(aAtBDone), fairBig); f >= 50 {
		t.Errorf("B was done only with %.1f%% of A ended: it waited behind A, want A under 50%%", f)
	}
	// The mechanism: B's units enter the bulk list behind at most about
	// FEED_DEPTH of A's (feeders that run at once may each top it up).
	for _, s := range samples {
		if s.bAhead > int64(depth)+3*feedSlack {
			t.Errorf("B's unit had %d tasks ahead of it in the bulk list, want about FEED_DEPTH %d at most: %s", s.bAhead, depth, describe(s))
			break
		}
	}
	checkSignal(t, samples)
}

// feedSlack is how far past FEED_DEPTH feeders that run at once may fill
// the bulk list (each checks its length, then enqueues up to this many).
const feedSlack = 64

// signalSample is one atomic read of what KEDA's bulk triggers see.
type signalSample struct {
	at      time.Time
	feed    int64 // ZCARD of the feed
	backlog int64 // ZCARD of the backlog (KEDA's third trigger): one per 50 unfed units
	pending int64 // LLEN of the bulk queue's pending list (the second)
	feeding int64 // units taken from the feed, not yet enqueued
	unmoved int64 // A's units still in its list, not yet in the feed
	aUnits  int64 // A's units not yet started, from its pending items
	aEnded  int64 // A's items ended
	bAhead  int64 // tasks ahead of B's first unit in the bulk list (-1: not there)
}

// signal reads the feed, the bulk list and A's counts in one MULTI, so the
// numbers are of one moment.
func (c *cluster) signal(t *testing.T, ctx context.Context, aID, bID string) signalSample {
	t.Helper()
	var feed, backlog, pending, feeding, unmoved *redis.IntCmd
	var counts *redis.SliceCmd
	var bPos *redis.IntCmd
	if _, err := c.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		feed = p.ZCard(ctx, "pq:feed:cheap") // 8-puzzles: the cheap lane's feed
		backlog = p.ZCard(ctx, "pq:backlog")
		pending = p.LLen(ctx, asynqdata.PendingKey(tasks.QueueCheapBulk))
		feeding = p.ZCard(ctx, "pq:feeding")
		unmoved = p.LLen(ctx, "pq:batch:"+aID+":units")
		counts = p.HMGet(ctx, "pq:batch:"+aID, "pending", "completed", "failed", "canceled")
		bPos = p.LPos(ctx, asynqdata.PendingKey(tasks.QueueCheapBulk), bID+":c0", redis.LPosArgs{})
		return nil
	}); err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	ahead := int64(-1)
	if bPos.Err() == nil {
		ahead = pending.Val() - 1 - bPos.Val() // asynq pushes on the left, pops on the right
	}
	num := func(i int) int64 {
		s, _ := counts.Val()[i].(string)
		n, _ := strconv.ParseInt(s, 10, 64)
		return n
	}
	return signalSample{at: time.Now(), feed: feed.Val(), backlog: backlog.Val(), pending: pending.Val(), feeding: feeding.Val(), unmoved: unmoved.Val(),
		aUnits: int64(math.Ceil(float64(num(0)) / fairChunk)), aEnded: num(1) + num(2) + num(3), bAhead: ahead}
}

// backlogUnits is the store's: the waiting units one backlog member
// stands for.
const backlogUnits = 50

// checkSignal asserts what the backlog promises KEDA (docs/batches.md,
// "Fairness"): while A has units waiting, KEDA's two bulk triggers (the
// backlog, 50 units a member, and the bulk list) count every one of them,
// whatever the feed's window holds, and the count shrinks as A runs.
func checkSignal(t *testing.T, ss []signalSample) {
	t.Helper()
	for _, s := range ss {
		if s.aUnits == 0 {
			continue
		}
		signal := s.backlog*backlogUnits + s.pending
		if signal == 0 {
			t.Errorf("%s: KEDA would read 0 with %d of A's units waiting", s.at.Format("15:04:05.000"), s.aUnits)
		}
		// A unit between the feed and the queue is in the feeding set,
		// and one the worker has taken but not started (fairSlots at
		// most) is in neither.
		if signal+s.feeding+fairSlots < s.aUnits {
			t.Errorf("%s: backlog %d x %d + bulk list %d + feeding %d < A's %d waiting units: KEDA does not see them all",
				s.at.Format("15:04:05.000"), s.backlog, backlogUnits, s.pending, s.feeding, s.aUnits)
		}
	}
	first, last := ss[0], ss[len(ss)-1]
	if first.aUnits == 0 || last.aUnits >= first.aUnits {
		t.Errorf("A's waiting units went from %d to %d: A did not progress", first.aUnits, last.aUnits)
	}
	if f, l := first.backlog*backlogUnits+first.pending, last.backlog*backlogUnits+last.pending; l >= f {
		t.Errorf("KEDA's count went from %d to %d, want it shrinking", f, l)
	}
}

func describe(s signalSample) string {
	return fmt.Sprintf("backlog=%d bulk_pending=%d (KEDA counts %d units) feed=%d feeding=%d unmoved=%d | A waiting units=%d ended=%d | ahead of B=%d",
		s.backlog, s.pending, s.backlog*backlogUnits+s.pending, s.feed, s.feeding, s.unmoved, s.aUnits, s.aEnded, s.bAhead)
}

// logSignal logs a handful of the samples, evenly spaced.
func logSignal(t *testing.T, ss []signalSample) {
	t.Helper()
	step := max(1, len(ss)/12)
	var b strings.Builder
	for i := 0; i < len(ss); i += step {
		s := ss[i]
		fmt.Fprintf(&b, "\n  +%5.1fs %s", s.at.Sub(ss[0].at).Seconds(), describe(s))
	}
	t.Logf("signal while A runs:%s", b.String())
}

// usedMemory is Redis's used_memory_human.
func (c *cluster) usedMemory(t *testing.T, ctx context.Context) string {
	t.Helper()
	info, err := c.rdb.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory_human:"); ok {
			return v
		}
	}
	return "?"
}

func ended(b apitype.Batch) int { return b.Counts.Completed + b.Counts.Failed + b.Counts.Canceled }

func percent(n, of int) float64 { return 100 * float64(n) / float64(of) }

// ndjsonBody is reqs as one request a line.
func ndjsonBody(reqs []string) []byte {
	var buf bytes.Buffer
	for _, r := range reqs {
		buf.WriteString(r)
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

// submitAs posts a batch with key and returns its ID.
func submitAs(t *testing.T, hc *http.Client, base, key string, body []byte, ctype string) string {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/v1/batches", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", ctype)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ack apitype.BatchCreated
	if err := json.NewDecoder(resp.Body).Decode(&ack); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /v1/batches with %s: %d %v", key, resp.StatusCode, err)
	}
	return ack.ID
}

// checkResultsAs asserts that batch id, read with key, answered every
// request of reqs, in order, with the local solver's result.
func checkResultsAs(t *testing.T, hc *http.Client, base, key, id string, reqs []string) {
	t.Helper()
	b := getBatchAs(t, hc, base, key, id, 1000)
	if len(b.Tasks) != len(reqs) {
		t.Fatalf("batch %s lists %d items, want %d", id, len(b.Tasks), len(reqs))
	}
	for i, tr := range b.Tasks {
		if tr.ID != apitype.ItemID(id, i) {
			t.Fatalf("batch %s lists item %s at %d", id, tr.ID, i)
		}
		if want := solveLocal(t, reqs[i]); tr.State != apitype.TaskStateCompleted || !bytes.Equal(compact(tr.Result), want) {
			t.Errorf("item %d (%s): %s %.100s, want completed %.100s", i, tr.ID, tr.State, tr.Result, want)
		}
	}
}

// batchStateAs reads a batch's counts (no items) with key.
func batchStateAs(t *testing.T, hc *http.Client, base, key, id string) apitype.Batch {
	t.Helper()
	return getBatchAs(t, hc, base, key, id, 1)
}

// getBatchAs reads batch id with key, listing up to limit items.
func getBatchAs(t *testing.T, hc *http.Client, base, key, id string, limit int) apitype.Batch {
	t.Helper()
	resp := getAs(t, hc, base+"/v1/batches/"+id+"?limit="+strconv.Itoa(limit), key)
	defer resp.Body.Close()
	var b apitype.Batch
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/batches/%s: %d %v", id, resp.StatusCode, err)
	}
	return b
}

// getAs sends GET url with key as its bearer token; the caller closes the
// body.
func getAs(t *testing.T, hc *http.Client, url, key string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
