//go:build fault

package fault

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/tasks"
)

// ackTimeout is REDIS_ACK_TIMEOUT in the acks scenarios, and ackBound
// how long a request may take to answer 503 when no replica confirms.
const (
	ackTimeout = time.Second
	ackBound   = ackTimeout + 500*time.Millisecond
)

// ackedCluster starts a master with one replica and a cluster on the
// master with REDIS_ACK_REPLICAS=1.
func ackedCluster(t *testing.T, workers int) (*cluster, *redistest.Server) {
	t.Helper()
	master := redistest.Start(t)
	replica := redistest.Start(t, redistest.ReplicaOf(master.Addr)...)
	waitReplicaLinked(t, replica, 10*time.Second)
	acks := map[string]string{"REDIS_ACK_REPLICAS": "1", "REDIS_ACK_TIMEOUT": ackTimeout.String()}
	c := newCluster(t, clusterOpts{redis: master, rdb: master.Client(t),
		redisEnv: map[string]string{"REDIS_URL": master.URL()}, api: acks, worker: acks, workers: workers})
	c.api.WaitReady(t, 10*time.Second)
	return c, replica
}

// TestAckReplicas runs the API and a worker with REDIS_ACK_REPLICAS=1 on a
// master whose one replica is frozen (SIGSTOP), which takes every write
// and confirms none.
//
// FrozenReplica: submissions of single tasks and batches answer 503 with
// Retry-After within REDIS_ACK_TIMEOUT plus 0.5 s, never a 2xx; /readyz
// fails; after SIGCONT the same requests answer 2xx at once and /readyz
// is ready again.
//
// UnconfirmedFinish: a single task and a 1-item batch, both confirmed,
// are solved while the replica is frozen. The worker's final write takes
// on the master but is not confirmed, so the worker does not ack: asynq
// keeps the task and runs it again, and the task ends once the replica
// is back, exactly once (one count in the batch, one in the workers'
// puzzleq_tasks_total each).
func TestAckReplicas(t *testing.T) {
	t.Run("FrozenReplica", func(t *testing.T) { t.Parallel(); timed(t); testAckFrozenReplica(t) })
	t.Run("UnconfirmedFinish", func(t *testing.T) { t.Parallel(); timed(t); testAckUnconfirmedFinish(t) })
}

