//go:build fault

package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testLoad submits 100,000 distinct 8-puzzles as ten batches of 10,000 to
// three workers. None may be lost or counted twice, and the processes'
// peak memory must stay bounded.
func testLoad(t *testing.T) {
	const (
		batches = 10
		per     = 10000
		apiMax  = 1024 * 1024 // KiB: peak RSS bounds
		wrkMax  = 512 * 1024
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

	recs := map[string]taskResource{}
	for id, n := range w.batches {
		for k, v := range c.checkBatch(id, n) {
			recs[k] = v
		}
	}
	o.check(t, recs, w.reqs)
	lost := len(w.reqs) - len(recs)
	counted, rerun := 0, 0
	for _, wk := range c.workers {
		counted += workerTasksTotal(t, wk)
	}
	for _, tr := range recs {
		if tr.Attempts != 1 {
			rerun++
		}
	}
	if counted != len(w.reqs) {
		t.Errorf("puzzleq_tasks_total is %d over the workers, want %d: %d duplicated or missed", counted, len(w.reqs), counted-len(w.reqs))
	}
	apiRSS := c.api.peakRSS()
	var wRSS []string
	var wPeak int64
	for _, wk := range c.workers {
		r := wk.peakRSS()
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

// testSlowConsumer holds 1,000 concurrent clients on the API, long-polling
// tasks and batches (wait=30s) and paging a batch, and measures single
// submissions meanwhile: they must all succeed, with a p99 latency
// comparable to that of a quiet API. No worker runs during the storm, so
// every long poll really waits; afterwards workers solve everything and
// every task is checked.
func testSlowConsumer(t *testing.T) {
	const (
		clients = 1000
		storm   = 20 * time.Second
		p99Max  = 2 * time.Second
	)
	c := newCluster(t, clusterOpts{})
	o := newOracle()
	w := newWorkload()
	pool := eightPuzzles(1000+2*400, 60)
	targets := w.addBatch(c, pool[:1000])
	var batchID string
	for id := range w.batches {
		batchID = id
	}
	var mu sync.Mutex

	sub := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer sub.CloseIdleConnections()
	quiet := latencies(t, c, sub, pool[1000:1400], 4, w, &mu)

	// The storm: every client loops on its request until the storm ends.
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: 0}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 45 * time.Second}
	ctx, cancel := context.WithTimeout(ctxT(t), storm)
	defer cancel()
	var (
		wg       sync.WaitGroup
		inflight atomic.Int64
		reqs     atomic.Int64
		fails    atomic.Int64
		firstErr atomic.Value
	)
	for i := range clients {
		var path string
		switch i % 4 {
		case 0, 1:
			path = "/v1/tasks/" + targets[i] + "?wait=30s"
		case 2:
			path = "/v1/batches/" + batchID + "?limit=1&wait=30s"
		default:
			path = "/v1/batches/" + batchID + "?limit=100&cursor=" + strconv.Itoa(rand.Intn(900))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 1000 && ctx.Err() == nil; n++ {
				req, _ := http.NewRequestWithContext(ctx, "GET", c.api.base()+path, nil)
				inflight.Add(1)
				resp, err := hc.Do(req)
				inflight.Add(-1)
				reqs.Add(1)
				if ctx.Err() != nil {
					if err == nil {
						resp.Body.Close()
					}
					return
				}
				if err != nil || resp.StatusCode != http.StatusOK {
					fails.Add(1)
					if err == nil {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
					firstErr.CompareAndSwap(nil, err)
				}
				if err == nil {
					resp.Body.Close()
				}
				if i%4 == 3 {
					time.Sleep(100 * time.Millisecond) // a reader paging, not a busy loop
				}
			}
		}()
	}
	if !pollUntil(15*time.Second, 10*time.Millisecond, func() bool { return inflight.Load() >= clients*3/4 }) {
		t.Fatalf("only %d of %d storm requests in flight", inflight.Load(), clients)
	}
	held := inflight.Load()
	stormy := latencies(t, c, sub, pool[1400:1800], 4, w, &mu)
	stillHeld := inflight.Load()
	cancel()
	wg.Wait()
	if n := fails.Load(); n > 0 {
		t.Errorf("%d storm requests failed; first: %v", n, firstErr.Load())
	}
	t.Logf("slow consumer: FIGURES clients=%d in_flight=%d..%d storm_requests=%d submit_p50 quiet=%v storm=%v; submit_p99 quiet=%v storm=%v (n=%d each)",
		clients, held, stillHeld, reqs.Load(), pct(quiet, 0.5).Round(100*time.Microsecond), pct(stormy, 0.5).Round(100*time.Microsecond),
		pct(quiet, 0.99).Round(100*time.Microsecond), pct(stormy, 0.99).Round(100*time.Microsecond), len(stormy))
	if len(stormy) != 400 || len(quiet) != 400 {
		t.Errorf("accepted %d quiet and %d storm submissions, want 400 each", len(quiet), len(stormy))
	}
	if p := pct(stormy, 0.99); p > p99Max {
		t.Errorf("submit p99 during the storm %v, over %v", p, p99Max)
	}

	// Now solve everything and check it.
	c.startWorker(nil)
	c.startWorker(nil)
	w.verify(t, c, o, 2*time.Minute)
}

func idOf(b []byte) string {
	var tr taskResource
	_ = json.Unmarshal(b, &tr)
	return tr.ID
}
