package deploy_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/app"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/tasks"
)

// stack is a running API and worker on one real Redis, with tasks done in
// both queues.
type stack struct {
	apiURL, workerURL string
}

func startStack(t *testing.T, extraAPIEnv map[string]string) *stack {
	t.Helper()
	st := stacktest.Start(t, stacktest.Options{Workers: 1, Env: map[string]string{"LOG_LEVEL": "error"}, APIEnv: extraAPIEnv})
	s := &stack{apiURL: st.URL, workerURL: "http://" + st.Workers[0].Addr()}
	waitOK(t, s.workerURL+"/readyz")
	return s
}

// TestMonitoringNeedsAnOperatorKey: with API keys configured the
// dashboard needs an operator key, and refuses a tenant's.
func TestMonitoringNeedsAnOperatorKey(t *testing.T) {
	s := startStack(t, map[string]string{"API_KEYS": "alice:tenant-key-for-tests", "OPERATOR_KEYS": "ops:s3cret-key-for-tests"})
	for _, tc := range []struct {
		auth string
		want int
	}{{"", http.StatusUnauthorized}, {"Bearer wrong-key-for-tests", http.StatusUnauthorized},
		{"Bearer tenant-key-for-tests", http.StatusForbidden}, {"Bearer s3cret-key-for-tests", http.StatusOK}} {
		req, _ := http.NewRequest(http.MethodGet, s.apiURL+app.MonitoringPath+"api/queues", nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %sapi/queues with %q: %s, want %d", app.MonitoringPath, tc.auth, resp.Status, tc.want)
		}
	}
}

var (
	metricRe  = regexp.MustCompile(`\b(?:puzzleq|asynq)_[a-z_]+\b`)
	byRe      = regexp.MustCompile(`\bby \(([^)]*)\)`)
	sampleRe  = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
	labelRe   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	wantShown = []string{"puzzleq_http_requests_total", "puzzleq_http_request_duration_seconds_bucket",
		"puzzleq_submitted_total", "puzzleq_api_cache_hits_total", "puzzleq_tasks_total",
		"puzzleq_worker_cache_hits_total", "puzzleq_solve_duration_seconds_bucket",
		"asynq_queue_size", "asynq_queue_latency_seconds", "asynq_tasks_processed_total", "asynq_tasks_failed_total"}
)

// scrape returns the metric names a /metrics endpoint exposes, with the
// label names each carries.
func scrape(t *testing.T, url string) map[string]map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := sampleRe.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if out[m[1]] == nil {
			out[m[1]] = map[string]bool{}
		}
		for _, l := range labelRe.FindAllStringSubmatch(m[2], -1) {
			out[m[1]][l[1]] = true
		}
	}
	return out
}

// TestGrafanaDashboard checks every query of deploy/grafana against the
// metrics a running API and worker really expose, label names included.
func TestGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("grafana", "puzzleq.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Fatal("the dashboard needs a uid and a title")
	}

	s := startStack(t, nil)
	stacktest.SolveSome(t, s.apiURL)
	exposed := scrape(t, s.apiURL+"/metrics")
	for name, labels := range scrape(t, s.workerURL+"/metrics") {
		if exposed[name] == nil {
			exposed[name] = map[string]bool{}
		}
		for l := range labels {
			exposed[name][l] = true
		}
	}

	shown := map[string]bool{}
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			names := metricRe.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q uses none of our metrics", p.Title, tg.Expr)
			}
			for _, n := range names {
				shown[n] = true
				if exposed[n] == nil {
					t.Errorf("panel %q: %s is not exposed by the API or the worker", p.Title, n)
				}
			}
			for _, by := range byRe.FindAllStringSubmatch(tg.Expr, -1) {
				for _, l := range strings.Split(by[1], ",") {
					l = strings.TrimSpace(l)
					ok := false
					for _, n := range names {
						ok = ok || exposed[n][l]
					}
					if !ok {
						t.Errorf("panel %q: groups by %q, a label none of %v carries", p.Title, l, names)
					}
				}
			}
		}
	}
	for _, n := range wantShown {
		if !shown[n] {
			t.Errorf("the dashboard does not chart %s", n)
		}
	}
}

// TestMonitoringEmbedded: without REDIS_URL the dashboard reads the
// API's in-memory Redis, so it shows the tasks the embedded worker ran.
func TestMonitoringEmbedded(t *testing.T) {
	st := stacktest.Start(t, stacktest.Options{Env: map[string]string{"REDIS_URL": ""}})
	if !st.API.Embedded() {
		t.Fatal("not embedded")
	}
	base := st.URL
	waitOK(t, base+"/readyz")

	resp, err := http.Post(base+"/v1/tasks", "application/json",
		strings.NewReader(`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[0,7,8]]}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit: %s", resp.Status)
	}
	resp, err = http.Get(base + app.MonitoringPath + "api/queues")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Queues []struct {
			Queue string `json:"queue"`
		} `json:"queues"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %sapi/queues: %s %v", app.MonitoringPath, resp.Status, err)
	}
	var names []string
	for _, q := range body.Queues {
		names = append(names, q.Queue)
	}
	if !strings.Contains(strings.Join(names, ","), tasks.QueueCheap) {
		t.Errorf("embedded dashboard lists queues %v, want %s among them", names, tasks.QueueCheap)
	}
}