func testAckFrozenReplica(t *testing.T) {
	c, replica := ackedCluster(t, 1)
	puzzles := eightPuzzles(40, 71)
	o := newOracle()
	first := c.submitTask(puzzles[0])

	thawReplica := freezeServer(t, replica)
	defer thawReplica()
	// Each request answers 503 in time; none is accepted.
	var slowest time.Duration
	for i := range 3 {
		for _, r := range []struct {
			path string
			body []byte
		}{
			{"/v1/tasks", []byte(puzzles[1+i])},
			{"/v1/batches", batchBody(puzzles[10+2*i : 12+2*i])},
		} {
			start := time.Now()
			req, _ := http.NewRequest("POST", c.api.URL()+r.path, strings.NewReader(string(r.body)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := c.http.Do(req)
			d := time.Since(start)
			slowest = max(slowest, d)
			if err != nil {
				t.Fatalf("POST %s with the replica frozen: %v after %v", r.path, err, d)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || d > ackBound {
				t.Errorf("POST %s with the replica frozen: %d (Retry-After %q) after %v, want 503 with Retry-After within %v",
					r.path, resp.StatusCode, resp.Header.Get("Retry-After"), d, ackBound)
			}
		}
	}
	var notReady time.Duration
	freezeStart := time.Now()
	if !pollUntil(10*time.Second, 100*time.Millisecond, func() bool {
		code, _, err := c.do("GET", "/readyz", nil)
		return err == nil && code == http.StatusServiceUnavailable
	}) {
		t.Errorf("/readyz did not fail within 10 s of the replica's freeze")
	}
	notReady = time.Since(freezeStart)

	thawReplica()
	thawed := time.Now()
	start := time.Now()
	id := c.submitTask(puzzles[20])
	firstAck := time.Since(start)
	if firstAck > ackTimeout {
		t.Errorf("the first submission after SIGCONT took %v", firstAck)
	}
	bid, _ := c.submitBatch(puzzles[21:23])
	var ready time.Duration
	if !pollUntil(10*time.Second, 50*time.Millisecond, func() bool {
		code, _, err := c.do("GET", "/readyz", nil)
		return err == nil && code == http.StatusOK
	}) {
		t.Errorf("/readyz not ready within 10 s of SIGCONT")
	}
	ready = time.Since(thawed)
	recs := c.waitTasks([]string{first, id}, 60*time.Second)
	o.check(t, recs, map[string]string{first: puzzles[0], id: puzzles[20]})
	if b := c.waitBatch(bid, 60*time.Second); !b.Done {
		t.Errorf("batch %s not done: %v", bid, b.Counts)
	}
	t.Logf("acks, frozen replica: FIGURES slowest_503=%v readyz_failed_after=%v first_2xx_after_sigcont=%v readyz_ready_after_sigcont=%v",
		slowest.Round(time.Millisecond), notReady.Round(100*time.Millisecond), firstAck.Round(time.Millisecond), ready.Round(100*time.Millisecond))
}

func testAckUnconfirmedFinish(t *testing.T) {
	c, replica := ackedCluster(t, 1)
	w := c.workers[0]
	w.WaitReady(t, 10*time.Second)
	puzzles := eightPuzzles(2, 73)
	o := newOracle()
	// Confirmed submissions, which the frozen worker cannot take yet.
	w.Signal(t, syscall.SIGSTOP)
	id := c.submitTask(puzzles[0])
	bid, _ := c.submitBatch(puzzles[1:2])

	thawReplica := freezeServer(t, replica)
	defer thawReplica()
	w.Signal(t, syscall.SIGCONT)
	// The worker solves both and writes the results on the master...
	if !pollUntil(20*time.Second, 50*time.Millisecond, func() bool {
		tr, ok := c.getTask(id, 0)
		b := c.batch(bid)
		return ok && tr.State == apitype.TaskStateCompleted && b.Counts.Completed == 1
	}) {
		t.Fatalf("the task and the batch item did not complete on the master within 20 s")
	}
	// ...but acks neither while the replica confirms nothing: asynq
	// still holds the single task, its last error the confirmation's,
	// for several deliveries.
	time.Sleep(3 * ackBound)
	info, err := c.insp.GetTaskInfo(tasks.QueueCheap, id)
	if err != nil {
		t.Fatalf("asynq no longer holds the task whose final write was not confirmed: %v", err)
	}
	if !strings.Contains(info.LastErr, "not confirmed") {
		t.Errorf("the unacked task's last error: %q, want the confirmation's", info.LastErr)
	}
	if info.Retried != 0 {
		t.Errorf("the unconfirmed deliveries counted %d retries, want none", info.Retried)
	}

	thawReplica()
	thawed := time.Now()
	var acked time.Duration
	if !pollUntil(20*time.Second, 50*time.Millisecond, func() bool {
		_, err := c.insp.GetTaskInfo(tasks.QueueCheap, id)
		return errors.Is(err, asynq.ErrTaskNotFound)
	}) {
		t.Errorf("the task was not acked within 20 s of SIGCONT")
	}
	acked = time.Since(thawed)
	recs := c.waitTasks([]string{id}, 30*time.Second)
	o.check(t, recs, map[string]string{id: puzzles[0]})
	b := c.waitBatch(bid, 30*time.Second)
	if b.Counts.Completed != 1 || b.Total != 1 {
		t.Errorf("batch counts %v, want the one item completed once", b.Counts)
	}
	c.checkBatch(bid, 1)
	if n := settledTasksTotal(t, 2, w); n != 2 {
		t.Errorf("the worker counted %d tasks, want 2: each ends exactly once", n)
	}
	raw, _ := json.Marshal(info)
	t.Logf("acks, unconfirmed finish: FIGURES acked_after_sigcont=%v last_err_while_frozen=%q task=%s", acked.Round(time.Millisecond), info.LastErr, raw)
}
