//go:build fault

package fault

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/tasks"
)

// testAPIKilledMidSingles kills the API (SIGKILL) while 16 clients submit
// single tasks: the submit script records, counts and queues each task
// at once, so afterwards every record has its queued task and the reverse
// (no record waits for a task that was never queued), the quota equals
// the unfinished records, and once a worker runs, every acknowledged task
// completes with the right answer.
func testAPIKilledMidSingles(t *testing.T) {
	settings := map[string]string{"API_KEYS": faultOwner + ":" + faultKey, "RATE_LIMIT_PER_SECOND": "100000",
		"RATE_LIMIT_BURST": "100000", "MAX_PENDING_PER_KEY": "100000"}
	c := newCluster(t, clusterOpts{api: settings}) // no worker yet: tasks stay queued
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	reqs := eightPuzzles(20000, 12)
	var (
		next  atomic.Int64
		mu    sync.Mutex
		acked = map[string]string{} // task ID -> request
		wg    sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(reqs)) {
					return
				}
				code, _, b, err := authed(t, hc, c.api.URL(), http.MethodPost, "/v1/tasks", []byte(reqs[i]), nil)
				if err != nil {
					return // the API is gone
				}
				var tr apitype.Task
				if code == http.StatusAccepted && json.Unmarshal(b, &tr) == nil {
					mu.Lock()
					acked[tr.ID] = reqs[i]
					mu.Unlock()
				}
			}
		})
	}
	if !pollUntil(30*time.Second, time.Millisecond, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) >= 500 }) {
		t.Fatal("fewer than 500 tasks acknowledged in 30 s")
	}
	c.api.Kill()
	wg.Wait()

	// Every record has its queued task and every queued task its record.
	ctx := context.Background()
	records := map[string]bool{}
	iter := c.rdb.Scan(ctx, 0, "pq:task:*", 1000).Iterator()
	for iter.Next(ctx) {
		records[strings.TrimPrefix(iter.Val(), "pq:task:")] = true
	}
	queued := map[string]bool{}
	// The 8-puzzles went to the cheap lane's queue.
	iter = c.rdb.Scan(ctx, 0, "asynq:{"+tasks.QueueCheap+"}:t:*", 1000).Iterator()
	for iter.Next(ctx) {
		queued[strings.TrimPrefix(iter.Val(), "asynq:{"+tasks.QueueCheap+"}:t:")] = true
	}
	if n, err := c.rdb.LLen(ctx, "asynq:{"+tasks.QueueCheap+"}:pending").Result(); err != nil || int(n) != len(queued) {
		t.Fatalf("the pending list holds %d (%v), the queue %d tasks", n, err, len(queued))
	}
	for id := range records {
		if !queued[id] {
			t.Errorf("record %s has no queued task", id)
		}
	}
	for id := range queued {
		if !records[id] {
			t.Errorf("queued task %s has no record", id)
		}
	}
	mu.Lock()
	for id := range acked {
		if !records[id] {
			t.Errorf("acknowledged task %s has no record", id)
		}
	}
	t.Logf("killed after %d acknowledged; %d recorded and queued (the rest were written but not yet answered)", len(acked), len(records))
	mu.Unlock()
	c.checkQuota(t, "after the kill")

	// A new API and a worker: every acknowledged task completes, right.
	c.api = c.startReplica(t, "api2", settings)
	c.startWorker(nil)
	o := newOracle()
	for id, req := range acked {
		tr, ok := c.getTaskAuthed(t, hc, id)
		for deadline := time.Now().Add(60 * time.Second); ok && !tr.State.Terminal() && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			tr, ok = c.getTaskAuthed(t, hc, id)
		}
		if !ok || tr.State != apitype.TaskStateCompleted || string(compact(tr.Result)) != string(o.expect(t, req)) {
			t.Fatalf("task %s: %+v (found %v), want completed with %s", id, tr, ok, o.expect(t, req))
		}
	}
	if n := c.checkQuota(t, "at the end"); n != 0 {
		t.Errorf("quota %d at the end, want 0", n)
	}
}
