//go:build fault

package fault

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

// testRetryLockFrozenAPI freezes an API replica (SIGSTOP: a paused VM, a
// stalled container) while it holds a batch retry's lock
// (POST /v1/batches/{id}/retry; internal/store/retry.go: a 6 s lease
// renewed every 2 s) and has re-opened part of a canceled batch, with a
// worker running what it re-opened:
//
//   - another replica's retry is refused (409) while the lease runs, and
//     goes through once it lapses, within the lease of the freeze;
//   - the frozen replica resumes while the other's retry runs, and
//     finishes its own loop over the chunks: it must not corrupt the
//     batch. Polled every few milliseconds straight from Redis, the
//     counts always add up to the total and completed never steps back;
//     in the end every item completed exactly once (attempts 1, one
//     result line each, the worker's puzzleq_tasks_total equal to the
//     items), the two retries re-opened the items between them exactly
//     once (when the frozen one could still answer), and the key's quota
//     is back to 0.
func testRetryLockFrozenAPI(t *testing.T) {
	const (
		n     = 60000
		lease = 6 * time.Second // the store's retryLease
	)
	apiEnv := map[string]string{"CHUNK_SIZE": "128"}
	c := newCluster(t, clusterOpts{authed: true, api: apiEnv})
	b := c.startReplica(t, "api2", map[string]string{"CHUNK_SIZE": "128", "API_KEYS": faultOwner + ":" + faultKey,
		"RATE_LIMIT_PER_SECOND": "10000", "RATE_LIMIT_BURST": "10000"})
	b.WaitReady(t, 30*time.Second)
	req := `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,0],[7,8,6]]}}`
	reqs := make([]string, n)
	for i := range reqs {
		reqs[i] = req
	}
	var ack apitype.BatchCreated
	if err := json.Unmarshal(c.must("POST", "/v1/batches", batchBody(reqs), http.StatusAccepted), &ack); err != nil || ack.Total != n {
		t.Fatalf("submit: %+v %v", ack, err)
	}
	id := ack.ID
	c.must("DELETE", "/v1/batches/"+id, nil, http.StatusOK)
	if got := c.waitBatch(id, 5*time.Second); got.Counts.Canceled != n {
		t.Fatalf("after the cancel: %+v", got.Counts)
	}
	ctx := ctxT(t)
	bk, lock := "pq:batch:"+id, "pq:batch:"+id+":retry"
	counts := func() (map[string]int, error) {
		v, err := c.rdb.HMGet(ctx, bk, "pending", "active", "completed", "failed", "canceled").Result()
		if err != nil {
			return nil, err
		}
		out := map[string]int{}
		for i, f := range []string{"pending", "active", "completed", "failed", "canceled"} {
			s, _ := v[i].(string)
			out[f], _ = strconv.Atoi(s)
		}
		return out, nil
	}

	// The monitor: the counts add up and completed only grows.
	var (
		monMu   sync.Mutex
		monBad  []string
		samples int
	)
	monStop, monDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(monDone)
		last := 0
		for {
			select {
			case <-monStop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			cs, err := counts()
			if err != nil {
				continue
			}
			sum := cs["pending"] + cs["active"] + cs["completed"] + cs["failed"] + cs["canceled"]
			monMu.Lock()
			samples++
			if (sum != n || cs["completed"] < last || cs["failed"] != 0) && len(monBad) < 10 {
				monBad = append(monBad, fmt.Sprintf("%v (sum %d, completed before %d)", cs, sum, last))
			}
			monMu.Unlock()
			last = cs["completed"]
		}
	}()
	defer func() {
		select {
		case <-monStop:
		default:
			close(monStop)
		}
		<-monDone
	}()

	worker := c.startWorker(nil)
	type answer struct {
		code int
		body []byte
		err  error
		at   time.Time
	}
	retryOn := func(p *proc) answer {
		pc := &cluster{t: t, api: p, http: c.http, key: c.key}
		code, body, err := pc.do("POST", "/v1/batches/"+id+"/retry", nil)
		return answer{code, body, err, time.Now()}
	}
	aDone := make(chan answer, 1)
	go func() { aDone <- retryOn(c.api) }()
	// Freeze A once it holds the lock and has re-opened part of the batch.
	var tokenA string
	if !pollUntil(20*time.Second, time.Millisecond, func() bool {
		cs, err := counts()
		if err != nil || cs["canceled"] == n {
			return false
		}
		tokenA, _ = c.rdb.Get(ctx, lock).Result()
		return tokenA != ""
	}) {
		t.Fatalf("A's retry never re-opened anything under its lock")
	}
	c.api.Signal(t, syscall.SIGSTOP)
	frozenAt := time.Now()
	frozen := true
	defer func() {
		if frozen {
			c.api.Signal(t, syscall.SIGCONT)
		}
	}()
	time.Sleep(50 * time.Millisecond) // a script A sent before the stop has run
	atFreeze, err := counts()
	if err != nil || atFreeze["canceled"] == 0 {
		t.Fatalf("precondition: A frozen midway, counts %v %v; want some items still canceled", atFreeze, err)
	}
	reopenedByA := n - atFreeze["canceled"]

	// B retries every 200 ms: refused while A's lease runs, then through.
	var (
		refused   int
		bAns      = make(chan answer, 1)
		bStart    time.Time
		resumedAt time.Time // when A was resumed, B's retry running
	)
	for time.Since(frozenAt) < lease+5*time.Second {
		bStart = time.Now()
		ch := make(chan answer, 1)
		go func() { ch <- retryOn(b) }()
		// B's lock is visible before its answer: resume A then, so that
		// the two loops over the chunks overlap.
		var got answer
		resumed := false
		for got.at.IsZero() {
			select {
			case got = <-ch:
			case <-time.After(time.Millisecond):
				if !resumed {
					if v, _ := c.rdb.Get(ctx, lock).Result(); v != "" && v != tokenA {
						c.api.Signal(t, syscall.SIGCONT)
						frozen, resumed, resumedAt = false, true, time.Now()
					}
				}
			}
		}
		if got.err == nil && got.code == http.StatusConflict {
			refused++
			time.Sleep(200 * time.Millisecond)
			continue
		}
		bAns <- got
		break
	}
	overlapped := !resumedAt.IsZero()
	if frozen {
		c.api.Signal(t, syscall.SIGCONT)
		frozen, resumedAt = false, time.Now()
	}
	var gotB answer
	select {
	case gotB = <-bAns:
	default:
		t.Fatalf("B's retry never went through within %v of A's freeze (refused %d times)", lease+5*time.Second, refused)
	}
	bThrough := gotB.at.Sub(frozenAt)
	var rB apitype.BatchRetried
	if gotB.err != nil || gotB.code != http.StatusOK || json.Unmarshal(gotB.body, &rB) != nil {
		t.Fatalf("B's retry: %d %v %s", gotB.code, gotB.err, gotB.body)
	}
	if !overlapped {
		t.Errorf("A was resumed after B's retry ended, not while it ran: the two loops over the chunks did not overlap")
	}
	if refused == 0 {
		t.Errorf("B's first retry, right after A froze holding the lock, went through: the lease did not hold")
	}
	if bStart.Sub(frozenAt) > lease+time.Second {
		t.Errorf("B's retry went through %v after A froze, want within the lease (%v) and a poll", bStart.Sub(frozenAt), lease)
	}
	gotA := <-aDone
	var rA apitype.BatchRetried
	aOK := gotA.err == nil && gotA.code == http.StatusOK && json.Unmarshal(gotA.body, &rA) == nil
	if !aOK && (gotA.err != nil || gotA.code != http.StatusServiceUnavailable) {
		t.Errorf("A's retry, resumed: %d %v %.300s; want 200, or 503 for a call cut by the freeze", gotA.code, gotA.err, gotA.body)
	}
	// A complete answer counts exactly; one cut short (the freeze made a
	// call's reply arrive past its deadline, though Redis ran the call)
	// counts what it knows, a lower bound (apitype.BatchRetried), and
	// wrong_items below checks that every item was re-opened once.
	if aOK && rA.Complete && rA.Retried+rB.Retried != n {
		t.Errorf("A re-opened %d and B %d items, %d in all; want each of the %d exactly once", rA.Retried, rB.Retried, rA.Retried+rB.Retried, n)
	}
	if aOK && !rA.Complete && rA.Retried+rB.Retried > n {
		t.Errorf("A (cut short) re-opened %d and B %d items, %d in all; more than the %d there are", rA.Retried, rB.Retried, rA.Retried+rB.Retried, n)
	}
	if ttl, _ := c.rdb.PTTL(ctx, lock).Result(); ttl > 0 {
		if v, _ := c.rdb.Get(ctx, lock).Result(); v == tokenA {
			t.Errorf("A's lock is held again after it resumed (ttl %v)", ttl)
		}
	}

	done := c.waitBatch(id, 2*time.Minute)
	close(monStop)
	<-monDone
	if !done.Done || done.Counts != (apitype.Counts{Completed: n}) {
		t.Fatalf("after both retries and the worker: %+v", done.Counts)
	}
	monMu.Lock()
	for _, m := range monBad {
		t.Errorf("the batch's counts, polled from Redis: %s", m)
	}
	nSamples := samples
	monMu.Unlock()
	lines := string(c.must("GET", "/v1/batches/"+id+"/results?state=completed", nil, http.StatusOK))
	if got := strings.Count(lines, "\n"); got != n {
		t.Errorf("%d completed result lines, want %d", got, n)
	}
	want := compact([]byte(solveLocal(t, req)))
	again := 0
	cursor := "0"
	for page := 0; page < n/1000+2; page++ {
		var l apitype.TaskList
		if err := json.Unmarshal(c.must("GET", "/v1/batches/"+id+"/items?limit=1000&cursor="+cursor, nil, http.StatusOK), &l); err != nil {
			t.Fatal(err)
		}
		for _, it := range l.Tasks {
			if it.Attempts != 1 || it.State != apitype.TaskStateCompleted || !bytes.Equal(compact(it.Result), want) {
				if again++; again <= 5 {
					t.Errorf("item %s: %s after %d attempts, result %.100s; want completed once with %s", it.ID, it.State, it.Attempts, it.Result, want)
				}
			}
		}
		if l.NextCursor == nil {
			break
		}
		cursor = *l.NextCursor
	}
	if tt := settledTasksTotal(t, n, worker); tt != n {
		t.Errorf("the worker counted %d ended tasks, want exactly %d", tt, n)
	}
	c.checkQuota(t, "after the batch completed")
	t.Logf("retry lock, frozen API: FIGURES items=%d reopened_by_A_before_freeze=%d B_refused=%d B_through_after_freeze=%.2fs A_resumed_after_freeze=%.2fs (B's retry running: %v) A_answer=%d A_retried=%d B_retried=%d count_samples=%d bad_samples=%d wrong_items=%d",
		n, reopenedByA, refused, bThrough.Seconds(), resumedAt.Sub(frozenAt).Seconds(), overlapped, gotA.code, rA.Retried, rB.Retried, nSamples, len(monBad), again)
}
