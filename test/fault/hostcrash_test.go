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

	"github.com/puzzleq/puzzleq/apitype"
)

// durableAfter is how long after its answer an acknowledged write is
// surely in the AOF file (not yet fsynced, but written): Redis writes the
// AOF before it replies, except that with appendfsync everysec it may
// postpone the write behind a slow background fsync, for 2 s at most.
const durableAfter = 2 * time.Second

// testHostCrash simulates what appendfsync everysec can lose in a machine
// crash, which killing redis-server alone cannot show (the kernel keeps
// what Redis wrote): Redis is killed while every worker slot runs a hard
// 15-puzzle, its AOF is cut back to its size one second before the kill,
// and it is started again. Every task acknowledged early enough that its
// writes were in the kept part of the file (durableAfter before the cut)
// must then complete with the right result, its batch counted exactly;
// the running boards are among them. A task acknowledged later may be
// reported here, by ID, as lost (its record is gone: the API answers 404)
// or orphaned (its record survived but no queued task carries it, so it
// would stay pending until TASK_TTL). Nothing may just disappear.
func testHostCrash(t *testing.T) {
	const slots = 4 // 2 workers x 2
	c := newCluster(t, clusterOpts{
		redisArgs: []string{"--appendonly", "yes", "--appendfsync", "everysec"},
		api:       map[string]string{"CHUNK_SIZE": "16", "REQUEST_TIMEOUT": "2s"},
		worker:    withPDB(map[string]string{"SWEEP_MAX_NODES": "100000000000", "WORKER_CONCURRENCY": "2"}),
	})
	o := newOracle()

	aofs, _ := filepath.Glob(filepath.Join(c.redis.Dir, "appendonlydir", "*.incr.aof"))
	if len(aofs) != 1 {
		t.Fatalf("want one incremental AOF file in %s, found %v", c.redis.Dir, aofs)
	}
	aof := aofs[0]
	// Sample the AOF's size every 20 ms until the kill, so it can be cut
	// back to where it was a second before: the writes fsync had not yet
	// made durable. A sample's time is taken before its stat.
	type sample struct {
		at   time.Time
		size int64
	}
	var (
		smu     sync.Mutex
		samples []sample
	)
	stopSampling, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			at := time.Now()
			if fi, err := os.Stat(aof); err == nil {
				smu.Lock()
				samples = append(samples, sample{at, fi.Size()})
				smu.Unlock()
			}
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
		}
	}()

	// The hard boards are acknowledged first and run only once they are
	// durable at the cut, a second before the kill: no worker starts
	// before durableAfter + 2 s. Then the kill comes as soon as every slot
	// runs one; they hold 5 s of CPU in all. Meanwhile the submitter has
	// sent over 2 s of batches that must survive the cut as well.
	hs := hardSet(t, "p74", "p73", "p75t", "p72", "k88", "k88t", "k15")
	hardW := newWorkload()
	hard := hardW.addHardBatch(c, hs)
	hardAcked := time.Now()
	sub := startSubmitter(c, eightPuzzles(20000, 40), corpusSweeps(t))
	defer sub.stop()
	sub.adopt(hardW)
	time.Sleep(time.Until(hardAcked.Add(durableAfter + 2*time.Second)))
	for range 2 {
		c.startWorker(nil)
	}
	inFlight := waitHardBusy(t, c, slots, hard, 30*time.Second, func() (bool, string) {
		n := sub.batchesAcked()
		return n >= 9, fmt.Sprintf("batches acknowledged %d, want 9", n)
	})
	c.redis.Kill()
	killedAt := time.Now()
	close(stopSampling)
	<-sampled
	sub.stop()
	var keep int64 = -1
	var keptAt time.Time
	for _, s := range samples {
		if s.at.Before(killedAt.Add(-time.Second)) {
			keep, keptAt = s.size, s.at
		}
	}
	fi, err := os.Stat(aof)
	if err != nil || keep < 0 {
		t.Fatalf("AOF %s: %v; no size sampled a second before the kill", aof, err)
	}
	if fi.Size() <= keep {
		t.Fatalf("the AOF did not grow in the last second before the kill (%d bytes then and at the kill): the cut would lose nothing, and the crash test nothing", keep)
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
	durable := map[string]bool{}
	for id, at := range sub.at {
		if !at.Add(durableAfter).After(keptAt) {
			durable[id] = true
		}
	}
	for _, ti := range inFlight {
		if id := itemOf(ti); !durable[id] {
			t.Fatalf("%s (task %s), running at the kill, was acknowledged at %v, less than %v before the cut at %v",
				hard[id].name, id, sub.at[id].Format(time.StampMilli), durableAfter, keptAt.Format(time.StampMilli))
		}
	}
	t.Logf("host crash: cut the AOF from %d to %d bytes (the last second); %d tasks in %d batches and singles were acknowledged, %d of them %v before the cut; running at the kill: %v",
		fi.Size(), keep, len(acked.reqs), len(acked.batches), len(durable), durableAfter, hardNames(inFlight, hard))

	// Settle: wait until every surviving record has ended or is carried by
	// no asynq task at all (then nothing will ever move it), twice in a
	// row. Queued tasks are listed before records are read: a task that
	// ends in between is then seen ended, never as an orphan.
	var recs map[string]apitype.Task
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
			case tr.State.Terminal():
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
		if tr, ok := recs[id]; ok && tr.State.Terminal() || durable[id] {
			completed[id] = r // a durable task must have completed; o.check says what it found instead
		}
	}
	expectHard(t, o, hs)
	o.check(t, recs, completed)
	checkHardRecords(t, recs, hard)
	var lostLate, orphansLate []string
	for _, set := range []struct {
		ids  []string
		late *[]string
		what string
	}{{lost, &lostLate, "lost"}, {orphans, &orphansLate, "orphaned"}} {
		var bad []string
		for _, id := range set.ids {
			if durable[id] {
				bad = append(bad, id)
			} else {
				*set.late = append(*set.late, id)
			}
		}
		if len(bad) > 0 {
			t.Errorf("%d tasks acknowledged over %v before the cut are %s: %v", len(bad), durableAfter, set.what, first(bad, 20))
		}
	}
	durableBatches := 0
	for id, n := range acked.batches {
		if !sub.batchAt[id].Add(durableAfter).After(keptAt) {
			c.checkBatch(id, n) // its records were all durable: counted exactly
			durableBatches++
		}
	}
	if len(lostLate) > 0 {
		t.Logf("host crash: LOST %d acknowledged task records (the API now answers 404), all acknowledged in the last %v before the cut: %v",
			len(lostLate), durableAfter, first(lostLate, 20))
	}
	if len(orphansLate) > 0 {
		t.Logf("host crash: ORPHANED %d acknowledged tasks, all acknowledged in the last %v before the cut: the record survived, its queued task did not; they stay %q until TASK_TTL: %v",
			len(orphansLate), durableAfter, recs[orphansLate[0]].State, first(orphansLate, 20))
	}
	var attempts []int
	for _, ti := range inFlight {
		attempts = append(attempts, recs[itemOf(ti)].Attempts)
	}
	t.Logf("host crash: FIGURES acked=%d (%d batches, %d checked exactly) durable=%d completed=%d lost=%d orphaned=%d silently_dropped=0 aof_cut=%d bytes in_flight=%d attempts=%v",
		len(acked.reqs), len(acked.batches), durableBatches, len(durable), len(completed), len(lost), len(orphans), fi.Size()-keep, len(inFlight), attempts)
}

// records reads every task of w: batches page by page (a batch that is
// gone leaves its items out), singles one by one.
func (c *cluster) records(w *workload) map[string]apitype.Task {
	c.t.Helper()
	out := map[string]apitype.Task{}
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
	for _, q := range solveQueues {
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
					for _, id := range c.unitItems(ti) {
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
