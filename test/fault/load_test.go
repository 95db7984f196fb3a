//go:build fault

package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
)

// testLoad submits 100,000 distinct 8-puzzles as ten batches of 10,000 to
// three workers. None may be lost or counted twice, and the processes'
// peak memory must stay bounded.
func testLoad(t *testing.T) {
	const (
		batches = 10
		per     = 10000
		// Peak RSS bounds, KiB: about 5x what was measured (api 50 MiB,
		// workers 23 MiB), so a leak or an unbounded buffer fails.
		apiMax = 256 * 1024
		wrkMax = 128 * 1024
	)
	c := newCluster(t, clusterOpts{workers: 3})
	o := newOracle()
	w := newWorkload()
	reqs := eightPuzzles(batches*per, 50)
	start := time.Now()
	for i := 0; i < batches; i++ {
		w.addBatch(c, reqs[i*per:(i+1)*per])
	}
	submitted := time.Since(start)
	for id := range w.batches {
		if b := c.waitBatch(id, 4*time.Minute); !b.Done {
			t.Fatalf("batch %s not done after 4 minutes: %v", id, b.Counts)
		}
	}
	elapsed := time.Since(start)

	recs := map[string]apitype.Task{}
	for id, n := range w.batches {
		for k, v := range c.checkBatch(id, n) {
			recs[k] = v
		}
	}
	o.check(t, recs, w.reqs)
	lost := len(w.reqs) - len(recs)
	counted, rerun := settledTasksTotal(t, len(w.reqs), c.workers...), 0
	for _, tr := range recs {
		if tr.Attempts != 1 {
			rerun++
		}
	}
	if counted != len(w.reqs) {
		t.Errorf("puzzleq_tasks_total is %d over the workers, want %d: %d duplicated or missed", counted, len(w.reqs), counted-len(w.reqs))
	}
	apiRSS := c.api.PeakRSS()
	var wRSS []string
	var wPeak int64
	for _, wk := range c.workers {
		r := wk.PeakRSS()
		wPeak = max(wPeak, r)
		wRSS = append(wRSS, fmtKB(r))
	}
	t.Logf("load: FIGURES tasks=%d lost=%d duplicated=%d rerun=%d submit=%v all_done=%v (%.0f tasks/s) peak_rss api=%s workers=%v",
		len(w.reqs), lost, counted-len(w.reqs), rerun, submitted.Round(time.Millisecond), elapsed.Round(time.Millisecond),
		float64(len(w.reqs))/elapsed.Seconds(), fmtKB(apiRSS), wRSS)
	if apiRSS > apiMax || wPeak > wrkMax {
		t.Errorf("peak RSS api %s, worker %s; bounds %s and %s", fmtKB(apiRSS), fmtKB(wPeak), fmtKB(apiMax), fmtKB(wrkMax))
	}
}

// latencies sends n single submissions from par goroutines and returns
// their latencies, sorted; every one must be accepted.
func latencies(t *testing.T, c *cluster, hc *http.Client, reqs []string, par int, w *workload, mu *sync.Mutex) []time.Duration {
	t.Helper()
	var (
		next atomic.Int64
		lmu  sync.Mutex
		out  []time.Duration
		wg   sync.WaitGroup
		bad  atomic.Int64
	)
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(reqs) {
					return
				}
				start := time.Now()
				code, b, err := c.doOn(hc, "POST", "/v1/tasks", []byte(reqs[i]))
				d := time.Since(start)
				if err != nil || code != http.StatusAccepted {
					if bad.Add(1) <= 5 {
						t.Errorf("submit: %d %v %.200s", code, err, b)
					}
					continue
				}
				id := idOf(b)
				mu.Lock()
				w.reqs[id] = reqs[i]
				mu.Unlock()
				lmu.Lock()
				out = append(out, d)
				lmu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(float64(len(ds))*p))]
}

// stormMix is one storm: which share of the clients does what.
type stormMix struct {
	name string
	// pagers of every 4 clients page the batch (limit=100, 10 reads a
	// second each); the others long-poll a task (wait=30s) or, one in
	// four, the batch.
	pagers int
	// p99Max bounds the submit p99 during the storm. Held long polls
	// cost nearly nothing; 250 pagers (2,500 reads of 100 records a
	// second) saturate two shared cores, which is capacity, not
	// starvation: submissions slow down but every one is accepted.
	p99Max time.Duration
}

