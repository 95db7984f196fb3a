//go:build fault

package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/tasks"
)

// The tests in this file prove the batch durability contract of issue 11
// against real processes: whatever dies when, every item of a batch that
// was recorded runs and completes once with the exact answer, an
// idempotent retry never answers with a batch that cannot finish, and the
// per-key quota equals the key's unfinished items.

// TestBatchDurability runs the scenarios side by side; each has its own
// Redis, APIs and workers.
func TestBatchDurability(t *testing.T) {
	t.Run("group", func(t *testing.T) {
		t.Run("APIKilledMidSubmit", func(t *testing.T) { t.Parallel(); testAPIKilledMidSubmit(t, false) })
		t.Run("APIKilledMidSubmitIdempotent", func(t *testing.T) { t.Parallel(); testAPIKilledMidSubmit(t, true) })
		t.Run("WorkerKilledMidChunk", func(t *testing.T) { t.Parallel(); testWorkerKilledMidChunk(t) })
		t.Run("QuotaUnderExpiryAndCancels", func(t *testing.T) { t.Parallel(); testQuotaExpiryAndCancels(t) })
		t.Run("APIKilledMidSingles", func(t *testing.T) { t.Parallel(); testAPIKilledMidSingles(t) })
		t.Run("APIKilledMidCancel", func(t *testing.T) { t.Parallel(); testAPIKilledMidCancel(t) })
	})
}

// The API key every scenario submits with, so the quota is in play.
const (
	faultOwner = "alice"
	faultKey   = "alice-secret-key"
)

// authed is an HTTP exchange with the API key.
func authed(t *testing.T, hc *http.Client, base, method, path string, body []byte, hdr map[string]string) (int, http.Header, []byte, error) {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+faultKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// mustAuthed is authed that has to answer want.
func mustAuthed(t *testing.T, hc *http.Client, base, method, path string, body []byte, want int) []byte {
	t.Helper()
	code, _, b, err := authed(t, hc, base, method, path, body, nil)
	if err != nil || code != want {
		t.Fatalf("%s %s: %d %v, want %d: %.300s", method, path, code, err, want, b)
	}
	return b
}

// batchState reads a batch's counts (no items) with the key.
func batchState(t *testing.T, hc *http.Client, base, id string, wait time.Duration) apitype.Batch {
	t.Helper()
	var b apitype.Batch
	path := "/v1/batches/" + id + "?limit=1"
	if wait > 0 {
		path += "&wait=" + wait.String()
	}
	if err := json.Unmarshal(mustAuthed(t, hc, base, "GET", path, nil, http.StatusOK), &b); err != nil {
		t.Fatal(err)
	}
	return b
}

// waitBatchDone long-polls until the batch is done or d passes.
func waitBatchDone(t *testing.T, hc *http.Client, base, id string, d time.Duration) apitype.Batch {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		w := min(time.Until(deadline), 20*time.Second).Round(time.Second)
		b := batchState(t, hc, base, id, max(w, time.Second))
		if b.Done || time.Now().After(deadline) {
			return b
		}
	}
}

// batchItems reads every item of a batch, page by page.
func batchItems(t *testing.T, hc *http.Client, base, id string) []apitype.Task {
	t.Helper()
	var out []apitype.Task
	cursor := "0"
	for {
		var page apitype.Batch
		if err := json.Unmarshal(mustAuthed(t, hc, base, "GET", "/v1/batches/"+id+"?limit=1000&cursor="+cursor, nil, http.StatusOK), &page); err != nil {
			t.Fatal(err)
		}
		out = append(out, page.Tasks...)
		if page.NextCursor == nil {
			return out
		}
		cursor = *page.NextCursor
	}
}

