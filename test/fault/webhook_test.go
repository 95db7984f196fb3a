//go:build fault

package fault

import (
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/tasks"
	"github.com/puzzleq/puzzleq/webhook"
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

// The two keys of the webhook sharing scenario.
const (
	hookOwnerA, hookKeyA = "hooks-a", "hooks-a-secret-key-0123"
	hookOwnerB, hookKeyB = "hooks-b", "hooks-b-secret-key-4567"
)

// blackhole is a TCP listener that accepts connections, reads whatever
// comes and never answers: a receiver that does not answer. It counts
// the connections open now.
type blackhole struct {
	ln   net.Listener
	open atomic.Int64
	all  atomic.Int64
	wg   sync.WaitGroup
}

func newBlackhole(t *testing.T) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln}
	var mu sync.Mutex
	var conns []net.Conn
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			cn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, cn)
			mu.Unlock()
			b.open.Add(1)
			b.all.Add(1)
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer b.open.Add(-1)
				_, _ = io.Copy(io.Discard, cn) // until the worker gives up
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, cn := range conns {
			cn.Close()
		}
		mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *blackhole) url() string { return "http://" + b.ln.Addr().String() + "/hook" }

// TestWebhookSlotsSharedBetweenKeys: key A's 40 one-item batches name a
// receiver that accepts the connection and never answers, so each of
// their deliveries would hold a slot for WEBHOOK_TIMEOUT (10 s, the
// default) and be retried. Alone, A's deliveries take every slot of both
// workers (2 × 4). Key B's one-item batches, submitted one after another
// while A's hang, get their webhook within 2 s of the batch ending: B's
// delivery is taken off the queue by the webhook server's spare goroutine
// and takes a slot from A (the key holding most) at once. Before, B's
// waited for one of A's to time out, 38-48 s with A's retries in line.
func TestWebhookSlotsSharedBetweenKeys(t *testing.T) {
	hole := newBlackhole(t)
	var mu sync.Mutex
	arrived := map[string]time.Time{} // B's batch ID -> arrival
	var sigErrs []error
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		now := time.Now()
		var ev apitype.WebhookEvent
		var batch apitype.Batch
		err := webhook.Verify(faultWebhookSecret, r.Header, b, now)
		if err == nil {
			err = json.Unmarshal(b, &ev)
		}
		if err == nil {
			err = json.Unmarshal(ev.Data, &batch)
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			sigErrs = append(sigErrs, err)
			return
		}
		if _, dup := arrived[batch.ID]; !dup {
			arrived[batch.ID] = now
		}
	}))
	defer rcv.Close()
	hooks := map[string]string{"WEBHOOK_SECRET": faultWebhookSecret, "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1"}
	api := map[string]string{"OUTBOX_INTERVAL": "50ms", "API_KEYS": hookOwnerA + ":" + hookKeyA + "," + hookOwnerB + ":" + hookKeyB,
		"RATE_LIMIT_PER_SECOND": "1000", "RATE_LIMIT_BURST": "1000"}
	maps.Copy(api, hooks)
	worker := map[string]string{"WEBHOOK_CONCURRENCY": "4"}
	maps.Copy(worker, hooks)
	c := newCluster(t, clusterOpts{api: api, worker: worker, workers: 2})
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	base := c.api.URL()
	reqs := eightPuzzles(60, 94)

	// bRound submits one of B's one-item batches and returns the time
	// from its end (done_at) to its webhook's arrival.
	bRound := func(i int) time.Duration {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"webhook": rcv.URL + "/b", "tasks": []json.RawMessage{json.RawMessage(reqs[40+i])}})
		id := submitAs(t, hc, base, hookKeyB, body, "application/json")
		var at time.Time
		if !pollUntil(60*time.Second, 2*time.Millisecond, func() bool {
			mu.Lock()
			defer mu.Unlock()
			at = arrived[id]
			return !at.IsZero()
		}) {
			t.Fatalf("B's webhook %d (batch %s) did not arrive within 60 s; the blackhole holds %d", i, id, hole.open.Load())
		}
		b := batchStateAs(t, hc, base, hookKeyB, id)
		if b.DoneAt == nil {
			t.Fatalf("B's batch %s delivered its webhook but is not done: %+v", id, b.Counts)
		}
		return at.Sub(*b.DoneAt)
	}

	// B alone first: the delay with nothing in the way.
	var alone []time.Duration
	for i := range 5 {
		alone = append(alone, bRound(i))
	}

	// A's 40 one-item batches with the receiver that never answers.
	for i := range 40 {
		body, _ := json.Marshal(map[string]any{"webhook": hole.url(), "tasks": []json.RawMessage{json.RawMessage(reqs[i])}})
		submitAs(t, hc, base, hookKeyA, body, "application/json")
	}
	if !pollUntil(30*time.Second, 10*time.Millisecond, func() bool { return hole.open.Load() >= 8 }) {
		t.Fatalf("A's deliveries hold %d connections to the receiver that never answers, want every slot (8)", hole.open.Load())
	}
	time.Sleep(500 * time.Millisecond) // A's waiting deliveries go round the retry set
	heldAlone := hole.open.Load()

	// B's batches while A's deliveries hang, spread over more than a
	// delivery timeout so that A's retries are in line too.
	var beside []time.Duration
	for i := 5; i < 20; i++ {
		beside = append(beside, bRound(i))
		time.Sleep(700 * time.Millisecond)
	}
	// A's hanging deliveries time out and go round the retry set, so at
	// any one moment a few of its slots may be between two attempts: A
	// holds its share again once they are back, which takes seconds, not
	// the moment B's last webhook arrived. A slot B's deliveries never gave
	// back would keep A below its share for good.
	heldAfter := hole.open.Load()
	pollUntil(15*time.Second, 10*time.Millisecond, func() bool {
		heldAfter = max(heldAfter, hole.open.Load())
		return heldAfter >= 4
	})

	// The backlog per key, by name, on a worker's /metrics.
	resp, err := http.Get(c.workers[0].URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var backlogA string
	for _, line := range strings.Split(string(mb), "\n") {
		if strings.HasPrefix(line, `puzzleq_webhook_backlog{key="`+hookOwnerA+`"}`) {
			backlogA = strings.Fields(line)[1]
		}
		if strings.HasPrefix(line, `puzzleq_webhook_backlog{key="`+hookOwnerB+`"}`) {
			t.Errorf("B's delivered webhooks still count in its backlog: %s", line)
		}
	}
	if strings.Contains(string(mb), hookKeyA) || strings.Contains(string(mb), hookKeyB) {
		t.Error("a key's secret is in the worker's /metrics")
	}
	if backlogA != "40" {
		t.Errorf("puzzleq_webhook_backlog{key=%q} = %q, want 40", hookOwnerA, backlogA)
	}

	slices.Sort(alone)
	sorted := slices.Clone(beside)
	slices.Sort(sorted)
	mu.Lock()
	errs := sigErrs
	mu.Unlock()
	t.Logf("FIGURES webhook slots shared: B's webhook after its batch ended, alone: median %v max %v; beside A's 40 hanging (%d connections held before B, %d after, %d in all): median %v max %v",
		alone[len(alone)/2].Round(time.Millisecond), alone[len(alone)-1].Round(time.Millisecond), heldAlone, heldAfter, hole.all.Load(),
		sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
	if len(errs) > 0 {
		t.Errorf("B's receiver got bad deliveries: %v", errs)
	}
	if m := sorted[len(sorted)-1]; m > 2*time.Second {
		t.Errorf("B's webhook came %v after its batch ended beside A's hanging deliveries, want at most 2 s (all: %v)", m, beside)
	}
	if heldAlone < 8 {
		t.Errorf("A alone held %d of the 8 delivery slots, want all", heldAlone)
	}
	if heldAfter < 4 {
		t.Errorf("A held at most %d delivery slots in the 15 s after B's deliveries, want its share (4) or more", heldAfter)
	}
}
