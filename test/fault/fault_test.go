//go:build fault

package fault

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestFault runs every scenario. The three that mostly wait on asynq's
// lease recovery (worker crash, Redis restart, Redis host crash) run
// alongside a sequence of the others; the load and the storm run alone in that sequence so their
// figures are not skewed by each other.
func TestFault(t *testing.T) {
	t.Run("group", func(t *testing.T) {
		t.Run("WorkerCrash", func(t *testing.T) { t.Parallel(); testWorkerCrash(t) })
		t.Run("RedisRestart", func(t *testing.T) { t.Parallel(); testRedisRestart(t) })
		t.Run("RedisHostCrash", func(t *testing.T) { t.Parallel(); testHostCrash(t) })
		t.Run("Sequence", func(t *testing.T) {
			t.Parallel()
			t.Run("DuplicateDelivery", testDuplicateDelivery)
			t.Run("GracefulShutdown", testGracefulShutdown)
			t.Run("Load", testLoad)
			t.Run("SlowConsumer", testSlowConsumer)
		})
	})
}

// workload is a set of submitted tasks: request by task ID, and the
// batches with their sizes.
type workload struct {
	reqs    map[string]string
	batches map[string]int
}

func newWorkload() *workload { return &workload{reqs: map[string]string{}, batches: map[string]int{}} }

func (w *workload) addBatch(c *cluster, reqs []string) []string {
	id, ids := c.submitBatch(reqs)
	w.batches[id] = len(ids)
	for i, tid := range ids {
		w.reqs[tid] = reqs[i]
	}
	return ids
}

func (w *workload) addTask(c *cluster, req string) string {
	id := c.submitTask(req)
	w.reqs[id] = req
	return id
}