// recordCensus reads every record in Redis and returns the batch IDs
// recorded and how many of owner's items have not ended: the pending and
// active counts of its batches (a batch is one record, docs/batches.md)
// plus its single tasks that are pending or active.
func (c *cluster) recordCensus(t *testing.T, owner string) (batches []string, unfinished int) {
	t.Helper()
	ctx := context.Background()
	iter := c.rdb.Scan(ctx, 0, "pq:batch:*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		id := strings.TrimPrefix(k, "pq:batch:")
		if strings.Contains(id, ":") { // a batch's requests, results or units
			continue
		}
		v, err := c.rdb.HMGet(ctx, k, "owner", "pending", "active").Result()
		if err != nil {
			t.Fatal(err)
		}
		batches = append(batches, id)
		if o, _ := v[0].(string); o != owner {
			continue
		}
		for _, n := range v[1:] {
			s, _ := n.(string)
			i, _ := strconv.Atoi(s)
			unfinished += i
		}
	}
	var keys []string
	iter = c.rdb.Scan(ctx, 0, "pq:task:*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	for start := 0; start < len(keys); start += 1000 {
		part := keys[start:min(start+1000, len(keys))]
		pipe := c.rdb.Pipeline()
		for _, k := range part {
			pipe.HMGet(ctx, k, "owner", "state")
		}
		cmds, err := pipe.Exec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range cmds {
			v := cmd.(interface{ Val() []any }).Val()
			if o, _ := v[0].(string); o != owner {
				continue
			}
			if st, _ := v[1].(string); st == "pending" || st == "active" {
				unfinished++
			}
		}
	}
	return batches, unfinished
}

// checkQuota asserts that faultOwner's quota count equals its unfinished
// items, and returns the count.
func (c *cluster) checkQuota(t *testing.T, when string) int {
	t.Helper()
	return c.checkOwnerQuota(t, faultOwner, when)
}

