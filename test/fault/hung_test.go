//go:build fault

package fault

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/tasks"
)

// probe is one request of a route, with what it must answer.
type probe struct {
	route        string // the figure's name
	method, path string
	body         []byte
	ok           int // the status of a healthy answer
}

// probeResult is a probe's answer.
type probeResult struct {
	code int
	body []byte
	err  error
	took time.Duration
}

// runProbes sends every probe at once and returns the answers by route.
func (c *cluster) runProbes(ps []probe) map[string]probeResult {
	out := make(map[string]probeResult, len(ps))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() {
			start := time.Now()
			code, b, err := c.do(p.method, p.path, p.body)
			r := probeResult{code: code, body: b, err: err, took: time.Since(start)}
			mu.Lock()
			out[p.route] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// figures renders durations by route, sorted by route.
func figures(d map[string]time.Duration) string {
	var parts []string
	for r, v := range d {
		parts = append(parts, fmt.Sprintf("%s=%v", strings.ReplaceAll(r, " ", "_"), v.Round(time.Millisecond)))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// testRedisFreeze freezes redis-server with SIGSTOP: a hung Redis (CLIENT
// PAUSE, a VM pause, a partition that drops packets without a reset).
// The kernel still accepts connections and takes writes, and nothing
// answers, so only deadlines end a call. While it is frozen every route
// must answer 503 "unavailable" within 2.5 s, /readyz within its own 2 s
// limit, and long polls held from before the freeze within their wait
// and the same 2.5 s; the API and the worker must keep running. After
// SIGCONT every route must answer normally within 2 s, and every task
// acknowledged before, during or after must complete with its exact
// answer, each batch counted exactly.
func testRedisFreeze(t *testing.T) {
	const (
		bound     = 2500 * time.Millisecond // every route, Redis frozen
		readyz    = 2300 * time.Millisecond // /readyz: its 2 s limit, and scheduling slack
		heldWait  = 3 * time.Second         // the held long polls' ?wait=
		recovered = 2 * time.Second         // every route healthy after SIGCONT
	)
	c := newCluster(t, clusterOpts{api: map[string]string{"CHUNK_SIZE": "4"}, workers: 1})
	o := newOracle()
	reqs := eightPuzzles(60, 131)
	w := newWorkload()
	done := w.addTask(c, reqs[0])
	doneBatch := w.addBatch(c, reqs[1:9])
	w.verify(t, c, o, 60*time.Second)
	batchID := doneBatch[0][:strings.IndexByte(doneBatch[0], '-')]

	// Work that stays pending across the freeze: the queues are paused,
	// so the worker runs nothing while it lives through the freeze.
	for _, q := range []string{tasks.QueueInteractive, tasks.QueueBulk} {
		if err := c.insp.PauseQueue(q); err != nil {
			t.Fatal(err)
		}
	}
	pending := w.addTask(c, reqs[9])
	pendingItems := w.addBatch(c, reqs[10:18])
	pendingBatch := pendingItems[0][:strings.IndexByte(pendingItems[0], '-')]
	canceled := c.submitTask(reqs[18]) // DELETEd while frozen: it may end canceled

	// Long polls held from before the freeze.
	held := []probe{
		{"held GET task wait", "GET", "/v1/tasks/" + pending + "?wait=" + heldWait.String(), nil, 200},
		{"held GET batch wait", "GET", "/v1/batches/" + pendingBatch + "?limit=1&wait=" + heldWait.String(), nil, 200},
		{"held GET results wait", "GET", "/v1/batches/" + pendingBatch + "/results?wait=" + heldWait.String(), nil, 200},
	}
	heldc := make(chan map[string]probeResult, 1)
	go func() { heldc <- c.runProbes(held) }()
	time.Sleep(300 * time.Millisecond)

	// routes are the probes of round i. While Redis is frozen the long
	// polls are on pending work; after it, when what counts is how soon
	// each answers, on ended work (the submit-and-wait on a cached
	// request), so that none sits out its wait.
	routes := func(i int) []probe {
		waitTask, waitBatch, waitReq, waitOK := pending, pendingBatch, reqs[24+i], 202
		if i >= 2 {
			waitTask, waitBatch, waitReq, waitOK = done, batchID, reqs[0], 200
		}
		return []probe{
			{"POST tasks", "POST", "/v1/tasks", []byte(reqs[20+i]), 202},
			{"POST tasks wait", "POST", "/v1/tasks?wait=1s", []byte(waitReq), waitOK},
			{"POST batches", "POST", "/v1/batches", batchBody(reqs[28+4*i : 32+4*i]), 202},
			{"GET task", "GET", "/v1/tasks/" + done, nil, 200},
			{"GET item", "GET", "/v1/tasks/" + doneBatch[3], nil, 200},
			{"GET task wait", "GET", "/v1/tasks/" + waitTask + "?wait=1s", nil, 200},
			{"GET batch", "GET", "/v1/batches/" + batchID, nil, 200},
			{"GET batch wait", "GET", "/v1/batches/" + waitBatch + "?wait=1s", nil, 200},
			{"GET results", "GET", "/v1/batches/" + batchID + "/results", nil, 200},
			{"GET results wait", "GET", "/v1/batches/" + waitBatch + "/results?wait=1s", nil, 200},
			{"GET output", "GET", "/v1/batches/" + batchID + "/output", nil, 200},
			{"DELETE task", "DELETE", "/v1/tasks/" + canceled, nil, 200},
			{"GET readyz", "GET", "/readyz", nil, 200},
		}
	}

	if err := c.redis.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := c.redis.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer thaw()

	// Two rounds: the first meets the pool's connections, the second
	// new ones dialed to the frozen server (the kernel accepts them).
	slowest := map[string]time.Duration{}
	for round := range 2 {
		for route, r := range c.runProbes(routes(round)) {
			slowest[route] = max(slowest[route], r.took)
			var e apitype.ErrorBody
			_ = json.Unmarshal(r.body, &e)
			if r.err != nil || r.code != http.StatusServiceUnavailable || e.Error.Code != apitype.CodeUnavailable {
				t.Errorf("Redis frozen, round %d: %s: %d %v %.200s, want 503 unavailable", round, route, r.code, r.err, r.body)
			}
			limit := bound
			if route == "GET readyz" {
				limit = readyz
			}
			if r.took > limit {
				t.Errorf("Redis frozen, round %d: %s answered after %v, want within %v", round, route, r.took, limit)
			}
		}
	}
	// The held polls answer (their wait out, the last read failed)
	// within their wait and the bound, never hang.
	heldTook := map[string]time.Duration{}
	for route, r := range <-heldc {
		heldTook[route] = r.took
		if r.err != nil || (r.code != http.StatusServiceUnavailable && r.code != http.StatusOK) {
			t.Errorf("Redis frozen: %s: %d %v %.200s, want 503 (or 200 read before the freeze)", route, r.code, r.err, r.body)
		}
		if r.took > heldWait+bound {
			t.Errorf("Redis frozen: %s answered after %v, want within its wait %v + %v", route, r.took, heldWait, bound)
		}
	}
	frozenFor := time.Since(frozenAt)
	for _, p := range append([]*proc{c.api}, c.workers...) {
		if p.Exited() {
			t.Fatalf("%s exited while Redis was frozen: %v", p.Name, p.Err())
		}
	}

	// Thaw; every route must answer normally within 2 s. The POSTs that
	// succeed are acknowledged: they join the workload.
	thaw()
	thawedAt := time.Now()
	recovery := map[string]time.Duration{}
	for i := 0; len(recovery) < len(routes(0)) && time.Since(thawedAt) < 10*time.Second; i++ {
		ps := routes(2 + i%2)
		if i > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		var todo []probe
		for _, p := range ps {
			if _, ok := recovery[p.route]; !ok {
				todo = append(todo, p)
			}
		}
		for route, r := range c.runProbes(todo) {
			var p probe
			for _, q := range todo {
				if q.route == route {
					p = q
				}
			}
			ok := r.err == nil && r.code == p.ok
			if route == "DELETE task" {
				// Canceled now, or by the DELETE sent while frozen, which
				// Redis ran when it woke.
				ok = r.err == nil && (r.code == http.StatusOK || r.code == http.StatusConflict)
			}
			if !ok {
				continue
			}
			recovery[route] = time.Since(thawedAt)
			switch p.method {
			case "POST":
				if p.path == "/v1/batches" {
					id, ids := decodeBatchAck(t, r.body)
					w.batches[id] = len(ids)
					for k, tid := range ids {
						w.reqs[tid] = reqs[28+4*(2+i%2)+k]
					}
				} else {
					var tr apitype.Task
					if err := json.Unmarshal(r.body, &tr); err != nil {
						t.Fatal(err)
					}
					w.reqs[tr.ID] = string(p.body)
				}
			}
		}
	}
	for _, p := range routes(0) {
		if d, ok := recovery[p.route]; !ok || d > recovered {
			t.Errorf("after SIGCONT: %s healthy after %v (ok %v), want within %v", p.route, d, ok, recovered)
		}
	}

	for _, q := range []string{tasks.QueueInteractive, tasks.QueueBulk} {
		if err := c.insp.UnpauseQueue(q); err != nil {
			t.Fatal(err)
		}
	}
	w.verify(t, c, o, 60*time.Second)
	if tr, ok := c.getTask(canceled, 30*time.Second); !ok || (tr.State != apitype.TaskStateCanceled && tr.State != apitype.TaskStateCompleted) {
		t.Errorf("task %s, DELETEd while Redis was frozen: %+v, want canceled or completed", canceled, tr)
	}
	c.api.WaitReady(t, 5*time.Second)
	t.Logf("redis freeze: FIGURES frozen_for=%v tasks=%d batches=%d frozen_503: %s held_polls: %s recovered_after_sigcont: %s",
		frozenFor.Round(time.Millisecond), len(w.reqs), len(w.batches), figures(slowest), figures(heldTook), figures(recovery))
}

// TestFailFast runs issue 13's fail-fast scenarios side by side, each
// with its own Redis, API and workers: a frozen Redis, and an API
// stopped with long polls held.
func TestFailFast(t *testing.T) {
	t.Run("group", func(t *testing.T) {
		t.Run("RedisFreeze", func(t *testing.T) { t.Parallel(); timed(t); testRedisFreeze(t) })
	})
}
