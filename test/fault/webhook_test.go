//go:build fault

package fault

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/webhook"
	"github.com/puzzleq/puzzleq/tasks"
)

const faultWebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// TestWebhookSurvivesAPICrash: a batch ends while the only API's
// reconciler is between passes, and that API is killed before it enqueues
// the batch's webhook. The delivery is not lost: the webhook stayed
// watched, and a new API's reconciler enqueues it, once.
func TestWebhookSurvivesAPICrash(t *testing.T) {
	var (
		mu   sync.Mutex
		got  [][]byte
		errs []error
	)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, b)
		if err := webhook.Verify(faultWebhookSecret, r.Header, b, time.Now()); err != nil {
			errs = append(errs, err)
		}
		mu.Unlock()
	}))
	defer rcv.Close()
	hooks := map[string]string{"WEBHOOK_SECRET": faultWebhookSecret, "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
		"WEBHOOK_RETRY_BASE": "100ms", "WEBHOOK_RETRY_MAX": "200ms"}
	api := map[string]string{"OUTBOX_INTERVAL": "1m"} // one pass at start, none after
	for k, v := range hooks {
		api[k] = v
	}
	c := newCluster(t, clusterOpts{api: api, worker: hooks, workers: 1})
	body, _ := json.Marshal(map[string]any{"webhook": rcv.URL + "/done",
		"tasks": []json.RawMessage{json.RawMessage(`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`)}})
	var ack apitype.BatchCreated
	if err := json.Unmarshal(c.must("POST", "/v1/batches", body, http.StatusAccepted), &ack); err != nil {
		t.Fatal(err)
	}
	if b := c.waitBatch(ack.ID, 30*time.Second); !b.Done {
		t.Fatalf("batch not done: %+v", b.Counts)
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	early := len(got)
	mu.Unlock()
	if n, err := c.rdb.ZCard(ctxT(t), "pq:webhooks:watch").Result(); err != nil || n != 1 || early != 0 {
		t.Fatalf("before the crash: watched %d (%v), delivered %d; want the webhook watched, undelivered", n, err, early)
	}
	c.api.Kill()

	api["OUTBOX_INTERVAL"] = "50ms"
	c.startReplica(t, "api2", api)
	if !pollUntil(20*time.Second, 20*time.Millisecond, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) > 0 }) {
		t.Fatal("the webhook was never delivered after the API that saw the batch end died")
	}
	time.Sleep(time.Second)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || len(errs) != 0 {
		t.Fatalf("%d deliveries (want 1), signature errors %v", len(got), errs)
	}
	var ev apitype.WebhookEvent
	if err := json.Unmarshal(got[0], &ev); err != nil || ev.Type != apitype.WebhookBatchDone {
		t.Errorf("event %s: %v", got[0], err)
	}
}

// TestSlowWebhooksHoldNoSolverSlot: one client's tasks name a webhook
// whose receiver never answers (it takes the request and holds it, as a
// blackholed endpoint does until the timeout). Each delivery hangs for
// WEBHOOK_TIMEOUT and is retried, so such a client keeps a pile of them
// going. Meanwhile another client's 8-puzzles complete as on an idle
// worker: deliveries run on their own slots (WEBHOOK_CONCURRENCY), never
// on the solvers'. Before, they ran on the solvers' slots, and once a
// pile of hung deliveries held every one, each 8-puzzle waited out a
// delivery's timeout.
func TestSlowWebhooksHoldNoSolverSlot(t *testing.T) {
	var hung, attempts atomic.Int64 // deliveries held now, and in all
	release := make(chan struct{})
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		hung.Add(1)
		defer hung.Add(-1)
		// Read the body, so that the server notices the worker giving up
		// (its context ends) and the count of held deliveries is true.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer rcv.Close()
	defer close(release) // first: Close waits for the held requests
	hooks := map[string]string{"WEBHOOK_SECRET": faultWebhookSecret, "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
		"WEBHOOK_TIMEOUT": "4s", "WEBHOOK_RETRY_BASE": "100ms", "WEBHOOK_RETRY_MAX": "200ms"}
	api := map[string]string{"OUTBOX_INTERVAL": "50ms"}
	maps.Copy(api, hooks)
	worker := map[string]string{"WORKER_CONCURRENCY": "2", "WEBHOOK_CONCURRENCY": "2"}
	maps.Copy(worker, hooks)
	c := newCluster(t, clusterOpts{api: api, worker: worker, workers: 1})

	// The slow client: 8 tasks, each with the webhook, so 8 deliveries
	// hang and retry, far more than there are slots.
	for i, req := range eightPuzzles(8, 91) {
		body := `{"webhook":"` + rcv.URL + `/hook",` + req[1:]
		var tr apitype.Task
		if err := json.Unmarshal(c.must("POST", "/v1/tasks?wait=10s", []byte(body), http.StatusOK), &tr); err != nil || tr.State != apitype.TaskStateCompleted {
			t.Fatalf("task %d with the webhook: %+v %v", i, tr, err)
		}
	}
	if !pollUntil(20*time.Second, 20*time.Millisecond, func() bool { return hung.Load() >= 2 }) {
		t.Fatalf("the receiver holds %d deliveries, want two hanging", hung.Load())
	}

	// The other client, one 8-puzzle after another.
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	reqs := eightPuzzles(40, 92)
	lat := make([]time.Duration, 0, len(reqs))
	for i, req := range reqs {
		d, err := submitWait(c, hc, "", req)
		if err != nil {
			t.Fatalf("8-puzzle %d: %v", i, err)
		}
		lat = append(lat, d)
	}
	slices.Sort(lat)
	held := hung.Load()
	t.Logf("FIGURES slow webhooks: %d 8-puzzles beside hanging deliveries (%d attempts so far, %d held at the end): p50 %v p99 %v max %v",
		len(lat), attempts.Load(), held, lat[len(lat)/2].Round(100*time.Microsecond), lat[len(lat)*99/100].Round(100*time.Microsecond),
		lat[len(lat)-1].Round(100*time.Microsecond))
	if held == 0 {
		t.Errorf("no delivery was held when the 8-puzzles ended: the test did not run them beside hanging deliveries")
	}
	if lat[len(lat)-1] > 2*time.Second {
		t.Errorf("an 8-puzzle took %v beside the hanging deliveries, want under 2 s (a delivery's timeout is 4 s)", lat[len(lat)-1])
	}
}

