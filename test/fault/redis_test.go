//go:build fault

package fault

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
)

// testRedisRestart kills Redis (SIGKILL; AOF with appendfsync everysec)
// while batches are being submitted and solved, then starts it again on the
// same port and data directory. While it is down the API answers 503
// "unavailable" within its request timeout. Both binaries reconnect on
// their own. Every task the API acknowledged with 202 must then end
// completed with the right result, or, if its record did not survive the
// crash, be reported here by ID. The crash comes while all 4 worker slots
// run hard 15-puzzles; each must complete after it, with the exact answer.
// It calls restarted once Redis is back and both binaries are ready.
func testRedisRestart(t *testing.T, restarted func()) {
	const reqTimeout = 2 * time.Second
	c := newCluster(t, clusterOpts{
		redisArgs: []string{"--appendonly", "yes", "--appendfsync", "everysec"},
		api:       map[string]string{"CHUNK_SIZE": "16", "REQUEST_TIMEOUT": reqTimeout.String()},
		worker:    withPDB(map[string]string{"SWEEP_MAX_NODES": "100000000000", "WORKER_CONCURRENCY": "2"}),
		workers:   2,
	})
	const slots = 4 // 2 workers x 2
	o := newOracle()
	corpus := corpusSweeps(t)
	slidings := eightPuzzles(20000, 30)

	// Hard boards first (the head of the bulk queue, 6 s of CPU in all),
	// so that all 4 slots are provably busy when Redis dies.
	hs := hardSet(t, "p74", "p75t", "p73", "p73t", "p72", "k88", "k88t", "k15")
	hardW := newWorkload()
	hard := hardW.addHardBatch(c, hs)
	sub := startSubmitter(c, slidings, corpus)
	defer sub.stop()
	sub.adopt(hardW)
	mu, acked := &sub.mu, sub.acked

	// Crash Redis once batches are acknowledged and every slot runs a hard
	// board.
	inFlight, sawBusyAt := waitHardBusyAt(t, c, slots, hard, 30*time.Second, func() (bool, string) {
		n := sub.batchesAcked()
		return n >= 6, fmt.Sprintf("batches acknowledged %d, want 6", n)
	})
	mu.Lock()
	ackedBefore := len(acked.reqs)
	mu.Unlock()
	c.redis.Kill()
	killedAt := time.Now()

	// While Redis is down: 503 "unavailable" within the request timeout,
	// never a hang, a 500 or a crash.
	var someTask, someBatch string
	mu.Lock()
	for id := range acked.reqs {
		someTask = id
		break
	}
	for id := range acked.batches {
		someBatch = id
		break
	}
	mu.Unlock()
	probes := []struct {
		method, path string
		body         []byte
	}{
		{"POST", "/v1/tasks", []byte(slidings[19999])},
		{"POST", "/v1/batches", batchBody(slidings[19990:19999])},
		{"GET", "/v1/tasks/" + someTask, nil},
		{"GET", "/v1/tasks/" + someTask + "?wait=5s", nil},
		{"GET", "/v1/batches/" + someBatch, nil},
		{"DELETE", "/v1/tasks/" + someTask, nil},
		{"GET", "/readyz", nil},
	}
	var slowest time.Duration
	for round := 0; round < 3; round++ {
		for _, p := range probes {
			start := time.Now()
			code, b, err := c.do(p.method, p.path, p.body)
			took := time.Since(start)
			slowest = max(slowest, took)
			var e apitype.ErrorBody
			_ = json.Unmarshal(b, &e)
			if err != nil || code != http.StatusServiceUnavailable || e.Error.Code != apitype.CodeUnavailable {
				t.Errorf("Redis down: %s %s: %d %v %.200s, want 503 unavailable", p.method, p.path, code, err, b)
			}
			// The bound catches a request that hangs on a dead Redis (it
			// would take the client's 30 s); the slack over REQUEST_TIMEOUT
			// is for this shared 2-core machine, where three fault stacks
			// solve 15-puzzles at once and one answer took 3.35 s in CI.
			// How fast a hung Redis is failed is issue 13's to measure.
			if took > 2*reqTimeout+time.Second {
				t.Errorf("Redis down: %s %s took %v, REQUEST_TIMEOUT is %v", p.method, p.path, took, reqTimeout)
			}
		}
	}
	down := time.Since(killedAt)
	if down < 3*time.Second {
		time.Sleep(3*time.Second - down)
	}
	for _, p := range append([]*proc{c.api}, c.workers...) {
		if p.Exited() {
			t.Fatalf("%s exited while Redis was down: %v", p.Name, p.Err())
		}
	}
	if err := c.redis.Restart(); err != nil {
		t.Fatal(err)
	}
	restartedAt := time.Now()
	for _, p := range append([]*proc{c.api}, c.workers...) {
		p.WaitReady(t, 30*time.Second)
	}
	reconnect := time.Since(restartedAt)
	restarted()
	// Let the submitter show that submissions work again, then stop it.
	mu.Lock()
	n0 := len(acked.batches)
	mu.Unlock()
	if !pollUntil(30*time.Second, 50*time.Millisecond, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked.batches) >= n0+2
	}) {
		t.Errorf("fewer than 2 batches acknowledged within 30s after Redis came back: %d then, %d now; statuses %v",
			n0, sub.batchesAcked(), sub.statusesNow())
	}
	sub.stop()
	statuses, worst := sub.statuses, sub.worst

	// Account for every acknowledged task.
	var lostBatches, lostTasks []string
	for id, n := range acked.batches {
		code, _, err := c.do("GET", "/v1/batches/"+id+"?limit=1", nil)
		if err == nil && code == http.StatusNotFound {
			lostBatches = append(lostBatches, id)
			continue
		}
		if b := c.waitBatch(id, 200*time.Second); !b.Done {
			t.Errorf("batch %s not done: %v", id, b.Counts)
		}
		c.checkBatch(id, n)
	}
	recs := c.waitTasks(acked.ids(), 200*time.Second)
	var stuck []string
	for _, id := range acked.ids() {
		tr, ok := recs[id]
		switch {
		case !ok:
			lostTasks = append(lostTasks, id)
		case !tr.State.Terminal():
			stuck = append(stuck, id+" ("+string(tr.State)+")")
		}
	}
	sort.Strings(lostTasks)
	if len(lostBatches) > 0 || len(lostTasks) > 0 {
		// Not silently: these acknowledged records did not survive the
		// crash. With appendfsync everysec and only the redis-server
		// process killed (the kernel keeps what was written), there
		// should be none; a machine crash may lose the last second.
		t.Logf("redis restart: LOST %d batches %v and %d task records %v that were acknowledged", len(lostBatches), lostBatches, len(lostTasks), lostTasks)
	}
	if len(stuck) > 0 {
		t.Errorf("%d acknowledged tasks never ended: %v", len(stuck), stuck)
	}
	present := map[string]string{}
	for id, r := range acked.reqs {
		if _, ok := recs[id]; ok {
			present[id] = r
		}
	}
	expectHard(t, o, hs)
	o.check(t, recs, present)
	checkHardRecords(t, recs, hard)
	// The boards running at the kill: each completed after it (so it was
	// in flight), with the exact answer, counted once in its batch (above).
	// A board seen running a few ms before the kill may have ended in
	// between (k15 is one of the shorter ones): it is not in flight, and
	// is only logged; every other must have completed after the kill, and
	// at least one must have been in flight for the scenario to count.
	// asynq's active list, where it was seen, lags the record's end: the
	// handler ends the item, returns, and asynq's Done takes the task off
	// the list one round trip later (CI saw a board ended 132 ms before
	// the kill still listed).
	const activeLag = 250 * time.Millisecond
	var attempts []int
	afterKill := 0
	for _, ti := range inFlight {
		id := itemOf(ti)
		tr := recs[id]
		attempts = append(attempts, tr.Attempts)
		switch {
		case tr.CompletedAt != nil && tr.CompletedAt.After(killedAt.Add(-time.Millisecond)):
			afterKill++
		case tr.CompletedAt != nil && tr.CompletedAt.After(sawBusyAt.Add(-activeLag)):
			t.Logf("%s (task %s) ended %v after it was seen running, before the kill landed: not in flight",
				hard[id].name, id, tr.CompletedAt.Sub(sawBusyAt).Round(time.Millisecond))
		default:
			t.Errorf("%s (task %s), active at the kill: completed at %v, want after the kill at %v (it was running then)",
				hard[id].name, id, tr.CompletedAt, killedAt.Format(time.StampMilli))
		}
	}
	if afterKill == 0 {
		t.Errorf("none of the boards seen running (%v) was in flight at the kill", hardNames(inFlight, hard))
	}
	var last time.Time
	for _, tr := range recs {
		if tr.CompletedAt != nil && tr.CompletedAt.After(last) {
			last = *tr.CompletedAt
		}
	}
	t.Logf("redis restart: in flight at the kill: %v, attempts %v", hardNames(inFlight, hard), attempts)
	t.Logf("redis restart: FIGURES acked=%d (%d before the kill) lost_records=%d stuck=0 statuses=%v down=%v slowest_503=%v slowest_failed_submit=%v reconnect=%v last_completion=%v after restart",
		len(acked.reqs), ackedBefore, len(lostTasks), statuses, restartedAt.Sub(killedAt).Round(time.Millisecond),
		slowest.Round(time.Millisecond), worst.Round(time.Millisecond), reconnect.Round(time.Millisecond), last.Sub(restartedAt).Round(100*time.Millisecond))
	for code := range statuses {
		if code != http.StatusAccepted && code != http.StatusOK && code != http.StatusServiceUnavailable {
			t.Errorf("the submitter got status %d %d times; only 200, 202 and 503 are acceptable (0: no answer)", code, statuses[code])
		}
	}
}