// checkOwnerQuota is checkQuota for another owner's key.
func (c *cluster) checkOwnerQuota(t *testing.T, owner, when string) int {
	t.Helper()
	st := store.New(c.rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	n, err := st.Pending(context.Background(), owner)
	if err != nil {
		t.Fatal(err)
	}
	_, unfinished := c.recordCensus(t, owner)
	if n != unfinished {
		t.Errorf("%s: the quota counts %d unfinished tasks, the records hold %d", when, n, unfinished)
	}
	return n
}

// unfed is how many units of a batch are not yet known to be queued: in
// the feed, or taken from it by a feeder that has not acknowledged them.
func (c *cluster) unfed(t *testing.T, batchID string) int {
	t.Helper()
	n, err := c.countUnfed(batchID)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// countUnfed is unfed for goroutines other than the test's.
func (c *cluster) countUnfed(batchID string) (int, error) {
	n := 0
	for _, set := range []string{"pq:feed", "pq:feed:cheap", "pq:feeding"} {
		iter := c.rdb.ZScan(context.Background(), set, 0, batchID+"/*", 1000).Iterator()
		for iter.Next(context.Background()) {
			n++
		}
		if err := iter.Err(); err != nil {
			return 0, err
		}
	}
	return n / 2, nil // ZSCAN yields each member and its score
}

// getTaskAuthed reads one task with the key.
func (c *cluster) getTaskAuthed(t *testing.T, hc *http.Client, id string) (apitype.Task, bool) {
	t.Helper()
	var tr apitype.Task
	code, _, b, err := authed(t, hc, c.api.URL(), "GET", "/v1/tasks/"+id, nil, nil)
	if err != nil || code != http.StatusOK {
		return tr, false
	}
	return tr, json.Unmarshal(b, &tr) == nil
}

// startReplica starts one more API process on the cluster's Redis.
func (c *cluster) startReplica(t *testing.T, name string, settings map[string]string) *proc {
	t.Helper()
	env := map[string]string{"REDIS_URL": c.redis.URL(), "HTTP_ADDR": freeAddr(t), "LOG_FORMAT": "text"}
	for k, v := range settings {
		env[k] = v
	}
	return stacktest.StartProc(t, name, apiBin, env)
}

// checkItems compares a done batch's items with the local solver: every
// one completed with the exact answer, counted once.
func checkItems(t *testing.T, hc *http.Client, base, id string, reqs []string, o *oracle) {
	t.Helper()
	b := batchState(t, hc, base, id, 0)
	want := apitype.Counts{Completed: len(reqs)}
	if !b.Done || b.Total != len(reqs) || b.Counts != want {
		t.Errorf("batch %s: done=%v total=%d counts=%v, want done, %d, %v", id, b.Done, b.Total, b.Counts, len(reqs), want)
	}
	items := batchItems(t, hc, base, id)
	if len(items) != len(reqs) {
		t.Fatalf("batch %s lists %d items, want %d", id, len(items), len(reqs))
	}
	bad := 0
	for i, tr := range items {
		if tr.State == "completed" && bytes.Equal(compact(tr.Result), o.expect(t, reqs[i])) {
			continue
		}
		if bad++; bad <= 5 {
			t.Errorf("batch %s item %d (%s): state %s, result %.100s, want %.100s", id, i, tr.ID, tr.State, tr.Result, o.expect(t, reqs[i]))
		}
	}
	if bad > 5 {
		t.Errorf("batch %s: %d items wrong in all", id, bad)
	}
}

// testAPIKilledMidSubmit: two API replicas share Redis. A 10,000-item
// batch is posted to the first, which is killed with SIGKILL while it
// feeds the batch's units to the queue: after the batch was committed
// (every unit is in the feed) and before the units it took from the feed
// were all enqueued and acknowledged. CHUNK_SIZE=1 makes that 10,000
// units and FEED_DEPTH=100000 has the API feed them all at once, so the
// kill lands inside the feed by construction, and the test checks it
// did. The client sees its request fail and retries on the surviving
// replica, with or without an Idempotency-Key. The surviving replica's
// reconciler must finish the dead one's feed within 5 s; every item of
// every recorded batch completes once with the exact answer; a replay
// answers with the recorded batch and nothing else is created; and the
// quota count ends at zero.
//
// The kill is timed by a goroutine of the test that watches Redis; on a
// loaded machine it can be descheduled long enough for the API to finish
// the feed and answer 202 first. That run tests nothing, so it is run
// again on a fresh cluster, at most twice more.
func testAPIKilledMidSubmit(t *testing.T, idempotent bool) {
	for attempt := 1; ; attempt++ {
		missed := apiKilledMidSubmit(t, idempotent)
		if missed == "" {
			return
		}
		if attempt == 3 {
			t.Fatalf("precondition missed in %d runs: %s", attempt, missed)
		}
		t.Logf("run %d: precondition missed (%s); again on a fresh cluster", attempt, missed)
	}
}

// apiKilledMidSubmit runs testAPIKilledMidSubmit once; it returns why the
// kill missed its window, or "" once the scenario ran and was checked.
func apiKilledMidSubmit(t *testing.T, idempotent bool) string {
	settings := map[string]string{"API_KEYS": faultOwner + ":" + faultKey, "CHUNK_SIZE": "1", "FEED_DEPTH": "100000",
		"RATE_LIMIT_BURST": "1000", "MAX_PENDING_PER_KEY": "100000"}
	c := newCluster(t, clusterOpts{redisArgs: []string{"--appendonly", "yes"}, api: settings,
		worker: map[string]string{"FEED_DEPTH": "100000"}})
	survivor := c.startReplica(t, "api2", settings)
	hc := &http.Client{Timeout: 60 * time.Second}
	o := newOracle()
	reqs := eightPuzzles(10000, 11)
	body := batchBody(reqs)
	hdr := map[string]string{}
	if idempotent {
		hdr["Idempotency-Key"] = "retry-me"
	}

	// Watch the feed from before the request, and kill once the API has
	// queued some of the units it took (they are on asynq's list) but has
	// not acknowledged them all: mid feed, so the reconciler meets units
	// that landed and units that did not.
	ctx := context.Background()
	recorded := make(chan string, 1)
	go func() {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			m, err := c.rdb.ZRange(ctx, "pq:feeding", 0, 0).Result()
			if err != nil || len(m) == 0 {
				continue
			}
			if n, err := c.rdb.LLen(ctx, asynqdata.PendingKey(tasks.QueueCheapBulk)).Result(); err == nil && n > 0 {
				c.api.Signal(t, syscall.SIGKILL)
				id, _, _ := strings.Cut(m[0], "/")
				recorded <- id
				return
			}
		}
		close(recorded)
	}()
	type answer struct {
		code int
		err  error
	}
	first := make(chan answer, 1)
	go func() {
		code, _, _, err := authed(t, hc, c.api.URL(), "POST", "/v1/batches", body, hdr)
		first <- answer{code, err}
	}()
	batchID, ok := <-recorded
	if !ok {
		t.Fatal("the batch was never fed, so the kill never happened")
	}
	killedAt := time.Now()
	c.api.WaitExit(5 * time.Second)
	left := c.unfed(t, batchID)
	queuedAtKill := c.queued()
	t.Logf("killed the API mid feed: %d of 10000 units not yet acknowledged, %d tasks queued", left, queuedAtKill)
	if left == 0 {
		return "the kill landed after the feed had finished; nothing was interrupted"
	}
	if a := <-first; a.err == nil && a.code == http.StatusAccepted {
		return fmt.Sprintf("the killed API answered %d first", a.code)
	}
	// The reconciler's bound counts from the kill, whatever the client
	// does meanwhile: watch for the dead replica's feed to be finished
	// beside the retry below, whose own submission (without a key, a
	// second batch of 10,000 units fed at once under FEED_DEPTH=100000)
	// takes seconds on a loaded machine before its 202 and is not what
	// the bound is about.
	reconciledAt := make(chan time.Duration, 1)
	go func() {
		if pollUntil(30*time.Second, 20*time.Millisecond, func() bool { n, err := c.countUnfed(batchID); return err == nil && n == 0 }) {
			reconciledAt <- time.Since(killedAt)
		}
		close(reconciledAt)
	}()

	// The client retries on the surviving replica, as a load balancer
	// would send it.
	code, h, b, err := authed(t, hc, survivor.URL(), "POST", "/v1/batches", body, hdr)
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("retry: %d %v: %.300s", code, err, b)
	}
	retryID, _ := decodeBatchAck(t, b)
	if idempotent {
		if retryID != batchID || h.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry with the same Idempotency-Key answered batch %s (replayed %q), want the recorded %s",
				retryID, h.Get("Idempotent-Replayed"), batchID)
		}
	} else if retryID == batchID {
		t.Fatal("a retry without a key answered with the first batch")
	}

	// The survivor's reconciler finishes the dead replica's feed: every
	// unit is on the queue and none is left in the feed.
	reconciled, ok := <-reconciledAt
	if !ok {
		t.Fatalf("%d units are still unfed 30s after the kill", c.unfed(t, batchID))
	}
	t.Logf("FIGURES api_kill idempotent=%v units_left_at_kill=%d reconciled_after=%v", idempotent, left, reconciled.Round(10*time.Millisecond))
	if reconciled > 5*time.Second {
		t.Errorf("the interrupted enqueue was finished %v after the kill, want within 5s", reconciled)
	}
	c.checkQuota(t, "after the reconciler ran, before any worker")

	c.startWorker(nil)
	c.startWorker(nil)
	want := []string{batchID}
	if !idempotent {
		want = append(want, retryID)
	}
	for _, id := range want {
		if b := waitBatchDone(t, hc, survivor.URL(), id, 120*time.Second); !b.Done {
			t.Fatalf("batch %s not done after 120s: %v", id, b.Counts)
		}
		checkItems(t, hc, survivor.URL(), id, reqs, o)
	}
	if batches, _ := c.recordCensus(t, faultOwner); len(batches) != len(want) {
		t.Errorf("Redis holds batches %v, want exactly %v", batches, want)
	}
	if n := c.checkQuota(t, "after every batch completed"); n != 0 {
		t.Errorf("the quota still counts %d tasks with every batch done", n)
	}
	return ""
}

