package worker_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// heldGate is the store's Gate that, at each admission, reads the
// worker's record in Redis and notes whether it names the delivery being
// admitted.
type heldGate struct {
	*store.Store
	worker string

	mu       sync.Mutex
	admitted []string // asynq IDs admitted, in order
	missing  []string // those the worker's record did not name then
}

func (g *heldGate) check(ctx context.Context, q, id string) {
	held, err := g.Held(ctx, g.worker)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.admitted = append(g.admitted, id)
	if err != nil || !slices.Contains(held, worker.HeldTask{Queue: q, ID: id}) {
		g.missing = append(g.missing, fmt.Sprintf("%s (record %v, err %v)", id, held, err))
	}
}

func (g *heldGate) Admit(ctx context.Context, r worker.SolveRun, cap int) (worker.Admission, error) {
	g.check(ctx, r.Queue, r.AsynqID)
	return g.Store.Admit(ctx, r, cap)
}

func (g *heldGate) AdmitSlot(ctx context.Context, r worker.SlotRun, cap int) (worker.SlotAdmission, error) {
	g.check(ctx, r.Queue, r.AsynqID)
	return g.Store.AdmitSlot(ctx, r, cap)
}

// TestExpensiveRunsAreHeldBeforeAdmission: every expensive run, single
// task or batch item, is in its worker's record in Redis before it asks
// for a slot or a solve's lead. A worker killed after it took one is then
// always found by the watchdog, which re-drives the run within seconds,
// instead of leaving the key's slot to asynq's recovery a minute or two
// later (test/fault's BatchItemWorkerKill lost 90 s that way in CI, when
// the kill fell inside the write-behind's 5 ms). The server's heartbeat
// never beats on its own here (an hour's interval), and the flusher
// writes 5 ms after a start, later than most admissions come: without
// HoldNow, 7 of 8 and 6 of 9 admissions came before the record in two
// runs (a slow one may still find the flusher's write, so the test fails
// on most runs of such a build, not on every admission).
func TestExpensiveRunsAreHeldBeforeAdmission(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	hb := worker.NewHeartbeat(f.store, "w-admit", time.Hour, nil)
	t.Cleanup(func() { _ = hb.Leave(context.Background()) })
	g := &heldGate{Store: f.store, worker: "w-admit"}
	h := worker.NewHandler(f.store, nil, testLimits(), worker.NewMetrics(prometheus.NewRegistry()), nil)
	// No cap: every run is admitted to run, and none waits for a
	// promotion (a slot freed while a parked run is still active in asynq
	// would leave it to its retry delay, which the fixture's server makes
	// an hour).
	h.SetGate(g, func() int { return 0 })
	h.SetFeed(f.store, 8)

	boards := sweeps(t, 6)
	client := asynq.NewClientFromRedisClient(f.rdb)
	for i := range 3 {
		f.enqueueSingle(t, client, fmt.Sprint("s", i), "k1", boards[i])
	}
	f.stageOwned(t, "b1", "k1", boards[3:])
	if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, 8, 8); err != nil {
		t.Fatal(err)
	}
	f.slotServerWith(t, h, 4, hb.Middleware())

	for i := range 3 {
		if tk := waitEnded(t, f, fmt.Sprint("s", i)); tk.State != apitype.TaskStateCompleted {
			t.Fatalf("s%d: %s", i, tk.State)
		}
	}
	if b := f.waitDone(t, "b1"); b.Counts[apitype.TaskStateCompleted] != 3 {
		t.Fatalf("batch: %v", b.Counts)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.admitted) < 6 {
		t.Fatalf("%d admissions %v; want one per task and item at least", len(g.admitted), g.admitted)
	}
	if len(g.missing) > 0 {
		t.Fatalf("%d of %d admissions came before the worker's record named the run: %v", len(g.missing), len(g.admitted), g.missing)
	}
}