// testSlowConsumer holds 1,000 concurrent clients on the API and measures
// single submissions meanwhile: they must all succeed, and their p99 is
// reported next to that of a quiet API. One storm is long polls only
// (tasks and batches, wait=30s); the other turns a quarter of the clients
// into batch pagers. No worker runs during the storms, so every long poll
// really waits; afterwards workers solve everything and every task is
// checked.
func testSlowConsumer(t *testing.T) {
	const (
		clients = 1000
		storm   = 15 * time.Second
		n       = 400 // submissions per measurement
	)
	mixes := []stormMix{
		{name: "long polls only", pagers: 0, p99Max: time.Second},
		{name: "long polls and batch paging", pagers: 1, p99Max: 3 * time.Second},
	}
	c := newCluster(t, clusterOpts{})
	o := newOracle()
	w := newWorkload()
	pool := eightPuzzles(1000+(1+len(mixes))*n, 60)
	targets := w.addBatch(c, pool[:1000])
	var batchID string
	for id := range w.batches {
		batchID = id
	}
	var mu sync.Mutex
	next := pool[1000:]
	take := func() []string { r := next[:n]; next = next[n:]; return r }

	sub := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer sub.CloseIdleConnections()
	quiet := latencies(t, c, sub, take(), 4, w, &mu)
	t.Logf("slow consumer: FIGURES quiet submit p50=%v p99=%v (n=%d)", pct(quiet, 0.5).Round(100*time.Microsecond), pct(quiet, 0.99).Round(100*time.Microsecond), len(quiet))
	if len(quiet) != n {
		t.Errorf("accepted %d of %d quiet submissions", len(quiet), n)
	}

	for _, mix := range mixes {
		stormy, held, total := runStorm(t, c, mix, clients, storm, targets, batchID, func() []time.Duration {
			return latencies(t, c, sub, take(), 4, w, &mu)
		})
		t.Logf("slow consumer (%s): FIGURES clients=%d in_flight=%d storm_requests=%d submit p50=%v p99=%v max=%v (n=%d)",
			mix.name, clients, held, total, pct(stormy, 0.5).Round(100*time.Microsecond), pct(stormy, 0.99).Round(100*time.Microsecond),
			pct(stormy, 1).Round(100*time.Microsecond), len(stormy))
		if len(stormy) != n {
			t.Errorf("%s: accepted %d of %d submissions", mix.name, len(stormy), n)
		}
		if p := pct(stormy, 0.99); p > mix.p99Max {
			t.Errorf("%s: submit p99 during the storm %v, over %v", mix.name, p, mix.p99Max)
		}
	}

	// Now solve everything and check it.
	c.startWorker(nil)
	c.startWorker(nil)
	w.verify(t, c, o, 2*time.Minute)
}

// runStorm starts clients looping on their reads for at most d (and 1,000
// requests each), runs measure once most of them are in flight, then ends
// the storm. Every storm request must answer 200. It returns measure's
// latencies, the requests in flight when measuring began, and how many
// storm requests were made.
func runStorm(t *testing.T, c *cluster, mix stormMix, clients int, d time.Duration, targets []string, batchID string,
	measure func() []time.Duration) ([]time.Duration, int64, int64) {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: 0}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 45 * time.Second}
	ctx, cancel := context.WithTimeout(ctxT(t), d)
	defer cancel()
	var (
		wg       sync.WaitGroup
		inflight atomic.Int64
		reqs     atomic.Int64
		fails    atomic.Int64
		firstErr atomic.Value
	)
	for i := range clients {
		path, pager := "/v1/tasks/"+targets[i%len(targets)]+"?wait=30s", false
		switch {
		case i%4 < mix.pagers:
			path, pager = "/v1/batches/"+batchID+"?limit=100&cursor="+strconv.Itoa(rand.Intn(900)), true
		case i%4 == 3:
			path = "/v1/batches/" + batchID + "?limit=1&wait=30s"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 1000 && ctx.Err() == nil; k++ {
				req, _ := http.NewRequestWithContext(ctx, "GET", c.api.URL()+path, nil)
				inflight.Add(1)
				resp, err := hc.Do(req)
				inflight.Add(-1)
				reqs.Add(1)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if ctx.Err() != nil {
					return
				}
				if err != nil || resp.StatusCode != http.StatusOK {
					fails.Add(1)
					if err == nil {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
					firstErr.CompareAndSwap(nil, err)
				}
				if pager {
					time.Sleep(100 * time.Millisecond) // a reader paging, not a busy loop
				}
			}
		}()
	}
	want := int64(clients - clients*mix.pagers/4)
	if !pollUntil(15*time.Second, 10*time.Millisecond, func() bool { return inflight.Load() >= want*99/100 }) {
		cancel()
		wg.Wait()
		t.Fatalf("%s: only %d storm requests in flight, want %d", mix.name, inflight.Load(), want)
	}
	// Measure the steady storm, not the burst of 1,000 connections being
	// opened (which alone costs submissions up to ~200 ms for a moment).
	time.Sleep(time.Second)
	held := inflight.Load()
	lat := measure()
	cancel()
	wg.Wait()
	if n := fails.Load(); n > 0 {
		t.Errorf("%s: %d storm requests failed; first: %v", mix.name, n, firstErr.Load())
	}
	return lat, held, reqs.Load()
}

func idOf(b []byte) string {
	var tr apitype.Task
	_ = json.Unmarshal(b, &tr)
	return tr.ID
}
