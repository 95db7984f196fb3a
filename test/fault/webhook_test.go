//go:build fault

package fault

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/webhook"
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
