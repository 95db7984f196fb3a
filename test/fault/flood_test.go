//go:build fault

package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/tasks"
)

// The two keys of the flood scenario.
const (
	floodOwner, floodKey = "flood", "flood-secret-key-0123456789"
	calmOwner, calmKey   = "calm", "calm-secret-key-0123456789"
)

// Sizes of the flood scenario: three workers of two slots, and a hard
// ceiling (MAX_EXPENSIVE_PER_KEY) of 3 slots per key, half of them, so
// that a fault hits a key with runs holding slots and runs parked.
const (
	floodWorkers = 3
	floodSlots   = 2
	floodCap     = floodWorkers * floodSlots / 2
	floodCopies  = 8
	calmTasks    = 150
	calmClients  = 2
)

// testFlood: one key floods the cluster with the hardest 15-puzzles: 8
// copies of an 80-move board, then six distinct boards of 79-80 moves
// (that board once more, its transpose, and the boards one move from
// either). The copies must share one solve (every other copy joins it),
// the key must never hold more than its cap of slots, and meanwhile
// another key's 8-puzzles, submitted with POST ?wait=, must all complete
// promptly. Their p50 and p99 are logged as FIGURES; the bound asserted
// is loose (every one within 5 s), since this 2-core machine runs the
// three solves and other scenarios beside them (docs/performance.md has
// the figures of a quiet run). The solves take minutes, so the scenario then
// cancels every flood task and checks that the solves stop and the slots
// are freed.
func testFlood(t *testing.T) {
	c := newFloodCluster(t)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer hc.CloseIdleConnections()

	b80, err := parseTiles(hardest80)
	if err != nil {
		t.Fatal(err)
	}
	tr := transpose15(b80)
	boards := []hard15{newHard15("p80", b80, 80), newHard15("p80t", tr, 80)}
	for _, base := range []struct {
		name  string
		tiles [16]int
	}{{"p80", b80}, {"p80t", tr}} {
		for _, m := range "UDLR" {
			if nb, err := replay15(base.tiles, string(m)); err == nil {
				boards = append(boards, newHard15(base.name+"-"+string(m), nb, 79))
			}
		}
	}
	if len(boards) != 6 {
		t.Fatalf("%d distinct boards, want 6 (the blank is in a corner)", len(boards))
	}

	var floodIDs, copies []string
	for range floodCopies {
		id := submitAsKey(t, c, hc, floodKey, boards[0].req)
		floodIDs, copies = append(floodIDs, id), append(copies, id)
	}
	for _, b := range boards {
		id := submitAsKey(t, c, hc, floodKey, b.req)
		floodIDs = append(floodIDs, id)
		if b.name == "p80" {
			copies = append(copies, id)
		}
	}

	// The flood settles: the key holds its cap of slots, with one solve
	// for all the copies of the 80-move board.
	if !pollUntil(20*time.Second, 20*time.Millisecond, func() bool { return c.floodRunning(t) == floodCap }) {
		t.Fatalf("the flood key holds %d slots after 20 s, want %d; %s", c.floodRunning(t), floodCap, c.describeQueues())
	}
	if !pollUntil(10*time.Second, 20*time.Millisecond, func() bool { return c.joinedCount(t, copies) == len(copies)-1 }) {
		t.Fatalf("%d of the %d copies joined another's solve, want %d", c.joinedCount(t, copies), len(copies), len(copies)-1)
	}

	// Meanwhile: the other key's 8-puzzles, and the flood key's slots
	// sampled throughout.
	stopSample := make(chan struct{})
	maxRunning, maxActive := 0, 0
	var sampled sync.WaitGroup
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		for {
			select {
			case <-stopSample:
				return
			case <-time.After(25 * time.Millisecond):
			}
			maxRunning = max(maxRunning, c.floodRunning(t))
			maxActive = max(maxActive, c.floodActive(floodIDs))
		}
	}()
	lat := make([]time.Duration, 0, calmTasks)
	var mu sync.Mutex
	var wg sync.WaitGroup
	reqs := eightPuzzles(calmTasks, 77)
	start := time.Now()
	for k := range calmClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < len(reqs); i += calmClients {
				d, err := submitWait(c, hc, calmKey, reqs[i])
				if err != nil {
					t.Errorf("8-puzzle %d: %v", i, err)
					return
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stopSample)
	sampled.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) != calmTasks {
		t.Fatalf("%d of %d 8-puzzles completed", len(lat), calmTasks)
	}
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	t.Logf("FIGURES flood: %d 8-puzzles of another key in %v beside %d 80-move solves of the flood key: p50 %v p99 %v max %v; "+
		"flood key's slots at most %d (asynq tasks active at most %d, counting deliveries told to wait or joining); solves started %d, joins %d, waits %d",
		len(lat), elapsed.Round(time.Millisecond), floodCap, p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond),
		lat[len(lat)-1].Round(100*time.Microsecond), maxRunning, maxActive,
		c.workersMetric(t, "puzzleq_expensive_solves_total"), c.workersMetric(t, "puzzleq_solve_joins_total"),
		c.workersMetric(t, "puzzleq_expensive_waits_total"))
	if lat[len(lat)-1] > 5*time.Second {
		t.Errorf("an 8-puzzle of the calm key took %v beside the flood, want under 5 s", lat[len(lat)-1])
	}
	// asynq's active list also holds, for a moment, a task that is told
	// to wait or that joins, so it may show more: the slots are what the
	// cap bounds.
	if maxRunning > floodCap {
		t.Errorf("the flood key held %d slots, want at most %d", maxRunning, floodCap)
	}
	// One solve per puzzle: the three that hold the slots, however often
	// the copies were delivered.
	if n := c.workersMetric(t, "puzzleq_expensive_solves_total"); n != floodCap {
		t.Errorf("puzzleq_expensive_solves_total is %d, want %d (one per distinct board running)", n, floodCap)
	}
	if n := c.workersMetric(t, "puzzleq_solve_joins_total"); n != len(copies)-1 {
		t.Errorf("puzzleq_solve_joins_total is %d, want %d", n, len(copies)-1)
	}
	// Of the six boards one joins the copies' solve, two more run, and the
	// other three wait.
	if n := c.workersMetric(t, "puzzleq_expensive_waits_total"); n < len(boards)-floodCap {
		t.Errorf("puzzleq_expensive_waits_total is %d: the boards over the cap never waited", n)
	}
	// The boards over the cap wait in asynq's retry set, where a wait is
	// not counted as a retry: they can wait as long as the key's solves
	// take, never archived for it.
	waiting, err := c.insp.ListRetryTasks(tasks.QueueInteractive, asynq.PageSize(100))
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range waiting {
		if ti.Retried != 0 {
			t.Errorf("waiting task %s counts %d retries (%q), want 0", ti.ID, ti.Retried, ti.LastErr)
		}
	}
	for _, id := range floodIDs {
		if tr, _ := c.getTaskAs(t, hc, floodKey, id); tr.State.Terminal() {
			t.Errorf("flood task %s ended (%s, %+v) before it was canceled", id, tr.State, tr.Error)
		}
	}

	// Cancel the flood: the solves stop, the slots are freed, and the
	// waiting tasks leave the retry set when they next wake.
	for _, id := range floodIDs {
		code, b, err := doAs(c, hc, floodKey, "DELETE", "/v1/tasks/"+id, nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("cancel %s: %d %v %.200s", id, code, err, b)
		}
	}
	if !pollUntil(15*time.Second, 50*time.Millisecond, func() bool {
		return c.floodRunning(t) == 0 && len(c.activeTasks()) == 0 && c.queued() == 0
	}) {
		t.Fatalf("after canceling the flood: %d slots held, %d asynq tasks active; %s", c.floodRunning(t), len(c.activeTasks()), c.describeQueues())
	}
}