// testWorkerKilledMidChunk: a worker is killed with SIGKILL while it runs
// a chunk: its items are active (perhaps some already written). At that
// moment, and after the chunk ran again on another worker, the
// quota count equals the unfinished records; in the end every item
// completed once with the exact answer, and the items written before the
// kill did not run again. The worker runs one task at a time; the test
// kills it once some items of the running chunk are written and some are
// not: a chunk of 64 fills of 120x120 (each under the 64 KiB that would
// give it a unit of its own at this CHUNK_SIZE, and about a millisecond
// to solve) runs for about 60 ms and is written every 5 ms
// (UNIT_WRITE_INTERVAL), so the kill lands mid chunk by construction; the
// test checks it.
func testWorkerKilledMidChunk(t *testing.T) {
	settings := map[string]string{"API_KEYS": faultOwner + ":" + faultKey, "CHUNK_SIZE": "64", "RATE_LIMIT_BURST": "1000"}
	c := newCluster(t, clusterOpts{redisArgs: []string{"--appendonly", "yes"}, api: settings,
		// Fills are cheap: their chunks run on the cheap lane's slots.
		worker: map[string]string{"CHEAP_CONCURRENCY": "1", "UNIT_WRITE_INTERVAL": "5ms"}})
	hc := &http.Client{Timeout: 60 * time.Second}
	o := newOracle()
	reqs := testgen.Fills(256, 120, 5)
	victim := c.startWorker(nil)
	var ack struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(mustAuthed(t, hc, c.api.URL(), "POST", "/v1/batches", batchBody(reqs), http.StatusAccepted), &ack); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	// Kill once the running chunk has written some of its items and not
	// all: on this one-slot worker the chunks run one after the other, so
	// a count of completed items that is not a whole number of chunks,
	// with items still active, is a chunk caught between two writes.
	if !pollUntil(60*time.Second, time.Millisecond, func() bool {
		v, err := c.rdb.HMGet(ctx, "pq:batch:"+ack.ID, "active", "completed").Result()
		if err != nil {
			return false
		}
		active, _ := strconv.Atoi(fmt.Sprint(v[0]))
		completed, _ := strconv.Atoi(fmt.Sprint(v[1]))
		if active > 0 && completed%64 != 0 {
			victim.Signal(t, syscall.SIGKILL)
			return true
		}
		return false
	}) {
		t.Fatalf("never saw a chunk partly written (batch %v)", batchState(t, hc, c.api.URL(), ack.ID, 0).Counts)
	}
	victim.WaitExit(5 * time.Second)
	// The dead worker's chunk stays in asynq's active list until its lease
	// runs out.
	var held []string
	doneAtKill := map[string]bool{}
	for _, ti := range c.activeTasks() {
		held = c.unitItems(ti)
	}
	for _, id := range held {
		if tr, ok := c.getTaskAuthed(t, hc, id); ok && tr.State == apitype.TaskStateCompleted {
			doneAtKill[id] = true
		}
	}
	if len(held) == 0 || len(doneAtKill) == 0 || len(doneAtKill) == len(held) {
		t.Fatalf("precondition: the killed worker held %d items, %d of them written; want some written and some not", len(held), len(doneAtKill))
	}
	n := c.checkQuota(t, "right after the worker was killed")
	t.Logf("killed the worker holding a chunk of %d items (%d already written); the key's unfinished count is %d",
		len(held), len(doneAtKill), n)
	if n == 0 {
		t.Fatal("precondition: nothing was unfinished at the kill")
	}

	c.startWorker(nil)
	// The API's watchdog re-drives the dead worker's chunk a few seconds
	// after the kill (asynq alone would requeue it only after its lease
	// and the recoverer's cutoff: up to about 2 minutes).
	if b := waitBatchDone(t, hc, c.api.URL(), ack.ID, 200*time.Second); !b.Done {
		t.Fatalf("batch not done 200s after the kill: %v", b.Counts)
	}
	checkItems(t, hc, c.api.URL(), ack.ID, reqs, o)
	// The redelivered chunk skipped the items already written and ran the
	// rest again.
	reran := 0
	for _, id := range held {
		tr, _ := c.getTaskAuthed(t, hc, id)
		switch {
		case doneAtKill[id] && tr.Attempts != 1:
			t.Errorf("item %s was written before the kill but ran %d times", id, tr.Attempts)
		case tr.Attempts >= 2:
			reran++
		}
	}
	if reran == 0 {
		t.Error("no item of the killed chunk ran again")
	}
	if n := c.checkQuota(t, "after the batch completed"); n != 0 {
		t.Errorf("the quota still counts %d tasks with the batch done", n)
	}
}

