//go:build fault

package fault

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// testShutdownRedisFrozen: SIGTERM a worker while Redis is frozen
// (SIGSTOP), with both its solver slots running hard 15-puzzles. asynq
// cannot give those back and the heartbeat cannot leave, so without a
// bound the worker waits on Redis past the pod's grace period (18–46 s
// were seen) and is killed there. It must exit within SHUTDOWN_TIMEOUT
// and the shutdown's grace (5 s) after it, saying so and exiting
// non-zero; once Redis is back, every task must end with its exact
// answer, what the victim held included.
func testShutdownRedisFrozen(t *testing.T) {
	const (
		slots   = 2
		timeout = 2 * time.Second // the victim's SHUTDOWN_TIMEOUT
		grace   = 5 * time.Second // the worker's shutdownGrace
		slack   = 3 * time.Second // a loaded machine's scheduling
	)
	c := newCluster(t, clusterOpts{
		api:    map[string]string{"CHUNK_SIZE": "8"},
		worker: withPDB(map[string]string{"SWEEP_MAX_NODES": "100000000000", "WORKER_CONCURRENCY": "2"}),
	})
	o := newOracle()
	w := newWorkload()
	hs := hardSet(t, "p74", "p73", "k88t", "k59t")
	hard := w.addHardSingles(c, hs)
	mixed(t, c, w, 31)
	victim := c.startWorker(map[string]string{"SHUTDOWN_TIMEOUT": timeout.String(), "WORKER_CONCURRENCY": "2"})
	active := waitHardBusy(t, c, slots, hard, 60*time.Second, nil)

	thaw := c.freezeRedis(t)
	defer thaw()
	victim.Signal(t, syscall.SIGTERM)
	sent := time.Now()
	if !victim.WaitExit(timeout + grace + 20*time.Second) {
		t.Fatalf("worker did not exit within %v of SIGTERM with Redis frozen", timeout+grace+20*time.Second)
	}
	took := time.Since(sent)
	thaw()
	if took > timeout+grace+slack {
		t.Errorf("worker took %v to exit with Redis frozen, want at most SHUTDOWN_TIMEOUT %v + grace %v (+%v slack)", took, timeout, grace, slack)
	}
	if victim.Err() == nil {
		t.Errorf("worker exited 0 with its tasks not given back, want a non-zero exit")
	}
	if log := stacktest.Tail(victim.LogPath, 200); !strings.Contains(log, "Redis did not answer in time") {
		t.Errorf("the worker's log does not say it cut its shutdown short:\n%s", log)
	}

	// What the victim ran comes back by its leases. (A finish it sent
	// into the frozen server's socket may still land when Redis wakes:
	// then that task ended on the victim after all, once.)
	c.startWorker(nil)
	expectHard(t, o, hs)
	all := w.verify(t, c, o, 180*time.Second)
	checkHardRecords(t, all, hard)
	t.Logf("shutdown with Redis frozen: FIGURES SIGTERM->exit=%v SHUTDOWN_TIMEOUT=%v grace=%v active_at_sigterm=%d (%v) tasks=%d lost=0",
		took.Round(time.Millisecond), timeout, grace, len(active), hardNames(active, hard), len(w.reqs))
}
