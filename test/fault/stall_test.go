//go:build fault

package fault

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestRedisStallOrphans stalls redis-server (SIGSTOP, then SIGCONT 5 s
// later) right after a single task's and then a 1-item batch's enqueue,
// three times each, one at a time. An idle worker polls every 20 ms, so
// its dequeue script reaches Redis during the stall; the worker gives up
// on it after its 3 s read timeout, and Redis runs it when it wakes: the
// task is running in asynq's eyes, with a 30 s lease nobody holds, and
// no worker runs it (asynq alone recovers it 60-120 s later). The API's
// watchdog finds it (no worker's record names it) and queues a copy.
//
// Each run must complete within 15 s of SIGCONT, exactly once: the exact
// answer, attempts 1, its batch counted exactly, the key's quota back to
// 0 and the workers' puzzleq_tasks_total at one per task (less those
// whose finish the stall cut off, never more). Then the test
// waits for asynq to recover and run every original (nothing left in the
// queues) and checks again: no record, count or quota changed, and no
// original was copied twice.
func TestRedisStallOrphans(t *testing.T) {
	timed(t)
	const (
		stall  = 5 * time.Second
		bound  = 15 * time.Second
		rounds = 3
	)
	c := newCluster(t, clusterOpts{authed: true, workers: 1})
	waitReady(t, c.workers[0])
	c.api.WaitReady(t, 30*time.Second)
	o := newOracle()
	w := newWorkload()
	reqs := eightPuzzles(2*rounds, 4242)

	type run struct {
		kind    string
		item    string    // the task's ID: the single's, or the batch's one item
		logged  string    // what names its asynq task in the watchdog's log line (queue/ID:)
		frozen  time.Time // when Redis was stopped
		resumed time.Time
		took    time.Duration
	}
	var runs []*run
	for i := range 2 * rounds {
		r := &run{kind: "single"}
		if i%2 == 1 {
			r.kind = "batch"
		}
		// Nothing queued, so the worker is polling when the stall comes.
		// (Earlier runs' originals stay listed as active until asynq
		// recovers them, and hold no slot.)
		if !pollUntil(30*time.Second, 20*time.Millisecond, func() bool { return c.queued() == 0 }) {
			t.Fatalf("run %d: asynq's queues did not empty before it", i)
		}
		if r.kind == "single" {
			r.item = w.addTask(c, reqs[i])
			r.logged = tasks.QueueCheap + "/" + r.item + ":"
		} else {
			r.item = w.addBatch(c, reqs[i:i+1])[0]
			// Its one unit, whatever its name: <batch ID>:<unit>.
			r.logged = tasks.QueueCheapBulk + "/" + r.item[:strings.IndexByte(r.item, '-')] + ":"
		}
		r.frozen = time.Now()
		thaw := c.freezeRedis(t)
		time.Sleep(stall)
		thaw()
		r.resumed = time.Now()
		tr, ok := c.getTask(r.item, bound)
		for ok && !tr.State.Terminal() && time.Since(r.resumed) < bound {
			tr, ok = c.getTask(r.item, time.Second)
		}
		if !ok || tr.State != apitype.TaskStateCompleted || tr.CompletedAt == nil {
			t.Fatalf("run %d (%s %s): %+v (found %v) %v after SIGCONT, want completed within %v", i, r.kind, r.item, tr, ok, time.Since(r.resumed), bound)
		}
		r.took = tr.CompletedAt.Sub(r.resumed)
		if r.took > bound {
			t.Errorf("run %d (%s %s): completed %v after SIGCONT, want within %v", i, r.kind, r.item, r.took, bound)
		}
		runs = append(runs, r)
		for _, p := range append([]*proc{c.api}, c.workers...) {
			if p.Exited() {
				t.Fatalf("%s exited after a stall: %v", p.Name, p.Err())
			}
		}
	}

	check := func(when string) map[string]apitype.Task {
		t.Helper()
		recs := w.verify(t, c, o, 30*time.Second)
		for _, r := range runs {
			if tr := recs[r.item]; tr.Attempts != 1 {
				t.Errorf("%s: %s %s ran %d times, want once", when, r.kind, r.item, tr.Attempts)
			}
		}
		c.checkQuota(t, when)
		retried := 0
		for _, r := range runs {
			retried += writtenWhileFrozen(recs, r.frozen, r.resumed)
		}
		checkTasksTotal(t, when, len(w.reqs), retried, c.workers...)
		return recs
	}
	before := check("after the stalls")

	// Which runs the stall orphaned: the watchdog names each copy's
	// original in its log, once.
	apiLog := logText(c.api.LogPath)
	orphaned := 0
	var took []string
	for _, r := range runs {
		n := strings.Count(apiLog, r.logged)
		if n > 1 {
			t.Errorf("%s %s: the watchdog copied its task (%s) %d times, want at most once", r.kind, r.item, r.logged, n)
		}
		mark := ""
		if n == 1 {
			orphaned++
			mark = "(orphan)"
		}
		took = append(took, fmt.Sprintf("%s%s=%.2fs", r.kind, mark, r.took.Seconds()))
	}
	if orphaned == 0 {
		t.Errorf("no stall orphaned its task: the scenario tested nothing (the worker took each before or after the stall)")
	}
	if n := strings.Count(apiLog, "re-drove the tasks of a dead worker"); n != 0 {
		t.Errorf("the watchdog took a worker for dead %d times: a stall every process saw is no death", n)
	}

	// asynq recovers each original after its lease (60-120 s after the
	// dequeue) and runs it: it finds its item ended and changes nothing.
	drainFrom := time.Now()
	if !pollUntil(180*time.Second, 500*time.Millisecond, func() bool { return len(c.activeTasks()) == 0 && c.queued() == 0 }) {
		t.Fatalf("asynq's queues did not empty within 180 s: active %d, queued %d", len(c.activeTasks()), c.queued())
	}
	drained := time.Since(drainFrom)
	after := check("after asynq ran the originals")
	for _, r := range runs {
		b, a := before[r.item], after[r.item]
		if a.State != b.State || a.Attempts != b.Attempts || string(a.Result) != string(b.Result) ||
			a.CompletedAt == nil || !a.CompletedAt.Equal(*b.CompletedAt) {
			t.Errorf("%s %s changed after asynq ran its original: %s attempts %d at %v, was %s %d at %v",
				r.kind, r.item, a.State, a.Attempts, a.CompletedAt, b.State, b.Attempts, b.CompletedAt)
		}
	}
	t.Logf("redis stall after enqueue: FIGURES stall=%v runs=%d orphaned=%d resume_to_done: %s originals_drained_%.0fs_after_the_last_run",
		stall, len(runs), orphaned, strings.Join(took, " "), drained.Seconds())
}
