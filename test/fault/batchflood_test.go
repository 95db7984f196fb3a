//go:build fault

package fault

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
)

// slotsOf counts owner's live expensive slots (keys.ownerRunning).
func (c *cluster) slotsOf(t *testing.T, owner string) int {
	n, err := c.rdb.ZCount(context.Background(), "pq:owner:"+owner+":running",
		strconv.FormatInt(time.Now().UnixMilli(), 10), "+inf").Result()
	if err != nil {
		t.Errorf("%s's slots: %v", owner, err)
	}
	return int(n)
}

// testBatchFlood is testFlood with the flood in one batch: the 8 copies
// of the 80-move board and the six distinct 79-80-move boards are 14
// items of one POST /v1/batches, which run one per unit on the bulk
// queue. The items share the singles' gate: the copies one solve, the
// key at most its cap of slots, while the other key's 8-puzzles complete.
// Figures are logged before the checks, so that an older build (through
// PUZZLEQ_FAULT_BIN) shows how it fares.
func testBatchFlood(t *testing.T) {
	settings := map[string]string{
		"API_KEYS":              floodOwner + ":" + floodKey + "," + calmOwner + ":" + calmKey,
		"RATE_LIMIT_PER_SECOND": "1000", "RATE_LIMIT_BURST": "1000",
	}
	c := newCluster(t, clusterOpts{api: settings, worker: withPDB(map[string]string{
		"WORKER_CONCURRENCY": strconv.Itoa(floodSlots), "LOG_LEVEL": "warn", "MAX_EXPENSIVE_PER_KEY": "0"}), workers: floodWorkers})
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
		t.Fatalf("%d distinct boards, want 6", len(boards))
	}
	var reqs []string
	for range floodCopies {
		reqs = append(reqs, boards[0].req)
	}
	for _, b := range boards {
		reqs = append(reqs, b.req)
	}
	code, body, err := doAs(c, hc, floodKey, "POST", "/v1/batches", batchBody(reqs))
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("POST /v1/batches: %d %v %.200s", code, err, body)
	}
	batchID, _ := decodeBatchAck(t, body)

	// The flood settles at its cap, or (an older build) fills the slots.
	settled := pollUntil(20*time.Second, 20*time.Millisecond, func() bool {
		return c.floodRunning(t) == floodCap || len(c.activeTasks()) >= floodWorkers*floodSlots
	})
	joins := 0
	pollUntil(10*time.Second, 20*time.Millisecond, func() bool {
		joins = c.workersMetric(t, "puzzleq_solve_joins_total")
		return joins == floodCopies
	})

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
			maxActive = max(maxActive, len(c.activeTasks()))
		}
	}()
	lat := make([]time.Duration, 0, calmTasks)
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		failed int
		first  error
	)
	calm := eightPuzzles(calmTasks, 78)
	start := time.Now()
	for k := range calmClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < len(calm); i += calmClients {
				d, err := submitWait(c, hc, calmKey, calm[i])
				mu.Lock()
				if err != nil {
					failed++
					if first == nil {
						first = err
					}
				} else {
					lat = append(lat, d)
				}
				mu.Unlock()
				if err != nil && failed >= 3 {
					return // an older build: the slots are full for minutes
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stopSample)
	sampled.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p99, most := time.Duration(0), time.Duration(0), time.Duration(0)
	if len(lat) > 0 {
		p50, p99, most = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	}
	solves := c.workersMetric(t, "puzzleq_expensive_solves_total")
	t.Logf("FIGURES batch flood: %d of %d 8-puzzles of another key completed (%d failed) in %v beside a 14-item batch of 79-80-move boards of the flood key: "+
		"p50 %v p99 %v max %v; flood key's slots at most %d, asynq tasks active at most %d; solves started %d, joins %d, waits %d",
		len(lat), calmTasks, failed, elapsed.Round(time.Millisecond), p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond),
		most.Round(100*time.Microsecond), maxRunning, maxActive, solves, joins, c.workersMetric(t, "puzzleq_expensive_waits_total"))

	if !settled {
		t.Errorf("the flood key held %d slots after 20 s, want %d; %s", c.floodRunning(t), floodCap, c.describeQueues())
	}
	if len(lat) != calmTasks {
		t.Fatalf("%d of %d 8-puzzles completed beside the batch (first failure: %v)", len(lat), calmTasks, first)
	}
	if most > 5*time.Second {
		t.Errorf("an 8-puzzle of the calm key took %v beside the batch, want under 5 s", most)
	}
	if maxRunning > floodCap {
		t.Errorf("the flood key held %d slots, want at most %d", maxRunning, floodCap)
	}
	if solves != floodCap {
		t.Errorf("puzzleq_expensive_solves_total is %d, want %d (one per distinct board running)", solves, floodCap)
	}
	if joins != floodCopies {
		t.Errorf("puzzleq_solve_joins_total is %d, want %d (every copy but the first)", joins, floodCopies)
	}
	b := batchStateAs(t, hc, c.api.URL(), floodKey, batchID)
	if b.Done || b.Counts.Pending+b.Counts.Active != len(reqs) {
		t.Errorf("the flood batch before its cancel: %+v", b.Counts)
	}
	// The copies that joined are active; the boards over the cap pending.
	if b.Counts.Active < floodCopies+1 || b.Counts.Pending < len(boards)-floodCap-1 {
		t.Errorf("the flood batch's counts %+v: want the %d copies and the running boards active, the rest pending", b.Counts, floodCopies+1)
	}

	code, body, err = doAs(c, hc, floodKey, "DELETE", "/v1/batches/"+batchID, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("cancel the batch: %d %v %.200s", code, err, body)
	}
	if !pollUntil(15*time.Second, 50*time.Millisecond, func() bool {
		return c.floodRunning(t) == 0 && len(c.activeTasks()) == 0 && c.queued() == 0
	}) {
		t.Fatalf("after canceling the batch: %d slots held, %d asynq tasks active; %s", c.floodRunning(t), len(c.activeTasks()), c.describeQueues())
	}
	if b := batchStateAs(t, hc, c.api.URL(), floodKey, batchID); !b.Done || b.Counts.Canceled != len(reqs) {
		t.Errorf("the canceled batch: done %v, %+v", b.Done, b.Counts)
	}
}

