package app_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

const sample8 = `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`

// TestOpsEndpoints checks what the wiring adds around the API and the
// worker: health, readiness and metrics on both binaries, and readiness
// that follows Redis.
func TestOpsEndpoints(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 1, nil)
	s.WaitTask(s.Submit(sample8, 202).ID, 10*time.Second)
	for _, p := range []string{"/healthz", "/readyz", "/openapi.yaml"} {
		if code, b := s.Do("GET", p, nil); code != 200 {
			t.Errorf("%s: %d %s", p, code, b)
		}
	}
	code, b := s.Do("GET", "/metrics", nil)
	for _, m := range []string{"puzzleq_http_requests_total", "puzzleq_submitted_total", "asynq_queue_size", "go_goroutines"} {
		if code != 200 || !strings.Contains(string(b), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	// The worker serves its own health and metrics.
	w := s.Workers[0]
	resp, err := http.Get("http://" + w.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	wb, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	for _, m := range []string{`puzzleq_tasks_total{kind="sliding",outcome="completed"} 1`, "puzzleq_solve_duration_seconds_bucket", "asynq_queue_size"} {
		if !strings.Contains(string(wb), m) {
			t.Errorf("worker /metrics lacks %s", m)
		}
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		r, err := http.Get("http://" + w.Addr() + p)
		if err != nil || r.StatusCode != 200 {
			t.Errorf("worker %s: %v %v", p, r, err)
		}
		if r != nil {
			r.Body.Close()
		}
	}
	// Without PDB_DIR there are no 7-8 files: the worker is ready on
	// 6-6-3 and says why.
	r, err := http.Get("http://" + w.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	r.Body.Close()
	if !strings.Contains(string(rb), `"pdb_set":"663"`) || !strings.Contains(string(rb), "PDB_DIR is not set") {
		t.Errorf("worker /readyz: %s", rb)
	}
	// Redis gone: readiness fails and the API answers 503 unavailable,
	// quickly, instead of hanging or 500.
	s.Redis.Kill()
	start := time.Now()
	if code, _ := s.Do("GET", "/readyz", nil); code != 503 {
		t.Errorf("readyz without redis: %d", code)
	}
	code, b = s.Do("POST", "/v1/tasks", sample8)
	if e := decode[apitype.ErrorBody](t, b); code != 503 || e.Error.Code != "unavailable" {
		t.Errorf("submit without redis: %d %s", code, b)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("answers without redis took %v", el)
	}
}

// TestReadinessFollowsRedisWrites: a Redis at maxmemory under noeviction
// answers PING and refuses every write; both binaries' /readyz fail (503
// unavailable, saying Redis refuses writes) while it does, and answer 200
// again at the first probe once it takes writes.
func TestReadinessFollowsRedisWrites(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 1, nil)
	w := s.Workers[0]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if r, err := http.Get("http://" + w.Addr() + "/readyz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("worker never ready")
		}
	}
	probe := func() (api, worker int, apiBody, workerBody string) {
		code, b := s.Do("GET", "/readyz", nil)
		r, err := http.Get("http://" + w.Addr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		wb, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		r.Body.Close()
		return code, r.StatusCode, string(b), string(wb)
	}
	ctx := t.Context()
	if err := s.RDB.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.RDB.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis at maxmemory still answers PING: %v", err)
	}
	a, wk, ab, wb := probe()
	for _, r := range []struct {
		who  string
		code int
		body string
	}{{"api", a, ab}, {"worker", wk, wb}} {
		if e := decode[apitype.ErrorBody](t, []byte(r.body)); r.code != 503 || e.Error.Code != apitype.CodeUnavailable ||
			!strings.Contains(e.Error.Message, "refuses writes") {
			t.Errorf("%s /readyz with redis at maxmemory: %d %s", r.who, r.code, r.body)
		}
	}
	if err := s.RDB.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if a, wk, ab, wb := probe(); a != 200 || wk != 200 {
		t.Errorf("/readyz once redis takes writes: api %d %s, worker %d %s", a, ab, wk, wb)
	}
}
