package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/webhook"
)

const testWebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// receiver is a webhook endpoint on 127.0.0.1 that answers failWith to
// its first failures requests and 200 after, and keeps every request.
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	failures int
	got      []received
	arrived  chan struct{}
}

type received struct {
	header http.Header
	body   []byte
	status int
	at     time.Time
}

func newReceiver(t *testing.T, failures int) *receiver {
	t.Helper()
	r := &receiver{failures: failures, arrived: make(chan struct{}, 100)}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		status := http.StatusOK
		if len(r.got) < r.failures {
			status = http.StatusInternalServerError
		}
		r.got = append(r.got, received{header: req.Header.Clone(), body: b, status: status, at: time.Now()})
		r.mu.Unlock()
		w.WriteHeader(status)
		r.arrived <- struct{}{}
	}))
	t.Cleanup(r.Close)
	return r
}

// wait waits for n requests in all, up to d.
func (r *receiver) wait(t *testing.T, n int, d time.Duration) []received {
	t.Helper()
	deadline := time.After(d)
	for {
		r.mu.Lock()
		got := append([]received(nil), r.got...)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-r.arrived:
		case <-deadline:
			t.Fatalf("the receiver got %d requests in %v, want %d", len(got), d, n)
		}
	}
}

// webhookStack is a stack whose webhooks may reach 127.0.0.1 and retry
// within a fraction of a second.
func webhookStack(t *testing.T, workers int, env map[string]string) *stacktest.Stack {
	t.Helper()
	e := map[string]string{
		"WEBHOOK_SECRET": testWebhookSecret, "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
		"WEBHOOK_RETRY_BASE": "50ms", "WEBHOOK_RETRY_MAX": "200ms", "OUTBOX_INTERVAL": "50ms",
	}
	for k, v := range env {
		e[k] = v
	}
	return stacktest.StartWith(t, workers, e)
}

// A batch's webhook is POSTed once the batch is done, signed as the
// Standard Webhooks specification says; the receiver fails it twice and
// the delivery retries until it answers 200, and the batch shows every
// attempt.
func TestWebhookSignedAndRetried(t *testing.T) {
	rcv := newReceiver(t, 2)
	s := webhookStack(t, 1, nil)
	body := `{"webhook":"` + rcv.URL + `/hooks?x=1","tasks":[{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}},` +
		`{"kind":"sweep","puzzle":{"board":[".....","....."]},"options":{"max_nodes":1}}]}`
	code, b := s.Do("POST", "/v1/batches", body)
	if code != http.StatusAccepted {
		t.Fatalf("POST /v1/batches: %d %s", code, b)
	}
	id := stacktest.Decode[apitype.BatchCreated](t, b).ID

	got := rcv.wait(t, 3, 30*time.Second)
	for i, r := range got {
		if err := webhook.Verify(testWebhookSecret, r.header, r.body, time.Now()); err != nil {
			t.Errorf("attempt %d: %v (headers %v)", i+1, err, r.header)
		}
		if r.header.Get("webhook-id") != got[0].header.Get("webhook-id") {
			t.Errorf("attempt %d has webhook-id %q, the first %q: a retry must keep it", i+1, r.header.Get("webhook-id"), got[0].header.Get("webhook-id"))
		}
		if r.header.Get("Content-Type") != "application/json" {
			t.Errorf("attempt %d: Content-Type %q", i+1, r.header.Get("Content-Type"))
		}
	}
	if got[2].at.Sub(got[0].at) < 50*time.Millisecond {
		t.Errorf("three attempts within %v: no backoff", got[2].at.Sub(got[0].at))
	}
	var ev apitype.WebhookEvent
	if err := json.Unmarshal(got[2].body, &ev); err != nil {
		t.Fatalf("event %s: %v", got[2].body, err)
	}
	batch := stacktest.Decode[apitype.Batch](t, ev.Data)
	if ev.Type != apitype.WebhookBatchDone || batch.ID != id || !batch.Done ||
		batch.Counts.Completed != 1 || batch.Counts.Failed != 1 || len(batch.Tasks) != 0 {
		t.Errorf("event %s", got[2].body)
	}

	// The attempts are on the batch; delivered, nothing more is sent.
	deadline := time.Now().Add(5 * time.Second)
	var w *apitype.Webhook
	for time.Now().Before(deadline) {
		code, b = s.Do("GET", "/v1/batches/"+id, nil)
		if code != http.StatusOK {
			t.Fatalf("GET batch: %d %s", code, b)
		}
		if w = stacktest.Decode[apitype.Batch](t, b).Webhook; w != nil && w.DeliveredAt != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if w == nil || w.URL != rcv.URL+"/hooks?x=1" || w.Attempts != 3 || w.LastStatus == nil || *w.LastStatus != 200 ||
		w.DeliveredAt == nil || w.LastError != nil {
		t.Errorf("the batch's webhook: %s", b)
	}
	time.Sleep(500 * time.Millisecond)
	if n := len(rcv.wait(t, 3, time.Second)); n != 3 {
		t.Errorf("%d requests after the delivery succeeded, want 3", n)
	}
	if n, err := s.Store.Watched(t.Context()); err != nil || n != 0 {
		t.Errorf("%d webhooks still watched (%v)", n, err)
	}
	resp, err := http.Get("http://" + s.Workers[0].Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`puzzleq_webhook_attempts_total{outcome="failed"} 2`, `puzzleq_webhook_attempts_total{outcome="delivered"} 1`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("the worker's metrics lack %s", want)
		}
	}
}

