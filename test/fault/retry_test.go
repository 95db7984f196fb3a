//go:build fault

package fault

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// TestRetryKilledMidwayIsFinishedByTheNext kills the API (SIGKILL) while
// it retries a canceled batch of 200,000 items: each chunk it re-opened
// did so whole (counts and feed in one script), so the batch's counts
// still add up; a second retry on a new API re-opens the rest, and a
// worker then runs every item exactly once.
func TestRetryKilledMidwayIsFinishedByTheNext(t *testing.T) {
	const n = 200000
	c := newCluster(t, clusterOpts{})
	reqs := make([]string, n)
	for i := range reqs {
		reqs[i] = `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`
	}
	var ack apitype.BatchCreated
	if err := json.Unmarshal(c.must("POST", "/v1/batches", batchBody(reqs), http.StatusAccepted), &ack); err != nil || ack.Total != n {
		t.Fatalf("submit: %+v %v", ack, err)
	}
	id := ack.ID
	c.must("DELETE", "/v1/batches/"+id, nil, http.StatusOK)
	if b := c.waitBatch(id, time.Second); b.Counts.Canceled != n {
		t.Fatalf("after the cancel: %+v", b.Counts)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		c.do("POST", "/v1/batches/"+id+"/retry", nil) // cut by the kill
	}()
	time.Sleep(600 * time.Millisecond)
	c.api.Kill()
	<-done
	c.api = stacktest.StartProc(t, "api2", apiBin, map[string]string{"REDIS_URL": c.redis.URL(), "HTTP_ADDR": freeAddr(t), "LOG_FORMAT": "text"})

	b := c.waitBatch(id, time.Second)
	reopened := b.Counts.Pending
	if b.Counts.Pending+b.Counts.Canceled != n || b.Counts.Active+b.Counts.Completed+b.Counts.Failed != 0 {
		t.Fatalf("after the killed retry, the counts do not add up: %+v", b.Counts)
	}
	if reopened == 0 || reopened == n {
		t.Logf("the kill came when %d of %d items were re-opened: the test did not cut a retry midway", reopened, n)
	}
	// The killed retry's lock outlives it by at most its lease (6 s):
	// until then another retry is 409 conflict, "wait, then retry".
	var r apitype.BatchRetried
	lockedFor := time.Now()
	for {
		code, body, err := c.do("POST", "/v1/batches/"+id+"/retry", nil)
		if err == nil && code == http.StatusConflict && time.Since(lockedFor) < 15*time.Second {
			time.Sleep(250 * time.Millisecond)
			continue
		}
		if err != nil || code != http.StatusOK {
			t.Fatalf("the second retry: %d %v %s", code, err, body)
		}
		if err := json.Unmarshal(body, &r); err != nil || r.Retried != n-reopened {
			t.Fatalf("the second retry re-opened %d (%v), want the %d left", r.Retried, err, n-reopened)
		}
		break
	}
	t.Logf("FIGURES retry after the kill: the dead retry's lock refused the next for %.1fs", time.Since(lockedFor).Seconds())
	t.Logf("retry killed midway: %d of %d re-opened by the first, %d by the second", reopened, n, r.Retried)

	c.startWorker(nil)
	b = c.waitBatch(id, 2*time.Minute)
	if !b.Done || b.Counts.Completed != n {
		t.Fatalf("after the worker ran: %+v", b.Counts)
	}
	// Each item ran once: its one start is its one attempt.
	lines := string(c.must("GET", "/v1/batches/"+id+"/results?state=completed", nil, http.StatusOK))
	if got := strings.Count(lines, "\n"); got != n {
		t.Fatalf("%d completed result lines, want %d", got, n)
	}
	items := c.must("GET", "/v1/batches/"+id+"/items?limit=1000", nil, http.StatusOK)
	var l apitype.TaskList
	if err := json.Unmarshal(items, &l); err != nil {
		t.Fatal(err)
	}
	for _, it := range l.Tasks {
		if it.Attempts != 1 || it.State != apitype.TaskStateCompleted {
			t.Fatalf("item %s: %s after %d attempts", it.ID, it.State, it.Attempts)
		}
	}
}