// newFloodCluster starts the flood scenarios' stack: the flood and calm
// keys, and floodWorkers workers of floodSlots slots with
// MAX_EXPENSIVE_PER_KEY at floodCap, once every worker is ready
// (puzzleq_expensive_cap).
func newFloodCluster(t *testing.T) *cluster {
	t.Helper()
	settings := map[string]string{
		"API_KEYS":              floodOwner + ":" + floodKey + "," + calmOwner + ":" + calmKey,
		"RATE_LIMIT_PER_SECOND": "1000", "RATE_LIMIT_BURST": "1000",
	}
	c := newCluster(t, clusterOpts{api: settings, worker: withPDB(map[string]string{
		"WORKER_CONCURRENCY": strconv.Itoa(floodSlots), "LOG_LEVEL": "warn", "MAX_EXPENSIVE_PER_KEY": strconv.Itoa(floodCap)}), workers: floodWorkers})
	for _, w := range c.workers {
		waitReady(t, w)
	}
	if !pollUntil(20*time.Second, 100*time.Millisecond, func() bool {
		for _, w := range c.workers {
			if c.workerMetric(t, w, "puzzleq_expensive_cap") != floodCap {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the workers' per-key caps never all became %d", floodCap)
	}
	return c
}

// floodRunning counts the flood key's live slots (keys.ownerRunning).
func (c *cluster) floodRunning(t *testing.T) int {
	n, err := c.rdb.ZCount(context.Background(), "pq:owner:"+floodOwner+":running",
		strconv.FormatInt(time.Now().UnixMilli(), 10), "+inf").Result()
	if err != nil {
		t.Errorf("flood slots: %v", err)
	}
	return int(n)
}

// floodActive counts the asynq tasks of ids that are active.
func (c *cluster) floodActive(ids []string) int {
	set := map[string]bool{}
	for _, id := range ids {
		set[id] = true
	}
	n := 0
	for _, ti := range c.activeTasks() {
		if set[itemOf(ti)] {
			n++
		}
	}
	return n
}

// joinedCount counts the records of ids that joined another's solve.
func (c *cluster) joinedCount(t *testing.T, ids []string) int {
	n := 0
	for _, id := range ids {
		v, err := c.rdb.HGet(context.Background(), "pq:task:"+id, "joined").Result()
		if err == nil && v != "" {
			n++
		}
	}
	return n
}

// workersMetric sums a metric over every worker's /metrics.
func (c *cluster) workersMetric(t *testing.T, name string) int {
	t.Helper()
	total := 0
	for _, w := range c.workers {
		total += c.workerMetric(t, w, name)
	}
	return total
}

// workerMetric sums a metric's samples on one worker's /metrics.
func (c *cluster) workerMetric(t *testing.T, w *proc, name string) int {
	t.Helper()
	resp, err := http.Get(w.URL() + "/metrics")
	if err != nil {
		t.Errorf("%s /metrics: %v", w.Name, err)
		return 0
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
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
	return int(total)
}

// waitReady waits for a worker's /readyz (the pattern databases loaded).
func waitReady(t *testing.T, w *proc) {
	t.Helper()
	if !pollUntil(30*time.Second, 20*time.Millisecond, func() bool {
		resp, err := http.Get(w.URL() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatalf("%s not ready after 30 s", w.Name)
	}
}

// doAs sends one request with key's bearer token.
func doAs(c *cluster, hc *http.Client, key, method, path string, body []byte) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, c.api.URL()+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// submitAsKey submits one single task as key; it must be accepted.
func submitAsKey(t *testing.T, c *cluster, hc *http.Client, key, req string) string {
	t.Helper()
	code, b, err := doAs(c, hc, key, "POST", "/v1/tasks", []byte(req))
	var tr apitype.Task
	if err != nil || code != http.StatusAccepted || json.Unmarshal(b, &tr) != nil {
		t.Fatalf("POST /v1/tasks: %d %v %.200s", code, err, b)
	}
	return tr.ID
}

// submitWait submits one task with ?wait= and returns how long it took
// to come back completed.
func submitWait(c *cluster, hc *http.Client, key, req string) (time.Duration, error) {
	start := time.Now()
	code, b, err := doAs(c, hc, key, "POST", "/v1/tasks?wait=10s", []byte(req))
	d := time.Since(start)
	if err != nil {
		return d, err
	}
	var tr apitype.Task
	if code != http.StatusOK || json.Unmarshal(b, &tr) != nil || tr.State != apitype.TaskStateCompleted {
		return d, fmt.Errorf("%d after %v: %.200s", code, d, b)
	}
	return d, nil
}

// getTaskAs reads a task as key.
func (c *cluster) getTaskAs(t *testing.T, hc *http.Client, key, id string) (apitype.Task, bool) {
	t.Helper()
	var tr apitype.Task
	code, b, err := doAs(c, hc, key, "GET", "/v1/tasks/"+id, nil)
	if err != nil || code != http.StatusOK || json.Unmarshal(b, &tr) != nil {
		t.Errorf("GET /v1/tasks/%s: %d %v %.200s", id, code, err, b)
		return tr, false
	}
	return tr, true
}

// joinKillBound is the most the lead and its joined copies may take to
// complete after the kill. The copy solves the board's 3.5 s of CPU at
// whatever share of a core the loaded machine gives it (6.1-9.3 s after
// the kill at a load average of 1-11), so recoveryBound, which the worker
// crash holds boards of a fraction of a second to, would measure the load,
// not the recovery; this one is half of asynq's earliest recovery of the
// original (its 30 s lease, then its recoverer's 30 s cutoff), which the
// original's still being active at the end proves was not what ran.
const joinKillBound = 30 * time.Second

// testJoinWorkerKill: a hard board is submitted as a single and three
// identical copies join its solve; then the worker running the solve is
// killed with SIGKILL. Its heartbeat record names the lead's asynq task
// alone: a copy's delivery returned when it joined, and its record waits
// on the solve (pq:solve:<key>:waiters), not on a worker. The watchdog
// re-drives the lead's task (tasks.RedriveTask: a new asynq ID, the same
// record), and that copy starts within recoveryBound of the kill and takes
// the solve over while the dead run's lease still lasts (a record never
// joins itself); its finish completes all four records with the optimal
// answer within joinKillBound of the kill, while asynq still lists the
// original as active: the watchdog recovered them, not asynq's lease
// recovery (60-130 s). When asynq does run the original, a minute or so
// later, it finds the records ended and no waiter left, and changes
// nothing; nothing of the solve is left in the gate's keys.
func testJoinWorkerKill(t *testing.T) {
	hs := hardSet(t, "p75") // 3.5 s of CPU: still solving when the copies have joined
	o := newOracle()
	// The local answer first: solving it here while the watchdog's copy
	// runs would take CPU from the recovery measured.
	expectHard(t, o, hs)
	c := newCluster(t, clusterOpts{worker: withPDB(map[string]string{"WORKER_CONCURRENCY": "2"})})
	victim := c.startWorker(nil)
	waitReady(t, victim)
	w := newWorkload()
	lead := w.addTask(c, hs[0].req)
	if !pollUntil(30*time.Second, 5*time.Millisecond, func() bool {
		tr, _ := c.getTask(lead, 0)
		return tr.State == apitype.TaskStateActive
	}) {
		t.Fatalf("the lead %s never became active", lead)
	}
	var copies []string
	for range 3 {
		copies = append(copies, w.addTask(c, hs[0].req))
	}
	if !pollUntil(10*time.Second, 5*time.Millisecond, func() bool { return c.joinedCount(t, copies) == len(copies) }) {
		t.Fatalf("%d of %d copies joined the lead's solve", c.joinedCount(t, copies), len(copies))
	}
	if tr, _ := c.getTask(lead, 0); tr.State.Terminal() {
		t.Fatalf("the lead ended (%s) before the kill: pick a longer board", tr.State)
	}
	k := c.killWorker(t, victim)
	if len(k.origs) != 1 || k.origs[0].ID != lead {
		t.Fatalf("precondition: the killed worker's record names %v still in asynq (all it named: %v), want the lead's task %s alone",
			k.origs, k.held, lead)
	}
	c.startWorker(nil)
	// The copy's admission counts the lead's second attempt.
	var startedAgain time.Duration
	if pollUntil(time.Until(k.at.Add(recoveryBound)), 20*time.Millisecond, func() bool {
		tr, _ := c.getTask(lead, 0)
		return tr.Attempts >= 2 || tr.State.Terminal()
	}) {
		startedAgain = time.Since(k.at)
	} else {
		t.Errorf("the lead %s did not start again within %v of the kill", lead, recoveryBound)
	}
	hard := map[string]hard15{lead: hs[0]}
	for _, id := range copies {
		hard[id] = hs[0]
	}
	recs := w.verify(t, c, o, 60*time.Second)
	// Checked before anything else: asynq recovers the original 60 s
	// after the kill at the earliest.
	ti, err := c.insp.GetTaskInfo(k.origs[0].Queue, lead)
	stillActive := err == nil && ti.State == asynq.TaskStateActive
	checkHardRecords(t, recs, hard)
	var recovery time.Duration
	for id := range hard {
		tr := recs[id]
		if tr.CompletedAt == nil || !tr.CompletedAt.After(k.at) {
			t.Errorf("task %s: completed %v, want after the kill at %s", id, tr.CompletedAt, k.at.Format(time.StampMilli))
			continue
		}
		recovery = max(recovery, tr.CompletedAt.Sub(k.at))
	}
	if a := recs[lead].Attempts; a < 2 {
		t.Errorf("the lead has %d attempts, want the killed run and the watchdog's copy", a)
	}
	redrove := 0
	for _, l := range strings.Split(logText(c.api.LogPath), "\n") {
		if strings.Contains(l, "re-drove the tasks of a dead worker") && strings.Contains(l, lead) {
			redrove++
		}
	}
	logLines(t, c.api, "re-drove")
	if recovery > joinKillBound {
		t.Errorf("the lead and its copies completed %v after the kill, over the %v bound", recovery, joinKillBound)
	}
	if !stillActive || redrove == 0 {
		t.Errorf("the original %s still active in asynq at recovery: %v (%v); watchdog re-drives of it logged: %d; want still active (asynq had not recovered it) and a re-drive",
			lead, stillActive, err, redrove)
	}
	c.checkGateClear(t, "", hs, "after the solve")

	recovered := c.waitOriginals(t, k)
	for id, was := range recs {
		now, _ := c.getTask(id, 0)
		if now.State != was.State || now.Attempts != was.Attempts || string(now.Result) != string(was.Result) ||
			now.CompletedAt == nil || was.CompletedAt == nil || !now.CompletedAt.Equal(*was.CompletedAt) {
			t.Errorf("task %s changed when asynq's original ran: %s, attempts %d, completed %v; was %s, attempts %d, completed %v",
				id, now.State, now.Attempts, now.CompletedAt, was.State, was.Attempts, was.CompletedAt)
		}
	}
	c.checkGateClear(t, "", hs, "after asynq's original ran")
	t.Logf("FIGURES join worker kill: the watchdog's copy of the lead started %v after the worker holding the solve was killed (bound %v), and the lead and its 3 joined copies completed %v after it (bound %v; lead attempts %d; the original still active in asynq then: %v); asynq ran the original %v after the kill, changing nothing",
		startedAgain.Round(100*time.Millisecond), recoveryBound, recovery.Round(100*time.Millisecond), joinKillBound, recs[lead].Attempts, stillActive, recovered.Round(100*time.Millisecond))
}

// testBatchFlood: the per-key cap holds for batch items too, and frees
// work as fast as the slots allow. One key submits a batch of ten hard
// boards (0.2-1.6 s of CPU each, in units of their own); it must never
// hold more than its cap of slots, and must reach it (its other items wait
// their turn). Another key's search, sent while the batch runs, completes
// before the batch ends: one key's hard batch does not stall the others'
// hard work. The batch then ends with every answer optimal and replayed,
// its waiting items promoted one per freed slot, and nothing left parked
// or holding a slot.
func testBatchFlood(t *testing.T) {
	c := newFloodCluster(t)
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()

	hs := hardSet(t, "p74", "p73", "p75t", "p72", "p73t", "p74t", "p72t", "k88", "k88t", "k15")
	calm := hardSet(t, "k17")[0]
	reqs := make([]string, len(hs))
	for i, h := range hs {
		reqs[i] = h.req
	}

	stopSample := make(chan struct{})
	maxRunning := 0
	var sampled sync.WaitGroup
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		for {
			select {
			case <-stopSample:
				return
			case <-time.After(10 * time.Millisecond):
			}
			maxRunning = max(maxRunning, c.floodRunning(t))
		}
	}()
	start := time.Now()
	id := submitAs(t, hc, c.api.URL(), floodKey, ndjsonBody(reqs), "application/x-ndjson")
	if !pollUntil(20*time.Second, 10*time.Millisecond, func() bool { return c.floodRunning(t) == floodCap }) {
		t.Fatalf("the flood key's batch holds %d slots after 20 s, want its cap %d; %s", c.floodRunning(t), floodCap, c.describeQueues())
	}
	calmTook, err := submitWait(c, hc, calmKey, calm.req)
	if err != nil {
		t.Fatalf("the calm key's search beside the flood batch: %v", err)
	}
	if b := batchStateAs(t, hc, c.api.URL(), floodKey, id); ended(b) == len(reqs) {
		t.Errorf("the flood batch had ended before the calm key's search did (%v): the scenario shows nothing", calmTook)
	}
	var b apitype.Batch
	if !pollUntil(90*time.Second, 50*time.Millisecond, func() bool {
		b = batchStateAs(t, hc, c.api.URL(), floodKey, id)
		return ended(b) == len(reqs)
	}) {
		t.Fatalf("the flood batch has not ended after 90 s: %+v; %s", b.Counts, c.describeQueues())
	}
	took := time.Since(start)
	close(stopSample)
	sampled.Wait()
	if b.Counts.Completed != len(reqs) {
		t.Fatalf("flood batch: %+v, want %d completed", b.Counts, len(reqs))
	}
	for i, line := range resultsAs(t, hc, c.api.URL(), floodKey, id) {
		if line.Index != i || line.State != apitype.TaskStateCompleted {
			t.Fatalf("result line %d: index %d, %s", i, line.Index, line.State)
		}
		if msg := hs[i].check(line.Result); msg != "" {
			t.Errorf("item %d (%s): %s", i, hs[i].name, msg)
		}
	}
	waits := c.workersMetric(t, "puzzleq_expensive_waits_total")
	t.Logf("FIGURES batch flood: %d hard boards of one key in one batch ended after %v on %d slots under a cap of %d "+
		"(the key held at most %d slots; %d waits); another key's search beside it took %v",
		len(reqs), took.Round(time.Millisecond), floodWorkers*floodSlots, floodCap, maxRunning, waits, calmTook.Round(time.Millisecond))
	if maxRunning != floodCap {
		t.Errorf("the flood key held at most %d slots, want exactly its cap %d", maxRunning, floodCap)
	}
	if waits < len(reqs)-floodCap {
		t.Errorf("puzzleq_expensive_waits_total is %d: the items over the cap never waited", waits)
	}
	parked, err := c.rdb.ZCard(context.Background(), "pq:owner:"+floodOwner+":parked").Result()
	if err != nil || parked != 0 || c.floodRunning(t) != 0 {
		t.Errorf("after the batch: %d parked (%v), %d slots held; want none", parked, err, c.floodRunning(t))
	}
}

// resultsAs reads batch id's /results as key, one line per item.
func resultsAs(t *testing.T, hc *http.Client, base, key, id string) []apitype.ResultLine {
	t.Helper()
	resp := getAs(t, hc, base+"/v1/batches/"+id+"/results", key)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/batches/%s/results: %d", id, resp.StatusCode)
	}
	var out []apitype.ResultLine
	dec := json.NewDecoder(resp.Body)
	for dec.More() {
		var l apitype.ResultLine
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("results of %s: %v", id, err)
		}
		out = append(out, l)
	}
	return out
}