// TestWebhookWorkerKilledMidDelivery: the worker holding a delivery (its
// receiver holds the first attempt open) is killed with SIGKILL. The
// delivery runs on the worker's webhook server, under the same heartbeat
// as its solves, so the API's watchdog re-drives it to the other worker
// within seconds, not after asynq's lease recovery (a minute or more),
// and the receiver gets it once more and answers.
func TestWebhookWorkerKilledMidDelivery(t *testing.T) {
	var attempts atomic.Int64
	release := make(chan struct{})
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if attempts.Add(1) == 1 {
			select { // the first attempt hangs until its worker is gone
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
	}))
	defer rcv.Close()
	defer close(release)
	hooks := map[string]string{"WEBHOOK_SECRET": faultWebhookSecret, "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
		"WEBHOOK_TIMEOUT": "60s", "WEBHOOK_RETRY_BASE": "100ms", "WEBHOOK_RETRY_MAX": "200ms"}
	api := map[string]string{"OUTBOX_INTERVAL": "50ms"}
	maps.Copy(api, hooks)
	c := newCluster(t, clusterOpts{api: api, worker: hooks, workers: 2})

	body := `{"webhook":"` + rcv.URL + `/hook",` + eightPuzzles(1, 93)[0][1:]
	var tr apitype.Task
	if err := json.Unmarshal(c.must("POST", "/v1/tasks?wait=10s", []byte(body), http.StatusOK), &tr); err != nil || tr.State != apitype.TaskStateCompleted {
		t.Fatalf("task with the webhook: %+v %v", tr, err)
	}
	if !pollUntil(20*time.Second, 10*time.Millisecond, func() bool { return attempts.Load() >= 1 }) {
		t.Fatal("the delivery never reached the receiver")
	}
	// The worker whose webhook server runs the delivery.
	var holder *proc
	if !pollUntil(10*time.Second, 20*time.Millisecond, func() bool {
		servers, err := c.insp.Servers()
		if err != nil {
			return false
		}
		for _, s := range servers {
			if len(s.ActiveWorkers) == 0 || s.Queues[tasks.QueueWebhooks] == 0 {
				continue
			}
			for _, w := range c.workers {
				if w.PID() == s.PID {
					holder = w
				}
			}
		}
		return holder != nil
	}) {
		t.Fatal("no worker's webhook server shows the delivery active")
	}
	killed := time.Now()
	holder.Kill()
	if !pollUntil(30*time.Second, 20*time.Millisecond, func() bool { return attempts.Load() >= 2 }) {
		t.Fatalf("the delivery was not attempted again within 30 s of killing %s", holder.Name)
	}
	again := time.Since(killed)
	var got apitype.Task
	if !pollUntil(10*time.Second, 50*time.Millisecond, func() bool {
		got, _ = c.getTask(tr.ID, 0)
		return got.Webhook != nil && got.Webhook.DeliveredAt != nil
	}) {
		t.Fatalf("the webhook's record after the retry: %+v", got.Webhook)
	}
	t.Logf("FIGURES webhook worker killed: delivery attempted again %v after SIGKILL of its worker (attempts %d), delivered", again.Round(time.Millisecond), attempts.Load())
	if again > 15*time.Second {
		t.Errorf("the delivery came again %v after the kill: asynq's lease recovery, not the watchdog's re-drive", again)
	}
}