// testBatchItemWorkerKill: a batch holds three copies of a hard board and
// two other hard boards, under a cap of one slot. The first copy leads
// the solve on the victim worker, the other copies join it, the other
// boards wait; then the victim is killed with SIGKILL in the middle of
// the solve. Its slot is not lost: the watchdog's re-drive of the unit
// (the same item, so the same slot and solve) takes the solve over on a
// new worker, or the slot's lease ends; the key never holds more than
// its cap, every item completes with the exact answer (the copies with
// the lead's, solved once more at most), and counts, quota and slots end
// exact.
func testBatchItemWorkerKill(t *testing.T) {
	c := newCluster(t, clusterOpts{authed: true,
		worker: withPDB(map[string]string{"WORKER_CONCURRENCY": "2", "MAX_EXPENSIVE_PER_KEY": "1"})})
	victim := c.startWorker(nil)
	waitReady(t, victim)
	hs := hardSet(t, "p76", "p74", "p73")
	o := newOracle()
	reqs := []string{hs[0].req, hs[0].req, hs[0].req, hs[1].req, hs[2].req}
	batchID, ids := c.submitBatch(reqs)
	if !pollUntil(30*time.Second, 5*time.Millisecond, func() bool {
		return c.workerMetric(t, victim, "puzzleq_solve_joins_total") == 2 && c.slotsOf(t, faultOwner) == 1
	}) {
		t.Fatalf("the copies never joined the lead's solve: %d joins, %d slots", c.workerMetric(t, victim, "puzzleq_solve_joins_total"), c.slotsOf(t, faultOwner))
	}
	held, err := c.rdb.ZRange(context.Background(), "pq:owner:"+faultOwner+":running", 0, -1).Result()
	if err != nil || len(held) != 1 || (held[0] != ids[0] && held[0] != ids[1] && held[0] != ids[2]) {
		t.Fatalf("the slot is held by %v (%v), want one of the copies %v", held, err, ids[:3])
	}
	lead := held[0]
	if tr, _ := c.getTaskAuthed(t, &http.Client{Timeout: 10 * time.Second}, lead); tr.State != apitype.TaskStateActive {
		t.Fatalf("the lead is %s before the kill: pick a longer board", tr.State)
	}
	victim.Signal(t, syscall.SIGKILL)
	killed := time.Now()
	if !victim.WaitExit(5 * time.Second) {
		t.Fatalf("%s still runs 5 s after SIGKILL", victim.Name)
	}
	quotaAtKill := c.checkQuota(t, "right after the kill")
	next := c.startWorker(nil)

	stop := make(chan struct{})
	most := 0
	var sampled sync.WaitGroup
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			most = max(most, c.slotsOf(t, faultOwner))
		}
	}()
	hc := &http.Client{Timeout: 60 * time.Second}
	b := waitBatchDone(t, hc, c.api.URL(), batchID, 150*time.Second)
	took := time.Since(killed)
	close(stop)
	sampled.Wait()
	if !b.Done {
		t.Fatalf("batch not done 150 s after the kill: %+v", b.Counts)
	}
	expectHard(t, o, hs)
	checkItems(t, hc, c.api.URL(), batchID, reqs, o)
	c.checkQuota(t, "after the batch")
	solves := c.workerMetric(t, next, "puzzleq_expensive_solves_total")
	t.Logf("FIGURES batch item worker kill: the batch (3 copies of p76, p74, p73) completed %v after the worker leading the copies' solve was killed; "+
		"%d unfinished at the kill, slots at most %d, %d solves on the new worker, %d joins there",
		took.Round(100*time.Millisecond), quotaAtKill, most, solves, c.workerMetric(t, next, "puzzleq_solve_joins_total"))
	if most > 1 {
		t.Errorf("the key held %d slots, cap 1", most)
	}
	if solves > 3 {
		t.Errorf("%d solves on the new worker for 3 distinct boards: a copy solved again", solves)
	}
	if n := c.slotsOf(t, faultOwner); n != 0 {
		t.Errorf("the key holds %d slots after its batch", n)
	}
	var items []apitype.Task
	for _, id := range ids[:3] {
		tr, ok := c.getTaskAuthed(t, hc, id)
		if !ok {
			t.Fatalf("read %s", id)
		}
		items = append(items, tr)
	}
	for _, tr := range items[1:] {
		if string(compact(tr.Result)) != string(compact(items[0].Result)) {
			t.Errorf("copy %s: %s, want the lead's %s", tr.ID, tr.Result, items[0].Result)
		}
	}
}
