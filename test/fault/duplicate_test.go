//go:build fault

package fault

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
)

// processedTotal is asynq's cumulative count of processed tasks, every
// queue of solves.
func (c *cluster) processedTotal() int {
	n := 0
	for _, q := range solveQueues {
		if qi, err := c.insp.GetQueueInfo(q); err == nil {
			n += qi.ProcessedTotal
		}
	}
	return n
}

// drained waits until asynq has processed want tasks in all and holds
// none.
func (c *cluster) drained(t *testing.T, want int, d time.Duration) {
	t.Helper()
	if !pollUntil(d, 50*time.Millisecond, func() bool {
		return c.processedTotal() >= want && c.queued() == 0 && len(c.activeTasks()) == 0
	}) {
		t.Fatalf("asynq processed %d tasks, want %d (queued %d, active %d)", c.processedTotal(), want, c.queued(), len(c.activeTasks()))
	}
}

// testDuplicateDelivery delivers every task twice: each queued task is
// enqueued a second time (same type and payload, so the same records)
// before any worker runs, and two workers then run both copies. Later a
// completed task is delivered once more, and two hard 15-puzzles are each
// run twice at the same moment, on all four slots: a copy is enqueued
// while the original runs. Each item must end with one result, count once
// in its batch and once in puzzleq_tasks_total.
func testDuplicateDelivery(t *testing.T) {
	c := newCluster(t, clusterOpts{
		api:    map[string]string{"CHUNK_SIZE": "8"},
		worker: withPDB(map[string]string{"SWEEP_MAX_NODES": "100000000000", "WORKER_CONCURRENCY": "2"}),
	})
	o := newOracle()
	w := newWorkload()
	corpus := corpusSweeps(t)
	w.addBatch(c, append(eightPuzzles(64, 20), corpus[:8]...)) // 8 chunks + 8 sweeps
	for _, r := range eightPuzzles(70, 20)[64:] {
		w.addTask(c, r)
	}
	single := w.addTask(c, corpus[8])
	w.addTask(c, corpus[9])

	cl := asynq.NewClientFromRedisClient(c.rdb)
	defer cl.Close()
	enqueued := 0
	var late *asynq.TaskInfo // the single's own asynq task, for a late duplicate
	for _, q := range solveQueues {
		pending, err := c.insp.ListPendingTasks(q, asynq.PageSize(1000))
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range pending {
			if ti.ID == single {
				late = ti
			}
			if _, err := cl.Enqueue(asynq.NewTask(ti.Type, ti.Payload), asynq.Queue(q), asynq.MaxRetry(ti.MaxRetry)); err != nil {
				t.Fatal(err)
			}
			enqueued += 2
		}
	}
	if enqueued != 2*(8+8+6+2) {
		t.Fatalf("%d deliveries queued, want %d", enqueued, 2*24)
	}
	w1, w2 := c.startWorker(nil), c.startWorker(nil)
	recs := w.verify(t, c, o, 60*time.Second)
	c.drained(t, enqueued, 30*time.Second)
	counted := func() int { return workerTasksTotal(t, w1) + workerTasksTotal(t, w2) }
	if n := counted(); n != len(w.reqs) {
		t.Errorf("puzzleq_tasks_total is %d over both workers, want %d (one per item)", n, len(w.reqs))
	}

	// Deliver a completed single again, as asynq would after a worker died
	// between writing the result and acknowledging the task.
	first := recs[single]
	if late == nil {
		t.Fatalf("task %s was not in asynq's pending list", single)
	}
	ti, err := cl.Enqueue(asynq.NewTask(late.Type, late.Payload), asynq.Queue(late.Queue), asynq.TaskID(single))
	if err != nil {
		t.Fatalf("enqueue %s again: %v", single, err)
	}
	c.drained(t, enqueued+1, 30*time.Second)
	again, _ := c.getTask(single, 0)
	if again.State != apitype.TaskStateCompleted || string(again.Result) != string(first.Result) || again.Attempts != first.Attempts ||
		!again.CompletedAt.Equal(*first.CompletedAt) {
		t.Errorf("after a late duplicate of %s (asynq task %s): %+v, want unchanged %+v", single, ti.ID, again, first)
	}
	if n := counted(); n != len(w.reqs) {
		t.Errorf("after a late duplicate puzzleq_tasks_total is %d, want %d", n, len(w.reqs))
	}
	for id, n := range w.batches {
		c.checkBatch(id, n)
	}

	// Two copies running at once, by construction: the workers are idle;
	// two hard boards are submitted, and once both run a copy of each is
	// enqueued, which an idle slot takes within TASK_CHECK_INTERVAL while
	// the original has most of its half second of CPU to go.
	hs := hardSet(t, "p72", "p73t")
	hard := w.addHardSingles(c, hs)
	for _, ti := range waitHardBusy(t, c, 2, hard, 30*time.Second, nil) {
		if _, err := cl.Enqueue(asynq.NewTask(ti.Type, ti.Payload), asynq.Queue(ti.Queue), asynq.MaxRetry(ti.MaxRetry)); err != nil {
			t.Fatalf("enqueue a copy of %s: %v", ti.ID, err)
		}
	}
	var both []*asynq.TaskInfo
	if !pollUntil(30*time.Second, 5*time.Millisecond, func() bool {
		both = c.activeTasks()
		n := map[string]int{}
		for _, ti := range both {
			if h, ok := hardOf(ti, hard); ok {
				n[h.name]++
			}
		}
		return len(both) == 4 && n[hs[0].name] == 2 && n[hs[1].name] == 2
	}) {
		t.Fatalf("never saw both copies of %s and %s running at once: last saw %s; hard boards %s; %s",
			hs[0].name, hs[1].name, describeActive(both, hard), c.hardStates(hard), c.describeQueues())
	}
	expectHard(t, o, hs)
	recs = w.verify(t, c, o, 60*time.Second)
	checkHardRecords(t, recs, hard)
	c.drained(t, enqueued+1+4, 60*time.Second)
	for id, h := range hard {
		// The start script counts an attempt only on a pending or active
		// record: 2 means the copy started before the original ended.
		if recs[id].Attempts != 2 {
			t.Errorf("%s (task %s): %d attempts, want 2 (both copies ran at once)", h.name, id, recs[id].Attempts)
		}
	}
	if n := counted(); n != len(w.reqs) {
		t.Errorf("after concurrent copies puzzleq_tasks_total is %d, want %d", n, len(w.reqs))
	}
	t.Logf("duplicate delivery: FIGURES items=%d deliveries=%d results=1 each, counted=%d, duplicates=0, concurrent_copies=%v",
		len(w.reqs), enqueued+1+4, counted(), hardNames(both, hard))
}
