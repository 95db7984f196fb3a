//go:build fault

package fault

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
)

// TestRedisOOM puts Redis at maxmemory (CONFIG SET maxmemory, under the
// noeviction policy Redis runs with) while a 100,000-item batch of
// 8-puzzles is being solved by two workers, holds it there, and lifts it.
// Such a Redis answers PING and refuses every write, so the API's every
// route answers 503: its /readyz must say so (503 within 5 s of the
// limit), and once Redis takes writes again the batch must finish within
// 5 s, every item completed once with the exact answer, as the load test
// finishes such a batch in one to two seconds.
func TestRedisOOM(t *testing.T) {
	timed(t)
	const (
		items      = 100000
		readyBound = 5 * time.Second
		doneBound  = 5 * time.Second
		held       = 8 * time.Second
	)
	c := newCluster(t, clusterOpts{workers: 2, authed: true, api: map[string]string{"MAX_PENDING_PER_KEY": "200000"}})
	reqs := eightPuzzles(items, 77)
	ctx := context.Background()
	var ack apitype.BatchCreated
	if err := json.Unmarshal(c.must("POST", "/v1/batches", batchBody(reqs), http.StatusAccepted), &ack); err != nil || ack.Total != items {
		t.Fatalf("batch answer: %+v %v", ack, err)
	}
	id := ack.ID
	// The limit comes once the workers are solving: some items ended,
	// most not.
	var endedAtLimit int
	if !pollUntil(60*time.Second, 5*time.Millisecond, func() bool {
		b, ok := c.batchCounts(id)
		endedAtLimit = b.Counts.Completed + b.Counts.Failed
		return ok && b.Counts.Completed > 0
	}) {
		t.Fatal("precondition: no item completed within a minute")
	}
	if err := c.rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	limitAt := time.Now()
	// /readyz fails.
	var notReady time.Duration
	if pollUntil(readyBound+5*time.Second, 50*time.Millisecond, func() bool {
		code, _, err := c.do("GET", "/readyz", nil)
		return err == nil && code == http.StatusServiceUnavailable
	}) {
		notReady = time.Since(limitAt)
	}
	code, b, _ := c.do("GET", "/readyz", nil)
	var e apitype.ErrorBody
	_ = json.Unmarshal(b, &e)
	if notReady == 0 || notReady > readyBound || code != http.StatusServiceUnavailable || e.Error.Code != apitype.CodeUnavailable {
		t.Errorf("/readyz %v after the limit: %d %s; want 503 unavailable within %v", time.Since(limitAt).Round(time.Millisecond), code, b, readyBound)
	}
	for _, wk := range c.workers {
		r, err := http.Get("http://" + wk.Addr + "/readyz")
		if err != nil || r.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("worker %s /readyz with Redis at maxmemory: %v %v", wk.Name, r, err)
		}
		if r != nil {
			r.Body.Close()
		}
	}
	if d := held - time.Since(limitAt); d > 0 {
		time.Sleep(d)
	}
	// Reads still work: how far the batch got while Redis refused writes.
	endedAtLift, _ := c.rdb.HGet(ctx, "pq:batch:"+id, "ended").Int()
	if err := c.rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	liftedAt := time.Now()
	var readyAgain time.Duration
	var last apitype.Batch
	done := pollUntil(2*time.Minute, 50*time.Millisecond, func() bool {
		if readyAgain == 0 {
			if code, _, err := c.do("GET", "/readyz", nil); err == nil && code == http.StatusOK {
				readyAgain = time.Since(liftedAt)
			}
		}
		b, ok := c.batchCounts(id)
		if ok {
			last = b
		}
		return ok && b.Done
	})
	finished := time.Since(liftedAt)
	t.Logf("oom: FIGURES items=%d ended_at_limit=%d ended_at_lift=%d readyz_503_after=%v held=%v readyz_200_after_lift=%v batch_done_after_lift=%v",
		items, endedAtLimit, endedAtLift, notReady.Round(time.Millisecond), held, readyAgain.Round(time.Millisecond), finished.Round(time.Millisecond))
	if !done {
		t.Fatalf("batch not done 2 minutes after the limit was lifted: %+v", last.Counts)
	}
	if endedAtLimit >= items {
		t.Errorf("precondition: the batch had ended before the limit came")
	}
	if endedAtLift >= items {
		t.Errorf("precondition: every item had ended before the limit was lifted")
	}
	if finished > doneBound {
		t.Errorf("the batch finished %v after the limit was lifted, want within %v", finished.Round(time.Millisecond), doneBound)
	}
	checkItems(t, c.http, c.api.URL(), id, reqs, newOracle())
}

// batchCounts reads a batch's counts (no items); ok is false on any
// answer but 200, as while Redis refuses writes.
func (c *cluster) batchCounts(id string) (apitype.Batch, bool) {
	var b apitype.Batch
	code, body, err := c.do("GET", "/v1/batches/"+id+"?limit=1", nil)
	if err != nil || code != http.StatusOK || json.Unmarshal(body, &b) != nil {
		return b, false
	}
	return b, true
}
