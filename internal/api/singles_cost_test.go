package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// tripCounter is a go-redis hook that counts round trips, once each has
// been answered: one per command sent alone, one per pipeline.
type tripCounter struct{ n atomic.Int64 }

func (h *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { err := next(ctx, cmd); h.n.Add(1); return err }
}
func (h *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { err := next(ctx, cmds); h.n.Add(1); return err }
}

// commandCalls returns INFO commandstats' calls per command (which count
// the commands that scripts run too), leaving out INFO itself and LLEN
// (the test's own), and their sum.
func commandCalls(t *testing.T, rdb *redis.Client) (map[string]int64, int64) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls, sum := map[string]int64{}, int64(0)
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok || name == "cmdstat_info" || name == "cmdstat_llen" {
			continue
		}
		c, _, _ := strings.Cut(rest, ",")
		var v int64
		fmt.Sscan(c, &v)
		calls[strings.TrimPrefix(name, "cmdstat_")] = v
		sum += v
	}
	return calls, sum
}

// perTask formats the calls per command between two commandCalls.
func perTask(before, after map[string]int64, n int) string {
	var parts []string
	for name, v := range after {
		if d := v - before[name]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2g", name, float64(d)/float64(n)))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// TestCommandsPerSingleTask runs single tasks through the API (which
// enqueues them) and the worker's handler on a Redis of their own, and
// logs the Redis commands (INFO commandstats, commands run by scripts
// included) and the round trips each task cost, for each way a client
// asks. The test takes each task from asynq's queue itself, between
// snapshots, so its own commands are not counted; asynq's dequeue and
// completion come on top (loadgen's raw-asynq measures them). It fails
// when a task costs more than today's figures, so that a change adding a
// round trip or a read to the single-task path is noticed.
func TestCommandsPerSingleTask(t *testing.T) {
	cases := []struct {
		name     string
		auth     bool
		postWait bool // POST ?wait= rather than POST, then GET ?wait=
		// apiTrips is the API's round trips before the worker runs the
		// task; maxCmds bounds the commands per task.
		apiTrips int64
		maxCmds  float64
	}{
		// Each includes the owner's task index that lists read (issue 14:
		// ZADD and EXPIRE in the submit script, and a ZREMRANGEBYSCORE in
		// one submission of 16, by the ID's last digit; the bounds leave
		// room for every one of the test's tasks to trim) and the result
		// cache's SET NX in the finish script.
		{"POST ?wait", false, true, 1, 15},
		{"POST ?wait, key", true, true, 2, 32},
		// The GET reads the record's webhook hash with it (one round
		// trip, one command more).
		{"POST then GET ?wait", false, false, 2, 17},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rs := redistest.Start(t)
			apiTrips, workerTrips := &tripCounter{}, &tripCounter{}
			apiRDB, workerRDB, plain := rs.Client(t), rs.Client(t), rs.Client(t)
			apiRDB.AddHook(apiTrips)
			workerRDB.AddHook(workerTrips)
			sopts := store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour}
			hub := store.NewHub()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); store.New(plain, sopts).ListenEvents(ctx, hub) }()
			t.Cleanup(func() { cancel(); <-done })
			for i := 0; ; i++ {
				n, err := plain.PubSubNumSub(ctx, "pq:events").Result()
				if err == nil && n["pq:events"] > 0 {
					break
				}
				if i == 200 {
					t.Fatalf("the event listener did not subscribe: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			// As the binaries do at start, so that no request pays for
			// loading a script.
			if err := store.LoadScripts(ctx, plain); err != nil {
				t.Fatal(err)
			}
			opts := OptionsForTest()
			if tc.auth {
				opts.Keys = []APIKey{{Name: "alice", Key: aliceKey}}
			}
			srv := New(store.New(apiRDB, sopts), hub, prometheus.NewRegistry(), nil, opts)
			insp := asynq.NewInspectorFromRedisClient(plain)
			h := worker.NewHandler(store.New(workerRDB, sopts), nil, opts.Limits, nil, nil)
			// The handler runs behind the worker's heartbeat middleware, on
			// a client of its own: its record of a started task is written
			// behind the task, and an 8-puzzle mostly ends before that
			// write is due (worker.Heartbeat). The beat itself is per
			// worker, not per task, so this one beats only when told.
			hbTrips := &tripCounter{}
			hbRDB := rs.Client(t)
			hbRDB.AddHook(hbTrips)
			hb := worker.NewHeartbeat(store.New(hbRDB, sopts), "w-cost", time.Hour, nil)
			t.Cleanup(func() { _ = hb.Leave(context.Background()) })
			worker := hb.Middleware()(h)

			do := func(method, path string, body []byte) *httptest.ResponseRecorder {
				req := httptest.NewRequest(method, path, strings.NewReader(string(body)))
				if tc.auth {
					req.Header.Set("Authorization", "Bearer "+aliceKey)
				}
				w := httptest.NewRecorder()
				srv.Handler().ServeHTTP(w, req)
				return w
			}
			// one runs a task and returns the commands it cost: all but
			// those of the test's own look into asynq's queue.
			one := func(i int) int64 {
				t.Helper()
				_, c0 := commandCalls(t, plain)
				answer := make(chan *httptest.ResponseRecorder, 1)
				polled := int64(-1) // the poll's round trips start after the POST's
				if tc.postWait {
					go func() { answer <- do(http.MethodPost, "/v1/tasks?wait=10s", sliding8(t, i)) }()
				} else {
					w := do(http.MethodPost, "/v1/tasks", sliding8(t, i))
					var tr apitype.Task
					if w.Code != http.StatusAccepted || json.Unmarshal(w.Body.Bytes(), &tr) != nil {
						t.Fatalf("POST: %d %s", w.Code, w.Body)
					}
					polled = apiTrips.n.Load()
					go func() { answer <- do(http.MethodGet, "/v1/tasks/"+tr.ID+"?wait=10s", nil) }()
				}
				// Until the request has subscribed, the task is queued and
				// the poll has read the record (so the worker cannot end
				// the task before it): the request now waits for the
				// event. LLEN is the test's, and not counted.
				for n := 0; ; n++ {
					queued, err := plain.LLen(ctx, "asynq:{"+tasks.QueueCheap+"}:pending").Result()
					if err != nil {
						t.Fatal(err)
					}
					if hub.Waiting() > 0 && queued > 0 && (polled < 0 || apiTrips.n.Load() > polled) {
						break
					}
					if n == 10000 {
						t.Fatalf("the request did not queue the task and wait")
					}
					time.Sleep(100 * time.Microsecond)
				}
				_, c1 := commandCalls(t, plain)
				queued, err := insp.ListPendingTasks(tasks.QueueCheap)
				if err != nil || len(queued) != 1 {
					select {
					case w := <-answer:
						t.Fatalf("queued %v, %v; the request answered %d %s", queued, err, w.Code, w.Body)
					default:
						t.Fatalf("queued %v, %v; want the one task", queued, err)
					}
				}
				if err := insp.DeleteTask(tasks.QueueCheap, queued[0].ID); err != nil {
					t.Fatal(err)
				}
				_, c2 := commandCalls(t, plain)
				if err := worker.ProcessTask(ctx, asynq.NewTask(queued[0].Type, queued[0].Payload)); err != nil {
					t.Fatal(err)
				}
				w := <-answer
				var tr apitype.Task
				if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &tr) != nil || tr.State != apitype.TaskStateCompleted || tr.StartedAt == nil {
					t.Fatalf("answer %d %s", w.Code, w.Body)
				}
				_, c3 := commandCalls(t, plain)
				return c1 - c0 + c3 - c2
			}
			one(0) // the first loads the scripts and builds the solver's table
			const n = 20
			by0, _ := commandCalls(t, plain)
			a0, w0, h0 := apiTrips.n.Load(), workerTrips.n.Load(), hbTrips.n.Load()
			var total int64
			for i := 1; i <= n; i++ {
				total += one(i)
			}
			by1, _ := commandCalls(t, plain)
			cmds := float64(total) / n
			at, wt := float64(apiTrips.n.Load()-a0)/n, float64(workerTrips.n.Load()-w0)/n
			hbt := hbTrips.n.Load() - h0
			t.Logf("per task: %.2f Redis commands, %.2f round trips (API %.2f, worker handler %.2f, heartbeat %.2f), asynq's dequeue and completion not included; with the test's look into the queue: %s",
				cmds, at+wt+float64(hbt)/n, at, wt, float64(hbt)/n, perTask(by0, by1, n))
			// The heartbeat writes a task only when it outlives holdDelay
			// (5 ms): none at idle, up to 3 of the 20 at a load average of
			// 10 on this machine. Each such write (HSET, PEXPIRE) may fall
			// in the counted windows, so the bound allows for them; one
			// write per task (the synchronous hold before the write-behind:
			// 20 round trips, 2 commands a task) fails.
			if at != float64(tc.apiTrips) || wt != 1 || cmds > tc.maxCmds+2*float64(hbt)/n {
				t.Fatalf("a task costs %.2f + %.2f round trips and %.2f commands; want %d + 1 and at most %.0f (+ 2 per heartbeat write a task)", at, wt, cmds, tc.apiTrips, tc.maxCmds)
			}
			if hbt >= n/2 {
				t.Fatalf("the heartbeat made %d round trips for %d tasks; want fewer than %d (only tasks that outlive its 5 ms delay are written)", hbt, n, n/2)
			}
		})
	}
}
