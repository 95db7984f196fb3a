package api_test

import (
	"encoding/json"
	"strconv"
	"sync"
	"testing"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

func TestAPIKeysAndOwnership(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 1, map[string]string{"API_KEYS": "alice:s3cret-alice-0123,bob:t0ken-bob-0123456"})
	for _, tc := range []struct {
		key  string
		want int
	}{{"", 401}, {"nope", 401}, {"s3cret-alice-012", 401}, {"s3cret-alice-0123", 202}} {
		code, b, hdr := s.DoAs(tc.key, "POST", "/v1/tasks", sample8)
		if code != tc.want {
			t.Errorf("key %q: %d %s", tc.key, code, b)
		}
		if code == 401 && (decode[apitype.ErrorBody](t, b).Error.Code != "unauthorized" || hdr.Get("WWW-Authenticate") == "") {
			t.Errorf("401 body or header: %s %v", b, hdr)
		}
	}
	// Health stays open for probes.
	if code, _ := s.Do("GET", "/healthz", nil); code != 200 {
		t.Errorf("healthz behind auth: %d", code)
	}
	_, b, _ := s.DoAs("s3cret-alice-0123", "POST", "/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[2,1],[3,0]]}}`)
	tk := decode[apitype.Task](t, b)
	// Another key sees nothing: 404, never 403.
	for _, m := range []string{"GET", "DELETE"} {
		if code, b, _ := s.DoAs("t0ken-bob-0123456", m, "/v1/tasks/"+tk.ID, ""); code != 404 {
			t.Errorf("bob %s alice's task: %d %s", m, code, b)
		}
	}
	if code, _, _ := s.DoAs("s3cret-alice-0123", "GET", "/v1/tasks/"+tk.ID+"?wait=10s", ""); code != 200 {
		t.Errorf("alice reads her task: %d", code)
	}
	code, b, _ := s.DoAs("s3cret-alice-0123", "POST", "/v1/batches", `{"tasks":[`+sample8+`]}`)
	if code != 202 {
		t.Fatalf("batch: %d %s", code, b)
	}
	bid := decode[apitype.BatchCreated](t, b).ID
	for _, p := range []string{"/v1/batches/" + bid, "/v1/batches/" + bid + "/output"} {
		if code, _, _ := s.DoAs("t0ken-bob-0123456", "GET", p, ""); code != 404 {
			t.Errorf("bob GET %s: %d", p, code)
		}
	}
	if code, _, _ := s.DoAs("t0ken-bob-0123456", "DELETE", "/v1/batches/"+bid, ""); code != 404 {
		t.Errorf("bob cancels alice's batch: %d", code)
	}
}

func TestRateLimitPerKey(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:a-key-0123456789ab,bob:b-key-0123456789ab", "RATE_LIMIT_PER_SECOND": "1", "RATE_LIMIT_BURST": "3"})
	limited := 0
	var retry string
	for range 6 {
		code, b, hdr := s.DoAs("a-key-0123456789ab", "GET", "/v1/tasks/"+zeroID, "")
		switch code {
		case 404:
		case 429:
			limited++
			retry = hdr.Get("Retry-After")
			if decode[apitype.ErrorBody](t, b).Error.Code != "rate_limited" {
				t.Errorf("429 body: %s", b)
			}
		default:
			t.Fatalf("unexpected %d %s", code, b)
		}
	}
	if limited < 2 {
		t.Fatalf("6 quick requests at 1/s with burst 3: only %d limited", limited)
	}
	if n, err := strconv.Atoi(retry); err != nil || n < 1 {
		t.Fatalf("Retry-After %q", retry)
	}
	// Bob has his own bucket.
	if code, _, _ := s.DoAs("b-key-0123456789ab", "GET", "/v1/tasks/"+zeroID, ""); code != 404 {
		t.Fatalf("bob limited by alice's traffic: %d", code)
	}
}

const zeroID = "00000000000000000000000000000000"

func TestPendingQuotaPerKey(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:a-key-0123456789ab", "MAX_PENDING_PER_KEY": "3", "RATE_LIMIT_BURST": "100"})
	var ids []string
	for i, board := range []string{".", "..", "..."} {
		code, b, _ := s.DoAs("a-key-0123456789ab", "POST", "/v1/tasks", `{"kind":"sweep","puzzle":{"board":["`+board+`"]}}`)
		if code != 202 {
			t.Fatalf("submit %d: %d %s", i, code, b)
		}
		ids = append(ids, decode[apitype.Task](t, b).ID)
	}
	code, b, _ := s.DoAs("a-key-0123456789ab", "POST", "/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[3,1],[2,0]]}}`)
	if code != 429 || decode[apitype.ErrorBody](t, b).Error.Code != "quota_exceeded" {
		t.Fatalf("4th pending task: %d %s", code, b)
	}
	if code, b, _ := s.DoAs("a-key-0123456789ab", "POST", "/v1/batches", `{"tasks":[{"kind":"sweep","puzzle":{"board":["...."]}}]}`); code != 429 {
		t.Fatalf("batch over quota: %d %s", code, b)
	}
	// Ending a task gives its slot back.
	if code, b, _ := s.DoAs("a-key-0123456789ab", "DELETE", "/v1/tasks/"+ids[0], ""); code != 200 {
		t.Fatalf("cancel: %d %s", code, b)
	}
	if code, b, _ := s.DoAs("a-key-0123456789ab", "POST", "/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[3,1],[2,0]]}}`); code != 202 {
		t.Fatalf("after a cancel: %d %s", code, b)
	}
	// A worker finishing tasks gives slots back too.
	s.AddWorker(nil)
	for _, id := range ids[1:] {
		s.DoAs("a-key-0123456789ab", "GET", "/v1/tasks/"+id+"?wait=10s", "")
	}
	if code, b, _ := s.DoAs("a-key-0123456789ab", "POST", "/v1/batches", `{"tasks":[{"kind":"sweep","puzzle":{"board":["....."]}},{"kind":"sweep","puzzle":{"board":["......"]}}]}`); code != 202 {
		t.Fatalf("after completions: %d %s", code, b)
	}
}

func TestIdempotentBatchRetries(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, nil)
	body := `{"tasks":[` + sample8 + `,{"kind":"sweep","puzzle":{"board":["..."]}}]}`
	code, b, _ := s.DoAs("", "POST", "/v1/batches", body, "Idempotency-Key", "run-1-batch-0")
	if code != 202 {
		t.Fatalf("%d %s", code, b)
	}
	first := decode[apitype.BatchCreated](t, b)
	code, b, hdr := s.DoAs("", "POST", "/v1/batches", body, "Idempotency-Key", "run-1-batch-0")
	again := decode[apitype.BatchCreated](t, b)
	if code != 202 || again.ID != first.ID || len(again.TaskIDs) != 2 || again.TaskIDs[1] != first.TaskIDs[1] || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %+v %v", code, again, hdr)
	}
	if code, b, _ := s.DoAs("", "POST", "/v1/batches", `{"tasks":[`+sample8+`]}`, "Idempotency-Key", "run-1-batch-0"); code != 422 {
		t.Fatalf("same key, different body: %d %s", code, b)
	}
	// Concurrent retries of one submission create one batch.
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, b, _ := s.DoAs("", "POST", "/v1/batches", body, "Idempotency-Key", "run-2")
			if code != 202 {
				t.Errorf("concurrent %d: %d %s", i, code, b)
				return
			}
			var v apitype.BatchCreated
			json.Unmarshal(b, &v)
			ids[i] = v.ID
		}()
	}
	wg.Wait()
	for _, id := range ids[1:] {
		if id != ids[0] {
			t.Fatalf("concurrent retries made different batches: %v", ids)
		}
	}
	if n := s.Keys("pq:batch:*:req"); n != 2 {
		t.Fatalf("%d batches stored, want 2", n)
	}
}
