//go:build fault

package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestFault runs every scenario. First it builds the 15-puzzle's pattern
// databases into a directory the workers load them from. The Sequence
// (load, slow consumer, flood, batch flood) runs first and alone, one case
// after the other, so that what it measures (throughput, submit p99
// through a storm, an 8-puzzle's latency beside a flood, another key's
// search beside one key's hard batch) is skewed by nothing else of the
// suite: it is not parallel, and the group's parallel cases wait for it.
//
// Then the group's cases run side by side, in three steps so that no
// case's own timing is crowded out. The Redis restart starts first: it
// waits a minute or two on asynq's lease recovery, and which of the two
// depends on how soon after its workers start it kills Redis (asynq's
// recoverer runs at a worker's start and every minute after; 1 m 2 s on a
// quiet start, 1 m 57 s beside eight other clusters starting). Once Redis
// is back the worker crash starts, which also waits on asynq for a minute
// after its measured recovery; once it waits, the others run two at a
// time beside the two (beside): the killed worker of a joined solve, the
// killed workers of a batch item holding a key's slot and of one leading
// a solve that identical items wait on, the Redis host crash, the two long freezes (Redis past the workers' cutoff,
// an API holding a batch retry's lock), a frozen worker, duplicate
// delivery, graceful shutdown and a shutdown with Redis frozen. The group orders and bounds its cases
// itself, with -parallel raised to let every case of it wait at once
// (minParallel): go test's own bound (GOMAXPROCS by default) starts
// parallel cases in no set order.
func TestFault(t *testing.T) {
	timed(t)
	ensurePDB(t)
	t.Run("group", func(t *testing.T) {
		restarted, waiting := newGate(), newGate()
		t.Run("RedisRestart", func(t *testing.T) {
			restarted.arm(t)
			t.Parallel()
			timed(t)
			testRedisRestart(t, restarted.open)
		})
		t.Run("WorkerCrash", func(t *testing.T) {
			waiting.arm(t)
			t.Parallel()
			restarted.wait()
			timed(t)
			testWorkerCrash(t, waiting.open)
		})
		for _, sc := range []struct {
			name string
			f    func(*testing.T)
		}{
			{"FrozenWorker", testFrozenWorker},
			{"RedisHostCrash", testHostCrash},
			{"JoinWorkerKill", testJoinWorkerKill},
			{"BatchItemWorkerKill", testBatchItemWorkerKill},
			{"RedisFreezePastCutoff", testRedisFreezePastCutoff},
			{"RetryLockFrozenAPI", testRetryLockFrozenAPI},
			{"DuplicateDelivery", testDuplicateDelivery},
			{"GracefulShutdown", testGracefulShutdown},
			{"ShutdownRedisFrozen", testShutdownRedisFrozen},
		} {
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				restarted.wait()
				waiting.wait()
				beside(t)
				timed(t)
				sc.f(t)
			})
		}
		t.Run("Sequence", func(t *testing.T) {
			for _, sc := range []struct {
				name string
				f    func(*testing.T)
			}{
				{"Load", testLoad},
				{"SlowConsumer", testSlowConsumer},
				{"Flood", testFlood},
				{"BatchFlood", testBatchFlood},
				{"FairShare", testFairShare},
			} {
				t.Run(sc.name, func(t *testing.T) { timed(t); sc.f(t) })
			}
		})
	})
}

// gate lets the group's cases wait until another case reached a point of
// its own (open). A case arms its gate before t.Parallel, so a gate whose
// case does not run (-run left it out) is never waited for, and one whose
// case ends early opens then.
type gate struct {
	armed bool
	once  sync.Once
	ch    chan struct{}
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) arm(t *testing.T) { g.armed = true; t.Cleanup(g.open) }
func (g *gate) open()            { g.once.Do(func() { close(g.ch) }) }
func (g *gate) wait() {
	if g.armed {
		<-g.ch
	}
}

// besideSlots is how many of TestFault's shorter cases run at once beside
// the worker crash and the Redis restart (the frozen worker's two
// clusters, which sleep through a 20 s freeze, count as one, and so do the
// batch item worker kill's two, which wait for asynq's recovery).
var besideSlots = make(chan struct{}, 2)

