//go:build fault

package fault

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/tasks"
)

// processedTotal is asynq's cumulative count of processed tasks, both
// queues.
func (c *cluster) processedTotal() int {
	n := 0
	for _, q := range tasks.Queues {
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
// before any worker runs, and two workers then run both copies, often at
// the same moment. Later a completed task is delivered once more. Each
// item must end with one result, count once in its batch and once in
// puzzleq_tasks_total.
func testDuplicateDelivery(t *testing.T) {
	c := newCluster(t, clusterOpts{
		api:    map[string]string{"CHUNK_SIZE": "8"},
		worker: map[string]string{"SWEEP_MAX_NODES": "100000000000"},
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
	for _, q := range tasks.Queues {
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
	if again.State != "completed" || string(again.Result) != string(first.Result) || again.Attempts != first.Attempts ||
		!again.CompletedAt.Equal(*first.CompletedAt) {
		t.Errorf("after a late duplicate of %s (asynq task %s): %+v, want unchanged %+v", single, ti.ID, again, first)
	}
	if n := counted(); n != len(w.reqs) {
		t.Errorf("after a late duplicate puzzleq_tasks_total is %d, want %d", n, len(w.reqs))
	}
	for id, n := range w.batches {
		c.checkBatch(id, n)
	}
	t.Logf("duplicate delivery: FIGURES items=%d deliveries=%d results=1 each, counted=%d, duplicates=0", len(w.reqs), enqueued+1, counted())
}