// testQuotaExpiryAndCancels: with a quota of 100, records that live 3 s and
// no worker at first, a key's count follows its unfinished records
// through submissions, a refusal, cancels of items and of a whole batch,
// and expiry of records that never ran; after expiry the whole quota is
// free again, and the expired batches' chunks, when a worker finally runs
// them, change nothing.
func testQuotaExpiryAndCancels(t *testing.T) {
	settings := map[string]string{"API_KEYS": faultOwner + ":" + faultKey, "CHUNK_SIZE": "8", "RATE_LIMIT_BURST": "1000",
		"MAX_PENDING_PER_KEY": "100", "TASK_TTL": "3s"}
	c := newCluster(t, clusterOpts{redisArgs: []string{"--appendonly", "yes"}, api: settings,
		worker: map[string]string{"TASK_TTL": "3s"}})
	hc := &http.Client{Timeout: 30 * time.Second}
	base := c.api.URL()
	submit := func(reqs []string, want int) (string, []string) {
		t.Helper()
		code, _, b, err := authed(t, hc, base, "POST", "/v1/batches", batchBody(reqs), nil)
		if err != nil || code != want {
			t.Fatalf("POST /v1/batches of %d: %d %v, want %d: %.200s", len(reqs), code, err, want, b)
		}
		if want != http.StatusAccepted {
			return "", nil
		}
		return decodeBatchAck(t, b)
	}
	reqs := eightPuzzles(200, 3)
	_, ids1 := submit(reqs[:60], http.StatusAccepted)
	b2, _ := submit(reqs[60:90], http.StatusAccepted)
	if n := c.checkQuota(t, "after two batches"); n != 90 {
		t.Fatalf("count %d after 90 items, want 90", n)
	}
	submit(reqs[90:101], http.StatusTooManyRequests) // 90 + 11 > 100
	for _, id := range ids1[:10] {
		mustAuthed(t, hc, base, "DELETE", "/v1/tasks/"+id, nil, http.StatusOK)
	}
	mustAuthed(t, hc, base, "DELETE", "/v1/tasks/"+ids1[0], nil, http.StatusOK) // twice (a retry): counted once
	if n := c.checkQuota(t, "after cancelling 10 items"); n != 80 {
		t.Errorf("count %d, want 80", n)
	}
	mustAuthed(t, hc, base, "DELETE", "/v1/batches/"+b2, nil, http.StatusOK)
	if n := c.checkQuota(t, "after cancelling a batch"); n != 50 {
		t.Errorf("count %d, want 50", n)
	}
	// The 50 left never run: no worker. Once their records expire the
	// quota is whole again.
	if !pollUntil(10*time.Second, 100*time.Millisecond, func() bool {
		_, unfinished := c.recordCensus(t, faultOwner)
		return unfinished == 0
	}) {
		t.Fatal("records did not expire within 10s of a 3s TTL")
	}
	if n := c.checkQuota(t, "after the records expired"); n != 0 {
		t.Errorf("count %d after every record expired, want 0", n)
	}
	// The expired batch's chunks are still queued; a worker now runs
	// them, finds no records and counts nothing.
	if c.queued() == 0 {
		t.Fatal("precondition: the expired batch's chunks are not queued")
	}
	c.startWorker(nil)
	if !pollUntil(20*time.Second, 50*time.Millisecond, func() bool { return c.queued() == 0 && len(c.activeTasks()) == 0 }) {
		t.Fatal("the queue did not drain")
	}
	if n := c.checkQuota(t, "after the expired chunks ran"); n != 0 {
		t.Errorf("count %d, want 0", n)
	}
	// The whole quota is free, and a new batch of all of it completes
	// (before its own 3 s are up).
	b3, _ := submit(reqs[100:200], http.StatusAccepted)
	if b := waitBatchDone(t, hc, base, b3, 20*time.Second); !b.Done {
		t.Fatalf("the new batch did not finish: %v", b.Counts)
	}
	if n := c.checkQuota(t, "after the worker ran everything"); n != 0 {
		t.Errorf("count %d with nothing unfinished, want 0", n)
	}
}

