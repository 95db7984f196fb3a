package api_test

import (
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/app"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

const (
	tenantKey = "tenant-key-0123456789"
	opsKey    = "operator-key-0123456789"
	ops2Key   = "operator-key-2-0123456789"
)

// operatorStack runs an API with a tenant and two operators, and env.
func operatorStack(t *testing.T, env map[string]string) *stacktest.Stack {
	t.Helper()
	e := map[string]string{"API_KEYS": "alice:" + tenantKey, "OPERATOR_KEYS": "ops:" + opsKey + ",ops2:" + ops2Key}
	for k, v := range env {
		e[k] = v
	}
	return stacktest.StartWith(t, 0, e)
}

// wantCode fails t unless the answer has status want and, for an error,
// the error shape with code.
func wantCode(t *testing.T, what string, code int, b []byte, want int, errCode string) {
	t.Helper()
	if code != want {
		t.Errorf("%s: %d %.200s, want %d", what, code, b, want)
		return
	}
	if errCode != "" {
		if e := decode[apitype.ErrorBody](t, b); e.Error.Code != errCode || e.Error.Message == "" {
			t.Errorf("%s: body %s, want code %s", what, b, errCode)
		}
	}
}

// TestOperatorRoutesRefuseTenants: the dashboard, its Redis INFO and
// /metrics need an operator key and refuse a tenant's; an operator key
// in turn opens nothing on /v1.
func TestOperatorRoutesRefuseTenants(t *testing.T) {
	t.Parallel()
	s := operatorStack(t, nil)
	for _, p := range []string{app.MonitoringPath, app.MonitoringPath + "api/queues", app.MonitoringPath + "api/redis_info", "/metrics"} {
		code, b, hdr := s.DoAs("", "GET", p, nil)
		wantCode(t, "no key on "+p, code, b, 401, apitype.CodeUnauthorized)
		if hdr.Get("WWW-Authenticate") == "" {
			t.Errorf("no key on %s: no WWW-Authenticate", p)
		}
		code, b, _ = s.DoAs(tenantKey, "GET", p, nil)
		wantCode(t, "tenant key on "+p, code, b, 403, apitype.CodeForbidden)
		if strings.Contains(string(b), "redis_version") || strings.Contains(string(b), "go_goroutines") {
			t.Errorf("tenant key on %s: the body leaks: %.200s", p, b)
		}
		code, b, _ = s.DoAs(opsKey, "GET", p, nil)
		wantCode(t, "operator key on "+p, code, b, 200, "")
	}
	code, b, _ := s.DoAs(opsKey, "GET", app.MonitoringPath+"api/redis_info", nil)
	if code != 200 || !strings.Contains(string(b), "redis_version") {
		t.Errorf("operator reads Redis INFO: %d %.200s", code, b)
	}
	code, b, _ = s.DoAs(opsKey, "POST", "/v1/tasks", sample8)
	wantCode(t, "operator key on /v1", code, b, 403, apitype.CodeForbidden)
	code, b, _ = s.DoAs(tenantKey, "POST", "/v1/tasks", sample8)
	wantCode(t, "tenant key on /v1", code, b, 202, "")
}

// TestOperatorRoutesClosedWithoutOperatorKeys: tenant keys and no
// operator key close the operator routes to everyone.
func TestOperatorRoutesClosedWithoutOperatorKeys(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:" + tenantKey})
	for _, p := range []string{app.MonitoringPath + "api/queues", "/metrics"} {
		code, b, _ := s.DoAs(tenantKey, "GET", p, nil)
		wantCode(t, "tenant key on "+p, code, b, 403, apitype.CodeForbidden)
	}
}

// TestDashboardPageSizeCapped: asynqmon would hold any page in memory
// (four size=100000 pages took an API to 3.8 GB); past 100 it is 400.
func TestDashboardPageSizeCapped(t *testing.T) {
	t.Parallel()
	s := operatorStack(t, nil)
	// Some pending tasks, so the lists have something to page through.
	for i := range 3 {
		if code, b, _ := s.DoAs(tenantKey, "POST", "/v1/tasks", `{"kind":"sweep","puzzle":{"board":["`+strings.Repeat(".", i+4)+`"]}}`); code != 202 {
			t.Fatalf("submit: %d %s", code, b)
		}
	}
	base := app.MonitoringPath + "api/queues/interactive/pending_tasks"
	for _, tc := range []struct {
		query, field string
		want         int
	}{
		{"?size=100000", "size", 400}, {"?size=101", "size", 400}, {"?size=0", "size", 400}, {"?size=-5", "size", 400},
		{"?size=abc", "size", 400}, {"?size=10&size=100000", "size", 400}, {"?page=0", "page", 400},
		{"?page=99999999999999999999", "page", 400}, {"?size=100&page=1", "", 200}, {"?size=20&page=1000000", "", 200}, {"", "", 200},
	} {
		code, b, _ := s.DoAs(opsKey, "GET", base+tc.query, nil)
		if tc.want == 200 {
			wantCode(t, tc.query, code, b, 200, "")
			continue
		}
		wantCode(t, tc.query, code, b, 400, apitype.CodeInvalidRequest)
		if e := decode[apitype.ErrorBody](t, b); e.Error.Field != tc.field {
			t.Errorf("%s: field %q, want %q", tc.query, e.Error.Field, tc.field)
		}
	}
	code, b, _ := s.DoAs(opsKey, "GET", base+"?size=100", nil)
	if code != 200 || strings.Count(string(b), `"id"`) != 3 {
		t.Errorf("the 3 pending tasks at size=100: %d %.300s", code, b)
	}
	// asynqmon's Prometheus proxy has no Prometheus: 404, not its 500.
	code, b, _ = s.DoAs(opsKey, "GET", app.MonitoringPath+"api/metrics", nil)
	wantCode(t, "api/metrics", code, b, 404, apitype.CodeNotFound)
}

// TestDashboardRateLimited: 300 dashboard requests as fast as 8 clients
// can send them; the operator's bucket (10/s, burst 30 by default) lets
// through what it allows and answers the rest 429 with the error shape
// and Retry-After. Another operator's bucket is untouched.
func TestDashboardRateLimited(t *testing.T) {
	t.Parallel()
	s := operatorStack(t, nil)
	const n, clients = 300, 8
	var ok, limited, other atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range clients {
		wg.Go(func() {
			for range next {
				code, b, hdr := s.DoAs(opsKey, "GET", app.MonitoringPath+"api/queues", nil)
				switch {
				case code == 200:
					ok.Add(1)
				case code == 429 && hdr.Get("Retry-After") != "" && decode[apitype.ErrorBody](t, b).Error.Code == apitype.CodeRateLimited:
					limited.Add(1)
				default:
					other.Add(1)
					t.Errorf("dashboard request: %d %v %.200s", code, hdr, b)
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	// At most the burst plus the refill over the run (and one in flight).
	most := int64(30 + 10*el.Seconds() + 2)
	t.Logf("FIGURES dashboard: %d requests in %v: %d answered, %d rate-limited (429), at most %d allowed",
		n, el.Round(time.Millisecond), ok.Load(), limited.Load(), most)
	if ok.Load() > most || limited.Load() == 0 || ok.Load()+limited.Load() != n {
		t.Errorf("%d answered, %d limited of %d; want at most %d answered", ok.Load(), limited.Load(), n, most)
	}
	if code, b, _ := s.DoAs(ops2Key, "GET", app.MonitoringPath+"api/queues", nil); code != 200 {
		t.Errorf("another operator after the flood: %d %s", code, b)
	}
	if code, b, _ := s.DoAs(tenantKey, "GET", "/v1/tasks/"+zeroID, nil); code != 404 {
		t.Errorf("a tenant after the flood: %d %s", code, b)
	}
}

// TestDashboardCanBeTurnedOff: MONITORING=false serves no dashboard.
func TestDashboardCanBeTurnedOff(t *testing.T) {
	t.Parallel()
	s := operatorStack(t, map[string]string{"MONITORING": "false"})
	code, b, _ := s.DoAs(opsKey, "GET", app.MonitoringPath+"api/queues", nil)
	wantCode(t, "dashboard off", code, b, 404, apitype.CodeNotFound)
	code, b, _ = s.DoAs(opsKey, "GET", "/metrics", nil)
	wantCode(t, "metrics with the dashboard off", code, b, 200, "")
}

// TestAuthFailuresRateLimited: past AUTH_FAILURES_PER_MINUTE failed
// attempts an address is answered 429 (error shape, Retry-After) for
// everything, a valid key too, on /v1 and the operator routes alike, so
// a guess that hits cannot be told from one that missed.
func TestAuthFailuresRateLimited(t *testing.T) {
	t.Parallel()
	s := operatorStack(t, map[string]string{"AUTH_FAILURES_PER_MINUTE": "10"})
	// A valid key costs nothing against the limit.
	for range 20 {
		if code, b, _ := s.DoAs(tenantKey, "GET", "/v1/tasks/"+zeroID, nil); code != 404 {
			t.Fatalf("valid key: %d %s", code, b)
		}
	}
	var unauthorized, limited int
	for i := range 30 {
		key, path := "wrong-key-0123456789", "/v1/tasks/"+zeroID
		if i%3 == 1 {
			key, path = "", app.MonitoringPath+"api/queues"
		}
		code, b, hdr := s.DoAs(key, "GET", path, nil)
		switch code {
		case 401:
			unauthorized++
		case 429:
			limited++
			wantCode(t, "over the failure limit", code, b, 429, apitype.CodeRateLimited)
			if hdr.Get("Retry-After") == "" {
				t.Errorf("429 without Retry-After")
			}
		default:
			t.Errorf("failed attempt %d: %d %s", i, code, b)
		}
	}
	t.Logf("FIGURES auth failures: 30 failed attempts at AUTH_FAILURES_PER_MINUTE=10: %d answered 401, %d answered 429", unauthorized, limited)
	if unauthorized < 10 || unauthorized > 11 || limited != 30-unauthorized {
		t.Errorf("%d answered 401 and %d 429; want 10 (or 11, one refilled) 401s and the rest 429", unauthorized, limited)
	}
	for _, k := range []struct{ key, path string }{{tenantKey, "/v1/tasks/" + zeroID}, {opsKey, app.MonitoringPath + "api/queues"}} {
		code, b, _ := s.DoAs(k.key, "GET", k.path, nil)
		wantCode(t, "a valid key from the refused address", code, b, 429, apitype.CodeRateLimited)
	}
	// Probes stay open.
	if code, _ := s.Do("GET", "/readyz", nil); code != 200 {
		t.Errorf("readyz from the refused address: %d", code)
	}
}

// TestAuthFailuresSharedAcrossReplicas: the failed-authentication count
// lives in Redis, so API replicas on one Redis share it: 30 wrong keys
// sent round-robin to two replicas at AUTH_FAILURES_PER_MINUTE=10 get
// the same 10 401s one replica would give (a count per process would
// give 20), and a third replica that never saw the address refuses its
// first attempt, a valid key included.
func TestAuthFailuresSharedAcrossReplicas(t *testing.T) {
	t.Parallel()
	env := map[string]string{"AUTH_FAILURES_PER_MINUTE": "10"}
	a := operatorStack(t, env)
	replica := func() *stacktest.Stack {
		e := map[string]string{"REDIS_URL": a.Redis.URL()}
		maps.Copy(e, env)
		s := operatorStack(t, e)
		s.WaitReady()
		return s
	}
	replicas := []*stacktest.Stack{a, replica()}
	codes := map[int]int{}
	per := make([]map[int]int, len(replicas))
	for i := range 30 {
		r := i % len(replicas)
		code, b, hdr := replicas[r].DoAs("wrong-key-0123456789", "GET", "/v1/tasks/"+zeroID, nil)
		codes[code]++
		if per[r] == nil {
			per[r] = map[int]int{}
		}
		per[r][code]++
		if code == 429 && hdr.Get("Retry-After") == "" {
			t.Errorf("429 without Retry-After: %s", b)
		}
	}
	t.Logf("FIGURES shared auth failures: 30 failed attempts over 2 replicas at AUTH_FAILURES_PER_MINUTE=10: %d answered 401, %d answered 429 (replica 1 %v, replica 2 %v)",
		codes[401], codes[429], per[0], per[1])
	if codes[401] < 10 || codes[401] > 11 || codes[429] != 30-codes[401] {
		t.Errorf("codes %v; want 10 (or 11, one refilled) 401s over both replicas and the rest 429", codes)
	}
	if per[0][429] == 0 || per[1][429] == 0 {
		t.Errorf("each replica should refuse the address: %v, %v", per[0], per[1])
	}
	c := replica()
	code, b, _ := c.DoAs(tenantKey, "GET", "/v1/tasks/"+zeroID, nil)
	if code != 404 { // a valid key is checked before the count is
		t.Errorf("valid key on a third replica before any failure there: %d %s", code, b)
	}
	code, b, _ = c.DoAs("wrong-key-0123456789", "GET", "/v1/tasks/"+zeroID, nil)
	wantCode(t, "first failed attempt on a third replica", code, b, 429, apitype.CodeRateLimited)
	code, b, _ = c.DoAs(tenantKey, "GET", "/v1/tasks/"+zeroID, nil)
	wantCode(t, "a valid key on the third replica once it refused the address", code, b, 429, apitype.CodeRateLimited)
}

// TestOperatorRoutesOpenWithoutKeys: with no key configured at all (the
// quick start), the dashboard and /metrics are open, as /v1 is, but still
// rate limited per client address.
func TestOperatorRoutesOpenWithoutKeys(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, map[string]string{"OPERATOR_RATE_LIMIT_PER_SECOND": "1", "OPERATOR_RATE_LIMIT_BURST": "3"})
	codes := map[int]int{}
	for range 10 {
		code, _ := s.Do("GET", app.MonitoringPath+"api/queues", nil)
		codes[code]++
	}
	if codes[200] < 3 || codes[200] > 4 || codes[http.StatusTooManyRequests] != 10-codes[200] {
		t.Errorf("10 anonymous dashboard requests at 1/s burst 3: %v", codes)
	}
}

// TestOperatorBrowserSignIn: a browser cannot send a bearer header, so the
// dashboard has a sign-in form: the operator key posted once sets a
// signed, HttpOnly, SameSite=Strict session cookie on /monitoring/, which
// then opens the dashboard (and nothing on /v1). Tenant and wrong keys
// are refused; a forged cookie is a failed authentication.
func TestOperatorBrowserSignIn(t *testing.T) {
	t.Parallel()
	s := operatorStack(t, nil)
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path, body string, header ...string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, s.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	login := app.MonitoringPath + "login"
	if resp, b := do("GET", login, ""); resp.StatusCode != 200 || !strings.Contains(b, `name="key"`) {
		t.Errorf("GET %s: %d %.200s", login, resp.StatusCode, b)
	}
	if resp, _ := do("GET", app.MonitoringPath, "", "Accept", "text/html"); resp.StatusCode != 303 || resp.Header.Get("Location") != login {
		t.Errorf("a browser without a session: %d to %q, want 303 to %s", resp.StatusCode, resp.Header.Get("Location"), login)
	}
	form := "Content-Type"
	for _, tc := range []struct {
		key  string
		want int
	}{{"wrong-key-0123456789", 401}, {tenantKey, 403}} {
		if resp, b := do("POST", login, "key="+tc.key, form, "application/x-www-form-urlencoded"); resp.StatusCode != tc.want || len(resp.Cookies()) != 0 {
			t.Errorf("sign in with %q: %d %v %.200s, want %d and no cookie", tc.key, resp.StatusCode, resp.Cookies(), b, tc.want)
		}
	}
	resp, b := do("POST", login, "key="+opsKey, form, "application/x-www-form-urlencoded")
	var sess *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == api.OperatorCookie {
			sess = ck
		}
	}
	if resp.StatusCode != 303 || sess == nil || !sess.HttpOnly || sess.SameSite != http.SameSiteStrictMode || sess.Path != app.MonitoringPath {
		t.Fatalf("sign in: %d %v %.200s, want 303 and an HttpOnly, SameSite=Strict cookie on %s", resp.StatusCode, resp.Cookies(), b, app.MonitoringPath)
	}
	if strings.Contains(sess.Value, opsKey) {
		t.Errorf("the session cookie holds the key")
	}
	cookie := sess.Name + "=" + sess.Value
	for _, p := range []string{app.MonitoringPath, app.MonitoringPath + "api/queues"} {
		if resp, b := do("GET", p, "", "Cookie", cookie, "Accept", "text/html"); resp.StatusCode != 200 {
			t.Errorf("GET %s signed in: %d %.200s", p, resp.StatusCode, b)
		}
	}
	if resp, b := do("GET", "/v1/tasks/"+zeroID, "", "Cookie", cookie); resp.StatusCode != 401 {
		t.Errorf("the operator session on /v1: %d %.200s, want 401", resp.StatusCode, b)
	}
	forged := sess.Name + "=" + sess.Value[:len(sess.Value)-2] + "xx"
	if resp, b := do("GET", app.MonitoringPath+"api/queues", "", "Cookie", forged); resp.StatusCode != 401 {
		t.Errorf("a forged session: %d %.200s, want 401", resp.StatusCode, b)
	}
}
