package worker_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// A parked task whose worker died before asynq moved it to the retry set
// (it was told to wait, and its worker was killed, or cut off so that its
// lease lapsed and asynq's processor left the retry to the recoverer) is
// retried by asynq's recoverer with ErrLeaseExpired, and the worker
// binary's retryDelay keeps such a task in the retry set for
// leaseRecoveryDelay (internal/app): hibiken/asynq#717 lets a recoverer
// that listed the task before another one retried it retry it once more
// afterwards, taking it out of the active list while it runs again and
// queueing a third, concurrent run of the same task (a second expensive
// solve, an attempt more). Its member is still in its key's parked set,
// and promoteLua used to move it from the retry set whatever put it there:
// a slot's release brought it back at once, delay or not. Now a promotion
// moves only a task that asynq retried for a WaitError (its last error is
// one), so this one waits out its recovery delay (here the test server's
// hour) while the run parked behind it is promoted.
//
// The dead worker is written as asynq's dequeue leaves a task (active,
// its lease ended a minute ago); the recovery is asynq's own recoverer,
// which a server runs as it starts.
func TestLeaseRecoveredRunIsNotPromoted(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	h := worker.NewHandler(f.store, nil, testLimits(), worker.NewMetrics(prometheus.NewRegistry()), nil)
	h.SetGate(f.store, func() int { return 1 })
	client := asynq.NewClientFromRedisClient(f.rdb)
	hold := worker.SlotRun{Slot: "other", Owner: "k1"}
	if a, err := f.store.AdmitSlot(f.ctx, hold, 1); err != nil || a.Verdict != worker.VerdictRun {
		t.Fatalf("take k1's slot: %+v, %v", a, err)
	}
	boards := sweeps(t, 2)
	enqueue := func(i int) worker.SolveRun {
		t.Helper()
		id := fmt.Sprint("s", i)
		p := f.enqueueSingle(t, client, id, "k1", boards[i])
		return worker.SolveRun{ID: id, Owner: "k1", Solve: worker.SolveKey(p), CacheKey: p.Key(), Queue: tasks.QueueInteractive, AsynqID: id}
	}
	const q = "asynq:{" + tasks.QueueInteractive + "}:"

	// s0's worker took it (asynq's dequeueCmd: pending to active, a
	// lease), was told to wait, and died before asynq's retry.
	r0 := enqueue(0)
	if id, err := f.rdb.RPopLPush(f.ctx, q+"pending", q+"active").Result(); err != nil || id != "s0" {
		t.Fatalf("dequeue s0: %q, %v", id, err)
	}
	f.rdb.HSet(f.ctx, q+"t:s0", "state", "active")
	f.rdb.HDel(f.ctx, q+"t:s0", "pending_since")
	f.rdb.ZAdd(f.ctx, q+"lease", redis.Z{Score: float64(time.Now().Add(-time.Minute).Unix()), Member: "s0"})
	if a, err := f.store.Admit(f.ctx, r0, 1); err != nil || a.Verdict != worker.VerdictWait {
		t.Fatalf("s0's admission: %+v, %v", a, err)
	}

	// A server starts: its recoverer retries s0 (lease expired, an
	// hour's delay here), and it parks s1 for a WaitError.
	f.slotServer(t, h, 2)
	enqueue(1)
	f.waitParked(t, "k1", 2)
	if msg := f.rdb.HGet(f.ctx, q+"t:s0", "msg").Val(); !strings.Contains(msg, asynq.ErrLeaseExpired.Error()) {
		t.Fatalf("s0 was not retried by asynq's recoverer: %q", msg)
	}

	if err := f.store.ReleaseSlot(f.ctx, hold); err != nil {
		t.Fatal(err)
	}
	if st := f.rdb.HGet(f.ctx, q+"t:s0", "state").Val(); st != "retry" {
		t.Fatalf("the slot's release moved s0, retried after its worker died, out of its recovery delay: state %q", st)
	}
	if tk := waitEnded(t, f, "s1"); tk.State != apitype.TaskStateCompleted {
		t.Fatalf("s1, parked behind s0, did not get the freed slot: %s", tk.State)
	}
	// s0 keeps its place in line, and runs when its delay ends.
	if n, err := f.store.Parked(f.ctx, "k1"); err != nil || n != 1 {
		t.Fatalf("k1 parked %d, %v; want s0 still parked", n, err)
	}
	if st := f.rdb.HGet(f.ctx, q+"t:s0", "state").Val(); st != "retry" {
		t.Fatalf("s0 left its recovery delay: state %q", st)
	}
}
