package cli_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/cli"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/webhook"
)

const testWebhookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// hookReceiver is a webhook endpoint on 127.0.0.1 that answers 200 and
// hands every request's headers and body to got.
func hookReceiver(t *testing.T) (*httptest.Server, chan *http.Request) {
	t.Helper()
	got := make(chan *http.Request, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		got <- r
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

// submit --webhook and solve --webhook name the completion webhook of
// what they submit: the batch shows it and the receiver gets its signed
// event. A URL the server refuses is exit status 2 with the server's
// message, and nothing is submitted.
func TestWebhookFlag(t *testing.T) {
	t.Parallel()
	rcv, got := hookReceiver(t)
	st := stacktest.StartWith(t, 1, map[string]string{
		"WEBHOOK_SECRET": testWebhookSecret, "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1", "OUTBOX_INTERVAL": "50ms",
	})
	// event waits for the next event and checks its signature.
	event := func() apitype.WebhookEvent {
		t.Helper()
		select {
		case r := <-got:
			b, _ := io.ReadAll(r.Body)
			if err := webhook.Verify(testWebhookSecret, r.Header, b, time.Now()); err != nil {
				t.Errorf("%s %s: %v", r.Method, r.URL, err)
			}
			var ev apitype.WebhookEvent
			if err := json.Unmarshal(b, &ev); err != nil {
				t.Fatalf("event %s: %v", b, err)
			}
			return ev
		case <-time.After(30 * time.Second):
			t.Fatal("no webhook delivery in 30s")
		}
		return apitype.WebhookEvent{}
	}
	dataID := func(ev apitype.WebhookEvent) string {
		var d struct {
			ID string `json:"id"`
		}
		json.Unmarshal(ev.Data, &d)
		return d.ID
	}

	path := writeLines(t, slidingLines(3, 21))
	code, out, errOut := run(t, "", "submit", "--server", st.URL, "-f", path, "--webhook", rcv.URL+"/done?run=1")
	if code != 0 {
		t.Fatalf("submit --webhook: exit %d, stderr %s", code, errOut)
	}
	var line struct {
		Batch string `json:"batch"`
	}
	if err := json.Unmarshal([]byte(out), &line); err != nil || line.Batch == "" {
		t.Fatalf("submit printed %q (%v)", out, err)
	}
	code, b := st.Do("GET", "/v1/batches/"+line.Batch, nil)
	if w := stacktest.Decode[apitype.Batch](t, b).Webhook; code != http.StatusOK || w == nil || w.URL != rcv.URL+"/done?run=1" {
		t.Errorf("GET the batch: %d %s, want its webhook.url %s", code, b, rcv.URL+"/done?run=1")
	}
	if ev := event(); ev.Type != apitype.WebhookBatchDone || dataID(ev) != line.Batch {
		t.Errorf("event %s of %s, want %s of batch %s", ev.Type, dataID(ev), apitype.WebhookBatchDone, line.Batch)
	}

	// The webhook is part of what the batch's idempotency key names: the
	// same run again is the same batch, with another webhook refused.
	code, again, errOut := run(t, "", "submit", "--server", st.URL, "-f", path, "--webhook", rcv.URL+"/done?run=1")
	if code != 0 || again != out {
		t.Errorf("submit again: exit %d, printed %q (want %q), stderr %s", code, again, out, errOut)
	}
	code, _, errOut = run(t, "", "submit", "--server", st.URL, "-f", path, "--webhook", rcv.URL+"/other")
	if code != cli.ExitUsage || !strings.Contains(errOut, "Idempotency-Key") {
		t.Errorf("submit again with another webhook: exit %d, stderr %q", code, errOut)
	}

	// solve sends a handful as single tasks, each with the webhook.
	code, _, errOut = run(t, "1 0 3\n4 2 5\n7 8 6\n", "solve", "--server", st.URL, "--format", "boj1525", "--webhook", rcv.URL+"/solve")
	if code != 0 {
		t.Fatalf("solve --webhook: exit %d, stderr %s", code, errOut)
	}
	if ev := event(); ev.Type != apitype.WebhookTaskDone {
		t.Errorf("solve's event is %s, want %s", ev.Type, apitype.WebhookTaskDone)
	}

	// A private address outside WEBHOOK_ALLOWED_HOSTS: the API's 400.
	const bad = "http://10.1.2.3/hook"
	code, b, _ = st.DoH("POST", "/v1/batches?webhook="+bad, slidingLines(1, 21)[0]+"\n", "Content-Type", "application/x-ndjson")
	apiErr := stacktest.Decode[apitype.ErrorBody](t, b).Error
	if code != http.StatusBadRequest || apiErr.Field != "webhook" || apiErr.Message == "" {
		t.Fatalf("the API took webhook %s: %d %s", bad, code, b)
	}
	batches := st.Keys(batchKeys)
	for _, args := range [][]string{
		{"submit", "-f", path, "--wait"},
		{"solve", "--format", "boj1525"},
	} {
		args = append(args, "--server", st.URL, "--webhook", bad)
		code, out, errOut = run(t, "1 0 3\n4 2 5\n7 8 6\n", args...)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, apiErr.Message) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d and %q", strings.Join(args, " "), code, out, errOut, cli.ExitUsage, apiErr.Message)
		}
	}
	if n := st.Keys(batchKeys); n != batches {
		t.Errorf("%d batches after the refused webhooks, %d before", n, batches)
	}
	code, _, errOut = run(t, "1 0 3\n4 2 5\n7 8 6\n", "solve", "--local", "--format", "boj1525", "--webhook", rcv.URL)
	if code != cli.ExitUsage || !strings.Contains(errOut, "--local") {
		t.Errorf("solve --local --webhook: exit %d, stderr %q", code, errOut)
	}
}