// beside waits for one of besideSlots and gives it back when t ends.
func beside(t *testing.T) {
	besideSlots <- struct{}{}
	t.Cleanup(func() { <-besideSlots })
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
func (w *workload) verify(t *testing.T, c *cluster, o *oracle, d time.Duration) map[string]apitype.Task {
	t.Helper()
	deadline := time.Now().Add(d)
	recs := map[string]apitype.Task{}
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
	w.addBatch(c, append(eightPuzzles(160, seed), testgen.Fills(40, 4, seed)...))
	for _, r := range eightPuzzles(205, seed)[160:] { // 45 more, distinct from the batch's
		w.addTask(c, r)
	}
	for _, r := range corpus[27:47] {
		w.addTask(c, r)
	}
}

// itemsOf returns the IDs of the items an asynq task carries, where the
// task alone says: a single task's ID, or the one item of a batch's own
// unit. A chunk unit's items need the batch's records: see
// cluster.unitItems.
func itemsOf(ti *asynq.TaskInfo) []string {
	if ti.Type == tasks.TypeUnit {
		var r tasks.UnitRef
		if json.Unmarshal(ti.Payload, &r) != nil {
			return nil
		}
		if chunk, n, err := tasks.ParseUnit(r.Unit); err == nil && !chunk {
			return []string{apitype.ItemID(r.BatchID, n)}
		}
		return nil
	}
	var p tasks.SolvePayload
	_ = json.Unmarshal(ti.Payload, &p)
	return []string{p.ID}
}

// itemOf is the item an asynq task carries alone: a single task, or a
// batch item in its own unit (ti.ID, the asynq ID, for anything else).
func itemOf(ti *asynq.TaskInfo) string {
	if ids := itemsOf(ti); len(ids) == 1 {
		return ids[0]
	}
	return ti.ID
}

// unitItems returns the IDs of the items an asynq task carries, reading a
// chunk unit's items from its batch's kind map (docs/batches.md): the
// chunk's items that do not run in their own units.
func (c *cluster) unitItems(ti *asynq.TaskInfo) []string {
	var r tasks.UnitRef
	if ti.Type != tasks.TypeUnit || json.Unmarshal(ti.Payload, &r) != nil {
		return itemsOf(ti)
	}
	chunk, j, err := tasks.ParseUnit(r.Unit)
	if err != nil || !chunk {
		return itemsOf(ti)
	}
	ctx := context.Background()
	stride, err := c.rdb.HGet(ctx, "pq:batch:"+r.BatchID, "stride").Int()
	if err != nil {
		c.t.Fatalf("read the stride of batch %s: %v", r.BatchID, err)
	}
	kinds, err := c.rdb.HGet(ctx, "pq:batch:"+r.BatchID+":req", "m"+strconv.Itoa(j)).Result()
	if err != nil {
		c.t.Fatalf("read the kind map of chunk %d of batch %s: %v", j, r.BatchID, err)
	}
	var ids []string
	for k := 0; k < len(kinds); k++ {
		if 'a' <= kinds[k] && kinds[k] <= 'z' {
			ids = append(ids, apitype.ItemID(r.BatchID, j*stride+k))
		}
	}
	return ids
}

// solveQueues are the queues of solves: the solver slots' and the cheap
// lane's.
var solveQueues = slices.Concat(tasks.Queues, tasks.CheapQueues)

// activeTasks lists asynq's active tasks of every queue of solves.
func (c *cluster) activeTasks() []*asynq.TaskInfo {
	var out []*asynq.TaskInfo
	for _, q := range solveQueues {
		ts, err := c.insp.ListActiveTasks(q, asynq.PageSize(1000))
		if err == nil {
			out = append(out, ts...)
		}
	}
	return out
}

// solverActive returns the asynq tasks that run on the solver slots now
// (tasks.Queues), leaving out the cheap lane's, which run on slots of
// their own beside them.
func (c *cluster) solverActive() []*asynq.TaskInfo {
	var out []*asynq.TaskInfo
	for _, q := range tasks.Queues {
		ts, err := c.insp.ListActiveTasks(q, asynq.PageSize(1000))
		if err == nil {
			out = append(out, ts...)
		}
	}
	return out
}

// onSolverSlots reports whether asynq task id of w's runs on the solver
// slots: a batch unit by its unit (tasks.UnitQueue), a single task or
// batch item by its request (tasks.SingleQueue; an expensive batch item
// runs in a unit of its own, a cheap one in a chunk's on the cheap lane).
func (w *workload) onSolverSlots(t *testing.T, id string) bool {
	t.Helper()
	if i := strings.LastIndexByte(id, ':'); i >= 0 {
		if _, _, err := tasks.ParseUnit(id[i+1:]); err == nil {
			return slices.Contains(tasks.Queues, tasks.UnitQueue(id[i+1:]))
		}
	}
	req, ok := w.reqs[id]
	if !ok {
		t.Fatalf("asynq task %s is neither a unit nor a task of the workload", id)
	}
	var r puzzle.Request
	if err := json.Unmarshal([]byte(req), &r); err != nil {
		t.Fatalf("request of %s: %v", id, err)
	}
	p, err := puzzle.Parse(r)
	if err != nil {
		t.Fatalf("request of %s: %v", id, err)
	}
	return slices.Contains(tasks.Queues, tasks.SingleQueue(p))
}

// pushedBack matches asynq's log line for a task a shutdown gave back.
var pushedBack = regexp.MustCompile(`Pushed task id=(\S+) back to queue`)

// queued counts tasks waiting in asynq (pending, retry, scheduled).
func (c *cluster) queued() int {
	n := 0
	for _, q := range solveQueues {
		if qi, err := c.insp.GetQueueInfo(q); err == nil {
			n += qi.Pending + qi.Retry + qi.Scheduled
		}
	}
	return n
}

// testGracefulShutdown: SIGTERM a worker under load. It must exit within
// its SHUTDOWN_TIMEOUT; what it ran either finished there or was requeued
// and finished on another worker. The victim runs alone until both its
// solver slots hold a hard 15-puzzle (queued first, ahead of 300 mixed
// tasks), so the solver tasks active at SIGTERM are its own and provably
// still running: each takes over half a second of CPU and started
// moments before. With a timeout longer than they need they finish in
// place; with one far shorter (1 ms) asynq gives them back to the queue,
// and they run once more on another worker, and no other solver task
// does. The victim's cheap lane runs the mixed load's cheap work beside
// them, and a cheap task in flight at SIGTERM is given back too (and may
// run again): those are counted apart.
func testGracefulShutdown(t *testing.T) {
	const slots = 2 // the victim's WORKER_CONCURRENCY
	cases := []struct {
		name     string
		timeout  time.Duration
		requeued bool     // whether the active tasks must run again elsewhere
		boards   []string // the victim's two, then more behind them
	}{
		{"finishes in place", 20 * time.Second, false, []string{"p72", "p73t", "k88", "k15"}},
		{"requeues the rest", time.Millisecond, true, []string{"p74", "p73", "k88t", "k59t"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			timed(t)
			c := newCluster(t, clusterOpts{
				api:    map[string]string{"CHUNK_SIZE": "8"},
				worker: withPDB(map[string]string{"SWEEP_MAX_NODES": "100000000000", "SHUTDOWN_TIMEOUT": "5s", "WORKER_CONCURRENCY": strconv.Itoa(slots)}),
			})
			o := newOracle()
			w := newWorkload()
			hs := hardSet(t, tc.boards...)
			hard := w.addHardSingles(c, hs) // the head of the interactive queue
			mixed(t, c, w, int64(10+i))
			victim := c.startWorker(map[string]string{"SHUTDOWN_TIMEOUT": tc.timeout.String()})
			active := waitHardBusy(t, c, slots, hard, 60*time.Second, nil)
			victimID := victim.WorkerID(t)
			victim.Signal(t, syscall.SIGTERM)
			sent := time.Now()
			if !tc.requeued {
				// While it finishes its boards, GET /v1/status lists it
				// as draining, out of the totals, within a beat or two.
				var last apitype.ServiceStatus
				if !pollUntil(5*time.Second, 20*time.Millisecond, func() bool {
					code, b, err := c.do("GET", "/v1/status", nil)
					if err != nil || code != 200 || json.Unmarshal(b, &last) != nil {
						return false
					}
					for _, w := range last.Workers {
						if w.ID == victimID {
							return w.Draining && w.Busy > 0
						}
					}
					return false
				}) {
					t.Errorf("the victim %s was not listed as draining with its boards within 5 s of SIGTERM: %+v", victimID, last)
				} else if last.WorkersAlive != 0 || last.Slots != 0 {
					t.Errorf("status while the only worker drains: %d alive with %d slots, want none", last.WorkersAlive, last.Slots)
				}
			}
			c.startWorker(nil) // takes over what the victim leaves
			if !victim.WaitExit(tc.timeout + 10*time.Second) {
				t.Fatalf("worker did not exit within SHUTDOWN_TIMEOUT %v + 10s", tc.timeout)
			}
			exited := time.Now()
			took := exited.Sub(sent)
			if victim.Err() != nil {
				t.Errorf("worker exit: %v", victim.Err())
			}
			// The processor waits SHUTDOWN_TIMEOUT at most; the rest of
			// asynq's Shutdown (heartbeat, syncer) adds a little.
			if took > tc.timeout+3*time.Second {
				t.Errorf("worker took %v to exit, SHUTDOWN_TIMEOUT is %v", took, tc.timeout)
			}
			c.startWorker(nil)
			expectHard(t, o, hs)
			all := w.verify(t, c, o, 120*time.Second)
			checkHardRecords(t, all, hard)
			// asynq logs each task it gives back at the timeout.
			log := stacktest.Tail(victim.LogPath, 1000)
			pushed, pushedCheap := 0, 0
			for _, m := range pushedBack.FindAllStringSubmatch(log, -1) {
				if w.onSolverSlots(t, m[1]) {
					pushed++
				} else {
					pushedCheap++
				}
			}
			ms := func(tm *time.Time) string {
				if tm == nil {
					return "never"
				}
				return tm.Format(time.StampMilli)
			}
			for _, ti := range active {
				id := itemOf(ti)
				name := hard[id].name
				tr := all[id]
				if tr.StartedAt == nil || tr.StartedAt.After(sent) || tr.CompletedAt == nil {
					t.Errorf("%s (task %s): started %s, completed %s; want started before SIGTERM at %s, then completed",
						name, id, ms(tr.StartedAt), ms(tr.CompletedAt), sent.Format(time.StampMilli))
					continue
				}
				// Completed after SIGTERM: it was running when the signal
				// came, so the scenario tested what it claims.
				if tr.CompletedAt.Before(sent.Truncate(time.Millisecond)) {
					t.Errorf("%s (task %s) completed at %s, before SIGTERM at %s: nothing of the victim's was in flight",
						name, id, ms(tr.CompletedAt), sent.Format(time.StampMilli))
				}
				back := strings.Contains(log, "id="+id+" back to queue")
				switch {
				case tc.requeued && (!back || tr.Attempts != 2):
					t.Errorf("%s (task %s): pushed back %v, attempts %d; want pushed back and run once more elsewhere (2 attempts)",
						name, id, back, tr.Attempts)
				case !tc.requeued && (back || tr.Attempts != 1 || tr.CompletedAt.After(exited)):
					t.Errorf("%s (task %s): pushed back %v, attempts %d, completed %s; want finished in place: 1 attempt, completed before the victim exited at %s",
						name, id, back, tr.Attempts, ms(tr.CompletedAt), exited.Format(time.StampMilli))
				}
			}
			again, againCheap := 0, 0
			for id := range w.reqs {
				switch {
				case all[id].Attempts <= 1:
				case w.onSolverSlots(t, id):
					again++
				default:
					againCheap++
				}
			}
			t.Logf("graceful shutdown (%s): FIGURES SIGTERM->exit=%v SHUTDOWN_TIMEOUT=%v active_at_sigterm=%d (%v) requeued=%d ran_again=%d cheap_requeued=%d cheap_ran_again=%d tasks=%d lost=0",
				tc.name, took.Round(time.Millisecond), tc.timeout, len(active), hardNames(active, hard), pushed, again, pushedCheap, againCheap, len(w.reqs))
			if want := map[bool]int{true: slots, false: 0}[tc.requeued]; pushed != want || again != want {
				t.Errorf("%d solver tasks pushed back and %d ran more than once, want %d and %d (the victim's %d at SIGTERM)", pushed, again, want, want, len(active))
			}
			if !tc.requeued && (pushedCheap > 0 || againCheap > 0) {
				t.Errorf("with time to finish, %d cheap tasks were pushed back and %d ran more than once, want none", pushedCheap, againCheap)
			}
		})
	}
}

// fmtKB renders KiB as MiB.
func fmtKB(kb int64) string { return fmt.Sprintf("%.1f MiB", float64(kb)/1024) }