// testAPIKilledMidCancel: a batch cancel is cut off by SIGKILL of the API
// serving it, after it marked the batch and canceled some of its items
// but not all (CHUNK_SIZE=1 makes 20,000 chunks, each its own cancel
// script, so the kill lands inside the cancel by construction, and the
// test checks it did). No worker runs. The client's retry on the other
// replica must finish the cancel with 200, counting exactly the items the
// dead one had not reached; a further retry answers 200 with nothing
// more; the quota equals the unfinished records at every step; and a
// worker started afterwards runs none of the items.
func testAPIKilledMidCancel(t *testing.T) {
	settings := map[string]string{"API_KEYS": faultOwner + ":" + faultKey, "CHUNK_SIZE": "1",
		"RATE_LIMIT_BURST": "1000", "MAX_PENDING_PER_KEY": "100000"}
	c := newCluster(t, clusterOpts{redisArgs: []string{"--appendonly", "yes"}, api: settings})
	survivor := c.startReplica(t, "api2", settings)
	hc := &http.Client{Timeout: 60 * time.Second}
	const n = 20000
	code, _, b, err := authed(t, hc, survivor.URL(), "POST", "/v1/batches", batchBody(eightPuzzles(n, 13)), nil)
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("submit: %d %v: %.300s", code, err, b)
	}
	var ack apitype.BatchCreated
	if err := json.Unmarshal(b, &ack); err != nil || ack.ID == "" || ack.Total != n {
		t.Fatalf("batch answer %.200s: %v", b, err)
	}
	id := ack.ID
	c.checkQuota(t, "after the submission")

	ctx := context.Background()
	key := "pq:batch:" + id
	killed := make(chan int, 1)
	go func() {
		defer close(killed)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			v, err := c.rdb.HMGet(ctx, key, "canceled", "canceled_at").Result()
			if err != nil || v[1] == nil {
				continue
			}
			if k, _ := strconv.Atoi(fmt.Sprint(v[0])); k > 0 {
				c.api.Signal(t, syscall.SIGKILL)
				killed <- k
				return
			}
		}
	}()
	first := make(chan int, 1)
	go func() {
		code, _, _, _ := authed(t, hc, c.api.URL(), "DELETE", "/v1/batches/"+id, nil, nil)
		first <- code
	}()
	if _, ok := <-killed; !ok {
		t.Fatal("the cancel never started, so the kill never happened")
	}
	c.api.WaitExit(5 * time.Second)
	if code := <-first; code == http.StatusOK {
		t.Fatal("precondition: the killed API answered its cancel")
	}
	// What the dead API reached includes the scripts it had already
	// written to its sockets: Redis runs those after the process is gone
	// (ci23 read 173 here and 19 more ran after). They have all run once
	// the count stays still for half a second.
	atKill, since := -1, time.Now()
	for time.Since(since) < 500*time.Millisecond {
		k, err := c.rdb.HGet(ctx, key, "canceled").Int()
		if err != nil {
			t.Fatal(err)
		}
		if k != atKill {
			atKill, since = k, time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("killed the API mid cancel: %d of %d items canceled", atKill, n)
	if atKill <= 0 || atKill >= n {
		t.Fatalf("precondition: the kill landed outside the cancel (%d of %d canceled)", atKill, n)
	}
	c.checkQuota(t, "after the kill, mid cancel")

	// The client retries on the surviving replica.
	start := time.Now()
	code, _, b, err = authed(t, hc, survivor.URL(), "DELETE", "/v1/batches/"+id, nil, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("retried cancel: %d %v: %.300s", code, err, b)
	}
	var bc apitype.BatchCanceled
	if err := json.Unmarshal(b, &bc); err != nil || bc.Canceled != n-atKill {
		t.Fatalf("the retried cancel canceled %d (%v), want the %d the dead API had not reached", bc.Canceled, err, n-atKill)
	}
	t.Logf("FIGURES api_kill_mid_cancel canceled_at_kill=%d finished_by_retry=%d retry_took=%v", atKill, bc.Canceled, time.Since(start).Round(time.Millisecond))
	code, _, b, err = authed(t, hc, survivor.URL(), "DELETE", "/v1/batches/"+id, nil, nil)
	if err != nil || code != http.StatusOK || json.Unmarshal(b, &bc) != nil || bc.Canceled != 0 {
		t.Fatalf("a cancel of the canceled batch: %d %v: %.300s; want 200 and canceled 0", code, err, b)
	}
	if got := batchState(t, hc, survivor.URL(), id, 0); !got.Done || got.Counts.Canceled != n {
		t.Fatalf("after the retried cancel: done %v, counts %+v", got.Done, got.Counts)
	}
	if q := c.checkQuota(t, "after the retried cancel"); q != 0 {
		t.Errorf("the quota counts %d with every item canceled", q)
	}

	// A worker now drains the queue; no item of the canceled batch runs.
	c.startWorker(nil)
	if !pollUntil(60*time.Second, 50*time.Millisecond, func() bool { return c.queued() == 0 && len(c.activeTasks()) == 0 }) {
		t.Fatal("the queue did not drain")
	}
	if got := batchState(t, hc, survivor.URL(), id, 0); got.Counts.Canceled != n || got.Counts.Completed != 0 {
		t.Fatalf("after a worker ran: counts %+v, want all %d canceled", got.Counts, n)
	}
	c.checkQuota(t, "after a worker drained the queue")
}
