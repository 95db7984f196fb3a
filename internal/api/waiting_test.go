package api_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/tasks"
)

// hard80 is an 80-move 15-puzzle, among the hardest 4×4 boards: with a
// budget of 100 M nodes its solve holds a slot for many seconds, and the
// test cancels it when done.
const hard80 = `[[0,12,9,13],[15,11,10,14],[3,7,2,5],[4,8,6,1]]`

// Expensive runs parked for a solver slot sit in asynq's retry set; GET
// /v1/status shows them as waiting, not as retries, counts them in the
// queue's oldest pending age, and a task that asynq retries after a real
// error is still a retry. The key's ceiling of one slot parks three of
// its four distinct solves (each asks its own node budget, so none joins
// another) while the worker has asynq slots free for them, and then the
// two items of its batch, on the bulk queue.
func TestStatusTellsWaitingFromRetry(t *testing.T) {
	s := stacktest.StartWith(t, 1, map[string]string{"KEY_PREFIX": "waiting:", "WORKER_CONCURRENCY": "4", "MAX_EXPENSIVE_PER_KEY": "1"})
	var ids []string
	for i := range 4 {
		task := s.Submit(fmt.Sprintf(`{"kind":"sliding","puzzle":{"board":%s},"options":{"max_nodes":%d}}`, hard80, 100_000_000+i), 202)
		ids = append(ids, task.ID)
	}
	t.Cleanup(func() {
		for _, id := range ids {
			s.Do("DELETE", "/v1/tasks/"+id, nil)
		}
	})
	inspector := asynq.NewInspectorFromRedisClient(s.RDB)

	// poll reads the status until done holds for queue, and checks every
	// answer on the way with each.
	poll := func(what, queue string, each, done func(apitype.QueueStatus) bool) apitype.QueueStatus {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			st := getAs[apitype.ServiceStatus](t, s, "", "/v1/status", 200)
			var q apitype.QueueStatus
			for _, x := range st.Queues {
				if x.Name == queue {
					q = x
				}
				if x.Waiting < 0 || x.Retry < 0 {
					t.Fatalf("negative count: %+v", st.Queues)
				}
			}
			if !each(q) {
				t.Fatalf("%s: the %s queue reads %+v", what, queue, q)
			}
			if done(q) {
				return q
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30 s; last %+v", what, q)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Nothing failed: whatever sits in the retry set waits for a slot.
	// A parked run comes back now and then by its retry delay (it is
	// active, then parked again), so the three are all parked at once
	// only some of the time; the 1.1 s makes the oldest's age show.
	start := time.Now()
	q := poll("three runs parked", tasks.QueueInteractive, func(q apitype.QueueStatus) bool {
		return q.Retry == 0 && q.Waiting <= 3 && q.Active <= 4
	}, func(q apitype.QueueStatus) bool {
		return q.Waiting == 3 && time.Since(start) > 1100*time.Millisecond
	})
	if q.Pending != 0 || q.OldestPendingSeconds < 1 {
		t.Errorf("with nothing pending, the oldest pending age is the oldest waiting run's: %+v, want at least 1 s", q)
	}
	// The worker shows the one run that holds the key's slot, under the
	// name its logs give it, within a heartbeat (its own, not asynq's 5 s
	// one). A parked run that comes back for a moment may show as a
	// second.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := getAs[apitype.ServiceStatus](t, s, "", "/v1/status", 200)
		if len(st.Workers) == 1 && st.WorkersAlive == 1 && st.Slots == 4 && st.Busy == 1 && st.Workers[0].StartedAt != nil &&
			st.Workers[0].ID == s.Workers[0].ID() && st.Workers[0].Running[tasks.TypeSliding] == 1 && len(st.Workers[0].Running) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %+v, want the stack's one worker %s with 1 of 4 slots busy with %s", st, s.Workers[0].ID(), tasks.TypeSliding)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if info, err := inspector.GetQueueInfo(tasks.QueueInteractive); err != nil || info.Retry < 1 {
		t.Fatalf("asynq's retry set holds %+v (%v): the parked runs should be there", info, err)
	}
	// The metrics' count (puzzleq_waiting{key}) is the same.
	deadline = time.Now().Add(30 * time.Second)
	for {
		uses, err := s.Store.SlotUses(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(uses) == 1 && uses[0].Owner == "" && uses[0].Held == 1 && uses[0].Waiting == 3 {
			break
		}
		if len(uses) != 1 || uses[0].Held > 1 || uses[0].Waiting > 3 {
			t.Fatalf("slot uses %+v, want the anonymous key holding 1 and up to 3 waiting", uses)
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot uses %+v, want 1 held and 3 waiting", uses)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mcode, metrics := s.Do("GET", "/metrics", nil)
	if mcode != 200 || !strings.Contains(string(metrics), `puzzleq_waiting{key=""}`) {
		t.Errorf("GET /metrics: %d, want puzzleq_waiting for the anonymous key", mcode)
	}

	// A batch's expensive items park on the bulk queue the same way.
	var items []string
	for i := range 2 {
		items = append(items, fmt.Sprintf(`{"kind":"sliding","puzzle":{"board":%s},"options":{"max_nodes":%d}}`, hard80, 100_000_100+i))
	}
	code, b, _ := s.DoH("POST", "/v1/batches", `{"tasks":[`+strings.Join(items, ",")+`]}`)
	if code != 202 {
		t.Fatalf("submit the batch: %d %s", code, b)
	}
	batch := stacktest.Decode[apitype.BatchCreated](t, b).ID
	t.Cleanup(func() { s.Do("DELETE", "/v1/batches/"+batch, nil) })
	poll("two items parked", tasks.QueueBulk, func(q apitype.QueueStatus) bool {
		return q.Retry == 0 && q.Waiting <= 2
	}, func(q apitype.QueueStatus) bool {
		return q.Waiting == 2
	})

	// A task retried after an error (no handler takes its type) is a
	// retry, beside the runs that wait. asynq's first retry delay is at
	// least 15 s, so it stays in the retry set while the test looks.
	c := asynq.NewClientFromRedisClient(s.RDB)
	if _, err := c.Enqueue(asynq.NewTask("no-such-type", nil), asynq.Queue(tasks.QueueInteractive), asynq.TaskID("failing"), asynq.MaxRetry(5)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inspector.DeleteTask(tasks.QueueInteractive, "failing") })
	poll("one retry beside three waiting", tasks.QueueInteractive, func(q apitype.QueueStatus) bool {
		return q.Retry <= 1 && q.Waiting <= 3
	}, func(q apitype.QueueStatus) bool {
		return q.Retry == 1 && q.Waiting == 3
	})
	if ti, err := inspector.GetTaskInfo(tasks.QueueInteractive, "failing"); err != nil || ti.State != asynq.TaskStateRetry || ti.LastErr == "" {
		t.Fatalf("the failing task: %+v (%v), want it in the retry set after an error", ti, err)
	}
}
