//go:build fault

package fault

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/tasks"
)

// testHostCrash simulates what appendfsync everysec can lose in a machine
// crash, which killing redis-server alone cannot show (the kernel keeps
// what Redis wrote): Redis is killed, its AOF is cut back to its size one
// second before the kill, and it is started again. Every task the API
// acknowledged must then be completed with the right result, or be
// reported here, by ID, as lost (its record is gone: the API answers 404)
// or orphaned (its record survived but no queued task carries it, so it
// would stay pending until TASK_TTL). Nothing may just disappear.
func testHostCrash(t *testing.T) {
	c := newCluster(t, clusterOpts{
		redisArgs: []string{"--appendonly", "yes", "--appendfsync", "everysec"},
		api:       map[string]string{"CHUNK_SIZE": "16", "REQUEST_TIMEOUT": "2s"},
		worker:    map[string]string{"SWEEP_MAX_NODES": "100000000000"},
		workers:   2,
	})
	o := newOracle()
	sub := startSubmitter(c, eightPuzzles(20000, 40), corpusSweeps(t))
	defer sub.stop()

	aofs, _ := filepath.Glob(filepath.Join(c.redis.Dir, "appendonlydir", "*.incr.aof"))
	if len(aofs) != 1 {
		t.Fatalf("want one incremental AOF file in %s, found %v", c.redis.Dir, aofs)
	}
	aof := aofs[0]
	// Sample the AOF's size so it can be cut back to where it was a second
	// before the crash: the writes fsync had not yet made durable.
	type sample struct {
		at   time.Time
		size int64
	}
	var (
		smu     sync.Mutex
		samples []sample
	)
	sampleNow := func() {
		if fi, err := os.Stat(aof); err == nil {
			smu.Lock()
			samples = append(samples, sample{time.Now(), fi.Size()})
			smu.Unlock()
		}
	}
	began := time.Now()
	if !pollUntil(30*time.Second, 20*time.Millisecond, func() bool {
		sampleNow()
		return sub.batchesAcked() >= 8 && len(c.activeTasks()) > 0 && time.Since(began) > 2*time.Second
	}) {
		t.Fatal("no batches acknowledged and running within 30s")
	}
	c.redis.Kill()
	killedAt := time.Now()
	sub.stop()
	var keep int64 = -1
	for _, s := range samples {
		if s.at.Before(killedAt.Add(-time.Second)) {
			keep = s.size
		}
	}
	fi, err := os.Stat(aof)
	if err != nil || keep < 0 {
		t.Fatalf("AOF %s: %v; no size sampled a second before the kill", aof, err)
	}
	if err := os.Truncate(aof, keep); err != nil {
		t.Fatal(err)
	}
	if err := c.redis.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, p := range append([]*proc{c.api}, c.workers...) {
		p.WaitReady(t, 30*time.Second)
	}
	acked := sub.acked
	t.Logf("host crash: cut the AOF from %d to %d bytes (the last second); %d tasks in %d batches and singles were acknowledged",
		fi.Size(), keep, len(acked.reqs), len(acked.batches))

	// Settle: wait until every surviving record has ended or is carried by
	// no asynq task at all (then nothing will ever move it), twice in a
	// row. Queued tasks are listed before records are read: a task that
	// ends in between is then seen ended, never as an orphan.
	var recs map[string]taskResource
	var lost, orphans, waiting []string
	prevOrphans := "none"
	settled := pollUntil(200*time.Second, 2*time.Second, func() bool {
		carried := c.carriedItems()
		recs = c.records(acked)
		lost, orphans, waiting = nil, nil, nil
		for id := range acked.reqs {
			tr, ok := recs[id]
			switch {
			case !ok:
				lost = append(lost, id)
			case terminal(tr.State):
			case carried[id]:
				waiting = append(waiting, id)
			default:
				orphans = append(orphans, id)
			}
		}
		sort.Strings(orphans)
		same := fmt.Sprint(orphans) == prevOrphans
		prevOrphans = fmt.Sprint(orphans)
		return len(waiting) == 0 && same
	})
	if !settled {
		t.Errorf("%d acknowledged tasks still queued or running after 200s: %v", len(waiting), first(waiting, 10))
	}
	sort.Strings(lost)
	sort.Strings(orphans)
	completed := map[string]string{}
	for id, r := range acked.reqs {
		if tr, ok := recs[id]; ok && terminal(tr.State) {
			completed[id] = r
		}
	}
	o.check(t, recs, completed)
	if len(lost) > 0 {
		t.Logf("host crash: LOST %d acknowledged task records (the API now answers 404): %v", len(lost), first(lost, 20))
	}
	if len(orphans) > 0 {
		t.Logf("host crash: ORPHANED %d acknowledged tasks: the record survived, its queued task did not; they stay %q until TASK_TTL: %v",
			len(orphans), recs[orphans[0]].State, first(orphans, 20))
	}
	t.Logf("host crash: FIGURES acked=%d completed=%d lost=%d orphaned=%d silently_dropped=0 aof_cut=%d bytes",
		len(acked.reqs), len(completed), len(lost), len(orphans), fi.Size()-keep)
	if len(completed)+len(lost)+len(orphans) != len(acked.reqs) {
		t.Errorf("accounted for %d of %d acknowledged tasks", len(completed)+len(lost)+len(orphans), len(acked.reqs))
	}
}

// records reads every task of w: batches page by page (a batch that is
// gone leaves its items out), singles one by one.
func (c *cluster) records(w *workload) map[string]taskResource {
	c.t.Helper()
	out := map[string]taskResource{}
	for id := range w.batches {
		code, _, err := c.do("GET", "/v1/batches/"+id+"?limit=1", nil)
		if err != nil || code == http.StatusNotFound {
			continue
		}
		for _, tr := range c.batch(id).Tasks {
			if tr.Error != nil && tr.Error.Code == "expired" {
				continue // the batch lists an ID whose record is gone
			}
			out[tr.ID] = tr
		}
	}
	for id := range w.reqs {
		if _, ok := out[id]; ok {
			continue
		}
		if tr, ok := c.getTask(id, 0); ok {
			out[id] = tr
		}
	}
	return out
}

// carriedItems is the set of record IDs some asynq task (pending, active,
// retry or scheduled) still carries.
func (c *cluster) carriedItems() map[string]bool {
	c.t.Helper()
	out := map[string]bool{}
	for _, q := range tasks.Queues {
		for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
			c.insp.ListPendingTasks, c.insp.ListActiveTasks, c.insp.ListRetryTasks, c.insp.ListScheduledTasks,
		} {
			for page := 1; ; page++ {
				ts, err := list(q, asynq.PageSize(1000), asynq.Page(page))
				if errors.Is(err, asynq.ErrQueueNotFound) {
					break
				}
				if err != nil {
					c.t.Fatalf("list asynq tasks of %s: %v", q, err)
				}
				for _, ti := range ts {
					for _, id := range itemsOf(ti) {
						out[id] = true
					}
				}
				if len(ts) < 1000 {
					break
				}
			}
		}
	}
	return out
}

func first(ids []string, n int) []string { return ids[:min(n, len(ids))] }