// submitter sends a batch of 100 sliding boards and one sweep single,
// over and over (at most 200 rounds), and remembers what the API
// acknowledged.
type submitter struct {
	mu       sync.Mutex
	acked    *workload
	at       map[string]time.Time // when each acknowledged task's answer arrived
	batchAt  map[string]time.Time // the same per batch
	statuses map[int]int          // answers by status; 0 is no answer
	worst    time.Duration        // slowest answer that was not a 202
	slowest  time.Duration        // slowest batch answer of any status
	quit     chan struct{}
	done     chan struct{}
	once     sync.Once
}

func startSubmitter(c *cluster, slidings, sweeps []string) *submitter {
	s := &submitter{acked: newWorkload(), at: map[string]time.Time{}, batchAt: map[string]time.Time{}, statuses: map[int]int{}, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for i := 0; i < 200 && (i+1)*100 <= len(slidings); i++ {
			select {
			case <-s.quit:
				return
			default:
			}
			reqs := slidings[i*100 : (i+1)*100]
			start := time.Now()
			code, b, err := c.do("POST", "/v1/batches", batchBody(reqs))
			now := time.Now()
			took := now.Sub(start)
			var ack apitype.BatchCreated
			s.mu.Lock()
			s.statuses[code]++
			s.slowest = max(s.slowest, took)
			if err == nil && code == http.StatusAccepted && json.Unmarshal(b, &ack) == nil && len(ack.TaskIDs) == len(reqs) {
				s.acked.batches[ack.ID] = len(ack.TaskIDs)
				s.batchAt[ack.ID] = now
				for j, tid := range ack.TaskIDs {
					s.acked.reqs[tid] = reqs[j]
					s.at[tid] = now
				}
			} else if took > s.worst {
				s.worst = took
			}
			s.mu.Unlock()
			req := sweeps[i%len(sweeps)]
			code, b, err = c.do("POST", "/v1/tasks", []byte(req))
			now = time.Now()
			var tr apitype.Task
			s.mu.Lock()
			s.statuses[code]++
			if err == nil && (code == http.StatusAccepted || code == http.StatusOK) && json.Unmarshal(b, &tr) == nil {
				s.acked.reqs[tr.ID] = req
				s.at[tr.ID] = now
			}
			s.mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return s
}

// stop ends the submitter and waits for it.
func (s *submitter) stop() {
	s.once.Do(func() { close(s.quit) })
	<-s.done
}

// adopt adds tasks acknowledged outside the submitter, as of now (they
// were acknowledged no later).
func (s *submitter) adopt(w *workload) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for id, n := range w.batches {
		s.acked.batches[id] = n
		s.batchAt[id] = now
	}
	for id, r := range w.reqs {
		s.acked.reqs[id] = r
		s.at[id] = now
	}
}

// statusesNow copies the answers counted by status so far.
func (s *submitter) statusesNow() map[int]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int]int, len(s.statuses))
	for k, v := range s.statuses {
		out[k] = v
	}
	return out
}

// batchesAcked is how many batches were acknowledged so far.
func (s *submitter) batchesAcked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acked.batches)
}