func (w *workload) ids() []string {
	out := make([]string, 0, len(w.reqs))
	for id := range w.reqs {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// verify waits for every batch and task of w to end and checks each one:
// completed, with the local solver's result, and every batch counted
// exactly. It returns the records.
func (w *workload) verify(t *testing.T, c *cluster, o *oracle, d time.Duration) map[string]taskResource {
	t.Helper()
	deadline := time.Now().Add(d)
	recs := map[string]taskResource{}
	for id, n := range w.batches {
		if b := c.waitBatch(id, time.Until(deadline)); !b.Done {
			t.Errorf("batch %s not done after %v: %v", id, d, b.Counts)
		}
		for k, v := range c.checkBatch(id, n) {
			recs[k] = v
		}
	}
	var singles []string
	for id := range w.reqs {
		if _, ok := recs[id]; !ok {
			singles = append(singles, id)
		}
	}
	for k, v := range c.waitTasks(singles, time.Until(deadline)) {
		recs[k] = v
	}
	o.check(t, recs, w.reqs)
	return recs
}

// mixed submits 300 tasks of every kind: cheap items in batches (chunked),
// sweeps as a batch and as singles. The slow sweeps come first so workers
// are busy with them early.
func mixed(t *testing.T, c *cluster, w *workload, seed int64) {
	t.Helper()
	slow, corpus := slowSweeps(t), corpusSweeps(t)
	if len(slow) != 8 || len(corpus) < 47 {
		t.Fatalf("%d slow sweeps and %d corpus boards, want 8 and at least 47", len(slow), len(corpus))
	}
	w.addBatch(c, append(append([]string{}, slow...), corpus[:27]...)) // 35 sweeps, one task each
	w.addBatch(c, append(eightPuzzles(160, seed), randomFills(40, 4, seed)...))
	for _, r := range eightPuzzles(205, seed)[160:] { // 45 more, distinct from the batch's
		w.addTask(c, r)
	}
	for _, r := range corpus[27:47] {
		w.addTask(c, r)
	}
}

// itemsOf returns the record IDs an asynq task carries.
func itemsOf(ti *asynq.TaskInfo) []string {
	if ti.Type == tasks.TypeChunk {
		var p tasks.ChunkPayload
		_ = json.Unmarshal(ti.Payload, &p)
		ids := make([]string, len(p.Items))
		for i, it := range p.Items {
			ids[i] = it.ID
		}
		return ids
	}
	var p tasks.SolvePayload
	_ = json.Unmarshal(ti.Payload, &p)
	return []string{p.ID}
}

// activeTasks lists asynq's active tasks of both queues.
func (c *cluster) activeTasks() []*asynq.TaskInfo {
	var out []*asynq.TaskInfo
	for _, q := range tasks.Queues {
		ts, err := c.insp.ListActiveTasks(q, asynq.PageSize(1000))
		if err == nil {
			out = append(out, ts...)
		}
	}
	return out
}

// queued counts tasks waiting in asynq (pending, retry, scheduled).
func (c *cluster) queued() int {
	n := 0
	for _, q := range tasks.Queues {
		if qi, err := c.insp.GetQueueInfo(q); err == nil {
			n += qi.Pending + qi.Retry + qi.Scheduled
		}
	}
	return n
}

// testWorkerCrash: three workers process 300 mixed tasks; one is killed
// with SIGKILL while every worker slot is busy. The tasks it held stay
// active until asynq's lease expires and a recoverer requeues them; then
// they complete elsewhere. Nothing is lost, no batch miscounts.
func testWorkerCrash(t *testing.T) {
	c := newCluster(t, clusterOpts{
		api:     map[string]string{"CHUNK_SIZE": "8"},
		worker:  map[string]string{"SWEEP_MAX_NODES": "100000000000"},
		workers: 3,
	})
	o := newOracle()
	w := newWorkload()
	mixed(t, c, w, 1)
	if len(w.reqs) != 300 {
		t.Fatalf("submitted %d tasks, want 300", len(w.reqs))
	}

	// Kill worker 1 at a moment every slot is busy and work is still
	// queued: then each worker, worker 1 too, holds tasks.
	var before []*asynq.TaskInfo
	if !pollUntil(30*time.Second, 5*time.Millisecond, func() bool {
		before = c.activeTasks()
		return len(before) == 6 && c.queued() > 0
	}) {
		t.Fatalf("never saw all 6 slots busy with work queued (active %d)", len(before))
	}
	victim := c.workers[0]
	victim.Signal(t, syscall.SIGKILL)
	killedAt := time.Now()
	victim.WaitExit(5 * time.Second)
	// Listed after the kill: it holds everything the dead worker held,
	// even a task it fetched between the check above and the signal.
	activeAtKill := map[string]*asynq.TaskInfo{}
	for _, ti := range c.activeTasks() {
		activeAtKill[ti.ID] = ti
	}

	// The victim's tasks are the ones still active once everything else
	// has drained: nothing else takes more than a couple of seconds, and
	// asynq cannot requeue them before the lease (30 s) plus the
	// recoverer's 30 s cutoff have passed.
	var orphans []*asynq.TaskInfo
	if !pollUntil(50*time.Second, 100*time.Millisecond, func() bool {
		act := c.activeTasks()
		if len(act) == 0 || len(act) > 2 || c.queued() > 0 {
			return false
		}
		for _, ti := range act {
			if activeAtKill[ti.ID] == nil {
				return false
			}
		}
		orphans = act
		return true
	}) {
		t.Fatalf("the killed worker's tasks were not isolated within 50s: active %d, queued %d", len(c.activeTasks()), c.queued())
	}
	var held []string
	for _, ti := range orphans {
		for _, id := range itemsOf(ti) {
			if tr, ok := c.getTask(id, 0); ok && !terminal(tr.State) {
				held = append(held, id)
			}
		}
	}
	drained := time.Since(killedAt)
	t.Logf("worker crash: killed %s (pid %d) holding %d asynq tasks (%d unfinished items); the rest drained %v after the kill",
		victim.Name, victim.PID(), len(orphans), len(held), drained.Round(time.Millisecond))
	if len(held) == 0 {
		t.Fatal("the killed worker held no unfinished items; nothing to recover")
	}

	recs := c.waitTasks(held, 200*time.Second)
	var last time.Time
	for _, id := range held {
		if tr := recs[id]; tr.CompletedAt != nil && tr.CompletedAt.After(last) {
			last = *tr.CompletedAt
		}
	}
	recovery := last.Sub(killedAt)
	t.Logf("worker crash: recovery took %v (kill to the last held item completed; asynq lease 30s + recoverer cutoff 30s + recoverer interval up to 60s + forwarder up to 5s)",
		recovery.Round(100*time.Millisecond))

	all := w.verify(t, c, o, 60*time.Second)
	retried := 0
	for _, id := range held {
		if all[id].Attempts < 2 {
			t.Errorf("held item %s has %d attempts, want 2 (ran again after the crash)", id, all[id].Attempts)
		}
		retried++
	}
	lost := 0
	for id := range w.reqs {
		if _, ok := all[id]; !ok {
			lost++
		}
	}
	t.Logf("worker crash: FIGURES tasks=%d lost=%d held_by_killed=%d recovery=%v", len(w.reqs), lost, retried, recovery.Round(100*time.Millisecond))
	if recovery > 150*time.Second {
		t.Errorf("recovery took %v, over asynq's worst case (~125 s) with margin", recovery)
	}
}

// testGracefulShutdown: SIGTERM a worker under load. It must exit within
// its SHUTDOWN_TIMEOUT; what it ran either finished there or was requeued
// and finished on another worker. The victim runs alone until it is busy
// with a slow sweep, so the tasks active at SIGTERM are its own. With a
// timeout longer than any task they finish in place; with one shorter than
// the sweep it runs (1 ms) asynq gives them back to the queue, and they
// complete on another worker (or the victim's own write lands first, and
// the requeued copy is skipped as a duplicate).
func testGracefulShutdown(t *testing.T) {
	cases := []struct {
		name     string
		timeout  time.Duration
		requeued bool // whether the active tasks must run again elsewhere
	}{
		{"finishes in place", 5 * time.Second, false},
		{"requeues the rest", time.Millisecond, true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, clusterOpts{
				api:    map[string]string{"CHUNK_SIZE": "8"},
				worker: map[string]string{"SWEEP_MAX_NODES": "100000000000", "SHUTDOWN_TIMEOUT": "5s"},
			})
			victim := c.startWorker(map[string]string{"SHUTDOWN_TIMEOUT": tc.timeout.String()})
			o := newOracle()
			w := newWorkload()
			slow := map[string]bool{}
			for _, r := range slowSweeps(t) {
				slow[r] = true
			}
			mixed(t, c, w, int64(10+i))
			var active []*asynq.TaskInfo
			if !pollUntil(60*time.Second, 5*time.Millisecond, func() bool {
				active = c.activeTasks()
				for _, ti := range active {
					if ids := itemsOf(ti); len(ids) == 1 && slow[w.reqs[ids[0]]] {
						return len(active) == 2
					}
				}
				return false
			}) {
				t.Fatal("the victim never ran a slow sweep")
			}
			victim.Signal(t, syscall.SIGTERM)
			sent := time.Now()
			c.startWorker(nil) // takes over what the victim leaves
			if !victim.WaitExit(tc.timeout + 10*time.Second) {
				t.Fatalf("worker did not exit within SHUTDOWN_TIMEOUT %v + 10s", tc.timeout)
			}
			took := time.Since(sent)
			if victim.Err() != nil {
				t.Errorf("worker exit: %v", victim.Err())
			}
			// The processor waits SHUTDOWN_TIMEOUT at most; the rest of
			// asynq's Shutdown (heartbeat, syncer) adds a little.
			if took > tc.timeout+3*time.Second {
				t.Errorf("worker took %v to exit, SHUTDOWN_TIMEOUT is %v", took, tc.timeout)
			}
			c.startWorker(nil)
			all := w.verify(t, c, o, 120*time.Second)
			again := 0
			for _, ti := range active {
				for _, id := range itemsOf(ti) {
					if all[id].Attempts > 1 {
						again++
					}
				}
			}
			// asynq logs each task it gives back at the timeout.
			pushed := strings.Count(stacktest.Tail(victim.LogPath, 1000), "back to queue")
			t.Logf("graceful shutdown (%s): FIGURES SIGTERM->exit=%v SHUTDOWN_TIMEOUT=%v active_at_sigterm=%d requeued=%d ran_again_elsewhere=%d tasks=%d lost=0",
				tc.name, took.Round(time.Millisecond), tc.timeout, len(active), pushed, again, len(w.reqs))
			if tc.requeued && pushed == 0 {
				t.Errorf("no task was requeued, though SHUTDOWN_TIMEOUT %v is shorter than the sweep it ran", tc.timeout)
			}
			if !tc.requeued && (pushed > 0 || again > 0) {
				t.Errorf("%d tasks requeued and %d ran again, though SHUTDOWN_TIMEOUT %v outlasts every task", pushed, again, tc.timeout)
			}
		})
	}
}

// fmtKB renders KiB as MiB.
func fmtKB(kb int64) string { return fmt.Sprintf("%.1f MiB", float64(kb)/1024) }
