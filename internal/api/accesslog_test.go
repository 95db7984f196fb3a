package api_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// accessLines returns the access log lines (msg "request") in logs.
func accessLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		if m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

// Every request gets one access log line with its route, method, status,
// bytes, duration, key and request ID, the ID the answer carries; no
// credential the requests sent (a bearer key, a key posted to sign in, a
// session cookie) appears anywhere in the logs, nor an ID or query of
// the URL.
func TestAccessLogHasTheFieldsAndNoSecret(t *testing.T) {
	t.Parallel()
	logs := stacktest.Logs(t)
	s := stacktest.Start(t, stacktest.Options{LogOut: logs, Env: map[string]string{
		"API_KEYS": "alice:" + aliceUIKey + ",bob:" + bobUIKey, "LOG_LEVEL": "info", "LOG_FORMAT": "json"}})

	type req struct {
		key, method, path, body, route, owner string
		header                                []string
		status                                int
	}
	reqs := []req{
		{aliceUIKey, "POST", "/v1/tasks", sample8, "/v1/tasks", "alice", nil, 202},
		{bobUIKey, "GET", "/v1/tasks/0123456789abcdef0123456789abcdef", "", "/v1/tasks/:id", "bob", nil, 404},
		{"", "GET", "/v1/batches?secret-in-query=" + bobUIKey, "", "/v1/batches", "", nil, 400},
		{"wrong-key-" + aliceUIKey, "GET", "/v1/batches", "", "/v1/batches", "", nil, 401},
		{"", "POST", api.SessionPath, `{"key":"` + aliceUIKey + `"}`, api.SessionPath, "", []string{api.UIHeader, "1", api.RequestIDHeader, "from-the-proxy:42"}, 200},
		{"", "GET", "/no/such/route", "", "unmatched", "", []string{api.RequestIDHeader, "bad id\twith a tab"}, 404},
	}
	var ids []string
	var cookie string
	for _, r := range reqs {
		var body any
		if r.body != "" {
			body = r.body
		}
		code, b, hdr := s.DoAs(r.key, r.method, r.path, body, r.header...)
		if code != r.status {
			t.Fatalf("%s %s: %d %s, want %d", r.method, r.path, code, b, r.status)
		}
		id := hdr.Get(api.RequestIDHeader)
		if id == "" {
			t.Fatalf("%s %s: no %s in the answer", r.method, r.path, api.RequestIDHeader)
		}
		ids = append(ids, id)
		for _, c := range (&http.Response{Header: hdr}).Cookies() {
			if c.Name == api.SessionCookie {
				cookie = c.Value
			}
		}
	}
	if ids[4] != "from-the-proxy:42" {
		t.Errorf("a fit request ID sent by the client answered as %q, want it kept", ids[4])
	}
	if strings.ContainsAny(ids[5], " \t") {
		t.Errorf("an unfit request ID sent by the client was kept: %q", ids[5])
	}
	// The cookie authenticates a read: its line names alice.
	code, b, hdr := s.DoH("GET", "/v1/batches", nil, "Cookie", api.SessionCookie+"="+cookie)
	if code != 200 || cookie == "" {
		t.Fatalf("GET with the session cookie: %d %s", code, b)
	}
	reqs = append(reqs, req{method: "GET", route: "/v1/batches", owner: "alice", status: 200})
	ids = append(ids, hdr.Get(api.RequestIDHeader))

	lines := accessLines(t, logs.String())
	byID := map[string]map[string]any{}
	for _, l := range lines {
		id, _ := l["request_id"].(string)
		if _, dup := byID[id]; dup {
			t.Errorf("two access log lines for request %s", id)
		}
		byID[id] = l
	}
	for i, r := range reqs {
		l, ok := byID[ids[i]]
		if !ok {
			t.Errorf("%s %s (request %s): no access log line", r.method, r.path, ids[i])
			continue
		}
		if l["route"] != r.route || l["method"] != r.method || l["status"] != float64(r.status) || l["key_id"] != r.owner {
			t.Errorf("%s %s: line %v, want route %s, status %d, key_id %q", r.method, r.path, l, r.route, r.status, r.owner)
		}
		if n, ok := l["bytes"].(float64); !ok || n <= 0 {
			t.Errorf("%s %s: bytes %v, want the answer's size", r.method, r.path, l["bytes"])
		}
		if _, ok := l["duration_ms"].(float64); !ok {
			t.Errorf("%s %s: no duration_ms in %v", r.method, r.path, l)
		}
	}
	all := logs.String()
	for _, secret := range []string{aliceUIKey, bobUIKey, cookie, "secret-in-query", "0123456789abcdef0123456789abcdef"} {
		if strings.Contains(all, secret) {
			t.Errorf("the logs hold %q", secret)
		}
	}
}

// ACCESS_LOG_EVERY=5 logs one request in five.
func TestAccessLogSampled(t *testing.T) {
	t.Parallel()
	logs := stacktest.Logs(t)
	s := stacktest.Start(t, stacktest.Options{LogOut: logs, Env: map[string]string{
		"LOG_LEVEL": "info", "ACCESS_LOG_EVERY": "5"}})
	base := len(accessLines(t, logs.String())) // readiness probes
	for range 100 {
		if code, _ := s.Do("GET", "/healthz", nil); code != 200 {
			t.Fatal(code)
		}
	}
	if n := len(accessLines(t, logs.String())) - base; n < 19 || n > 21 {
		t.Errorf("100 requests with ACCESS_LOG_EVERY=5 logged %d lines, want 20", n)
	}
}