// A single task names its webhook in its body (or the query, as NDJSON
// and judge uploads must); it gets a task.done event.
func TestWebhookSingleTaskAndQuery(t *testing.T) {
	rcv := newReceiver(t, 0)
	s := webhookStack(t, 1, nil)
	code, b := s.Do("POST", "/v1/tasks", `{"webhook":"`+rcv.URL+`/t","kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`)
	if code != http.StatusAccepted && code != http.StatusOK {
		t.Fatalf("POST /v1/tasks: %d %s", code, b)
	}
	task := stacktest.Decode[apitype.Task](t, b)
	if task.Webhook == nil || task.Webhook.URL != rcv.URL+"/t" {
		t.Errorf("the 202 does not show the webhook: %s", b)
	}
	code, b, _ = s.DoH("POST", "/v1/batches?webhook="+rcv.URL+"/b", `{"kind":"sweep","puzzle":{"board":["..","*."]}}`+"\n",
		"Content-Type", "application/x-ndjson")
	if code != http.StatusAccepted {
		t.Fatalf("NDJSON with ?webhook=: %d %s", code, b)
	}
	batchID := stacktest.Decode[apitype.BatchCreated](t, b).ID
	got := rcv.wait(t, 2, 30*time.Second)
	seen := map[string]string{}
	for _, r := range got {
		if err := webhook.Verify(testWebhookSecret, r.header, r.body, time.Now()); err != nil {
			t.Error(err)
		}
		var ev apitype.WebhookEvent
		if err := json.Unmarshal(r.body, &ev); err != nil {
			t.Fatal(err)
		}
		var data struct {
			ID    string            `json:"id"`
			State apitype.TaskState `json:"state"`
		}
		json.Unmarshal(ev.Data, &data)
		seen[ev.Type] = data.ID
		if ev.Type == apitype.WebhookTaskDone && data.State != apitype.TaskStateCompleted {
			t.Errorf("task.done of a task in state %q", data.State)
		}
	}
	if seen[apitype.WebhookTaskDone] != task.ID || seen[apitype.WebhookBatchDone] != batchID {
		t.Errorf("events for %v, want task.done of %s and batch.done of %s", seen, task.ID, batchID)
	}
	// The attempt is recorded once the receiver has answered.
	var t2 apitype.Task
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if t2 = s.WaitTask(task.ID, 5*time.Second); t2.Webhook != nil && t2.Webhook.DeliveredAt != nil {
			break
		}
	}
	if t2.Webhook == nil || t2.Webhook.Attempts != 1 || t2.Webhook.DeliveredAt == nil {
		t.Errorf("GET task shows no delivered attempt: %+v", t2.Webhook)
	}
}

// A webhook that points at loopback, private or link-local addresses
// (not listed in WEBHOOK_ALLOWED_HOSTS), or is no http URL, is a 400
// naming the field, for every form of submission; so is one named twice.
func TestWebhookRefused(t *testing.T) {
	s := webhookStack(t, 0, nil)
	item := `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`
	for _, url := range []string{"http://10.0.0.1/x", "http://[::1]:8080/x", "http://169.254.169.254/latest/meta-data",
		"http://192.168.1.1/", "ftp://127.0.0.1/x", "not a url", "http://user:pw@127.0.0.1/x"} {
		for _, req := range []struct{ path, body, ct string }{
			{"/v1/batches", `{"webhook":` + jsonString(url) + `,"tasks":[` + item + `]}`, ""},
			{"/v1/batches?webhook=" + queryEscape(url), item + "\n", "application/x-ndjson"},
			{"/v1/tasks", `{"webhook":` + jsonString(url) + `,` + item[1:], ""},
		} {
			var hdr []string
			if req.ct != "" {
				hdr = []string{"Content-Type", req.ct}
			}
			code, b, _ := s.DoH("POST", req.path, req.body, hdr...)
			e := stacktest.Decode[apitype.ErrorBody](t, b).Error
			if code != http.StatusBadRequest || e.Field != "webhook" || e.Code != apitype.CodeInvalidRequest {
				t.Errorf("%s with webhook %q: %d %s", req.path, url, code, b)
			}
		}
	}
	code, b, _ := s.DoH("POST", "/v1/batches?webhook=http://127.0.0.1:1/a", `{"webhook":"http://127.0.0.1:1/b","tasks":[`+item+`]}`)
	if e := stacktest.Decode[apitype.ErrorBody](t, b).Error; code != http.StatusBadRequest || e.Field != "webhook" {
		t.Errorf("two webhooks: %d %s", code, b)
	}
	if n := s.Keys("pq:webhook:*"); n != 0 {
		t.Errorf("%d webhook records left by refused submissions", n)
	}
	// Without WEBHOOK_SECRET nothing could be signed: refused too.
	plain := stacktest.StartWith(t, 0, nil)
	code, b = plain.Do("POST", "/v1/tasks", `{"webhook":"https://example.com/x",`+item[1:])
	if e := stacktest.Decode[apitype.ErrorBody](t, b).Error; code != http.StatusBadRequest || e.Field != "webhook" ||
		!strings.Contains(e.Message, "WEBHOOK_SECRET") {
		t.Errorf("a webhook without WEBHOOK_SECRET: %d %s", code, b)
	}
}

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

func queryEscape(s string) string {
	return strings.NewReplacer("%", "%25", " ", "%20", "&", "%26", "#", "%23", "+", "%2B", "?", "%3F").Replace(s)
}
