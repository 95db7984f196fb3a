package api_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// refusalsDoc is the table of every refusal the API may answer.
const refusalsDoc = "../../docs/refusals.md"

// refusal is one kind of refusal: its status, its code and whether it
// comes with Retry-After.
type refusal struct {
	status int
	code   string
	retry  bool
}

func (r refusal) String() string {
	return fmt.Sprintf("%d %s (Retry-After %v)", r.status, r.code, r.retry)
}

// refusalTable reads docs/refusals.md's table: status and code, and the
// Retry-After column.
func refusalTable(t *testing.T) map[[2]string]bool {
	t.Helper()
	raw, err := os.ReadFile(refusalsDoc)
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `(\\d{3})` \\| `([a-z_]+)` \\| .* \\| (yes|no) \\|$")
	table := map[[2]string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			k := [2]string{m[1], m[2]}
			if _, dup := table[k]; dup {
				t.Errorf("%s lists %s %s twice", refusalsDoc, m[1], m[2])
			}
			table[k] = m[3] == "yes"
		}
	}
	if len(table) < 10 {
		t.Fatalf("%s: %d rows read, want the whole table", refusalsDoc, len(table))
	}
	return table
}

// refusals records what the API answered, refusal by refusal, with where
// each was first seen.
type refusals struct {
	t    *testing.T
	seen map[refusal]string
}

// note records an answer; a 2xx or 3xx is no refusal. A refusal without
// the error body fails the test.
func (r *refusals) note(where string, status int, body []byte, h http.Header) {
	r.t.Helper()
	if status < 400 {
		return
	}
	var e apitype.ErrorBody
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
		r.t.Errorf("%s: %d without the error body: %.200s", where, status, body)
		return
	}
	k := refusal{status, e.Error.Code, h.Get("Retry-After") != ""}
	if _, ok := r.seen[k]; !ok {
		r.seen[k] = where
	}
}

// TestRefusalsMatchTheTable walks every route's refusals and holds them
// to docs/refusals.md: each answer of 4xx or 5xx must be a status and
// code of the table, with Retry-After exactly when its row says so, and
// each row must be produced. Every route is asked without a key, with the
// wrong kind of key, with an unknown query parameter, an unknown ID, with
// the methods it does not serve and with Redis stopped; the refusals
// particular to some routes are provoked one by one.
func TestRefusalsMatchTheTable(t *testing.T) {
	t.Parallel()
	table := refusalTable(t)
	r := &refusals{t: t, seen: map[refusal]string{}}
	const (
		tenant = "refusals-tenant-key-0123"
		ops    = "refusals-operator-key-0123"
	)
	s := stacktest.Start(t, stacktest.Options{
		Env: map[string]string{"LOG_LEVEL": "warn", "KEY_PREFIX": "refuse:"},
		APIEnv: map[string]string{"API_KEYS": "alice:" + tenant, "OPERATOR_KEYS": "ops:" + ops,
			"AUTH_FAILURES_PER_MINUTE": "100000", "RATE_LIMIT_PER_SECOND": "10000", "RATE_LIMIT_BURST": "10000",
			"SIGN_INS_PER_KEY_PER_MINUTE": "10000", "SIGN_INS_PER_ADDR_PER_MINUTE": "10000"},
		LogOut: stacktest.Logs(t),
	})
	do := func(where, key, method, path string, body any, header ...string) (int, []byte) {
		t.Helper()
		code, b, h := s.DoAs(key, method, path, body, header...)
		r.note(where, code, b, h)
		return code, b
	}
	// A task and a batch of alice's, pending (no worker).
	code, b := do("submit", tenant, "POST", "/v1/tasks", sample8)
	if code != http.StatusAccepted {
		t.Fatalf("submit: %d %s", code, b)
	}
	task := stacktest.Decode[apitype.Task](t, b)
	code, b = do("batch", tenant, "POST", "/v1/batches", `{"tasks":[`+sample8+`]}`)
	if code != http.StatusAccepted {
		t.Fatalf("batch: %d %s", code, b)
	}
	var batch struct{ ID string }
	if err := json.Unmarshal(b, &batch); err != nil || batch.ID == "" {
		t.Fatalf("batch: %s", b)
	}

	routes := s.API.Routes()
	served := map[string][]string{} // path -> methods
	for _, rt := range routes {
		m, p, _ := strings.Cut(rt, " ")
		served[p] = append(served[p], m)
	}
	bodyOf := func(method, path string) any {
		if method != "POST" {
			return nil
		}
		if strings.HasPrefix(path, "/v1/batches") {
			return `{"tasks":[` + sample8 + `]}`
		}
		return sample8
	}
	concrete := func(path, id string) string { return strings.ReplaceAll(path, ":id", id) }
	realID := func(path string) string {
		if strings.HasPrefix(path, "/v1/batches/") {
			return batch.ID
		}
		return task.ID
	}
	walk := func(phase string, f func(method, path string)) {
		for _, rt := range routes {
			m, p, _ := strings.Cut(rt, " ")
			if strings.Contains(p, "*") {
				p = strings.Split(p, "*")[0]
			}
			f(m, p)
		}
		_ = phase
	}
	walk("keys", func(m, p string) {
		path := concrete(p, realID(p))
		do(rt(m, p, "no key"), "", m, path, bodyOf(m, p))
		do(rt(m, p, "a wrong key"), "not-a-key-0123456789", m, path, bodyOf(m, p))
		do(rt(m, p, "the operator key"), ops, m, path, bodyOf(m, p))
		if !strings.HasPrefix(p, "/v1/") {
			do(rt(m, p, "the tenant key"), tenant, m, path, bodyOf(m, p))
		}
	})
	walk("v1", func(m, p string) {
		if !strings.HasPrefix(p, "/v1/") || m == "DELETE" {
			return // the DELETEs are asked below, on their own task and batch
		}
		q := "?bogus=1"
		if strings.Contains(p, "?") {
			q = "&bogus=1"
		}
		do(rt(m, p, "an unknown parameter"), tenant, m, concrete(p, realID(p))+q, bodyOf(m, p))
		if strings.Contains(p, ":id") {
			do(rt(m, p, "an unknown ID"), tenant, m, concrete(p, "0000000000000000000000zz"), bodyOf(m, p))
		}
	})
	for p, ms := range served {
		if !strings.HasPrefix(p, "/v1/") {
			continue
		}
		for _, m := range []string{"GET", "POST", "DELETE", "PUT", "PATCH"} {
			if !slices.Contains(ms, m) {
				do(rt(m, p, "a method it does not serve"), tenant, m, concrete(p, realID(p)), bodyOf(m, p))
			}
		}
	}
	do("an unknown route", tenant, "GET", "/v1/nope", nil)

	// The refusals of some routes only.
	do("POST /v1/tasks, a broken rule", tenant, "POST", "/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,1,3],[4,2,5],[7,8,6]]}}`)
	do("POST /v1/tasks, too large a board", tenant, "POST", "/v1/tasks",
		`{"kind":"sweep","puzzle":{"board":[`+strings.TrimSuffix(strings.Repeat(`"`+strings.Repeat(".", 31)+`",`, 31), ",")+`]}}`)
	do("POST /v1/tasks, bad JSON", tenant, "POST", "/v1/tasks", `{"kind":`)
	do("POST /v1/tasks, a body over MAX_BODY_BYTES", tenant, "POST", "/v1/tasks", strings.Repeat(" ", 2<<20))
	do("DELETE /v1/tasks/:id", tenant, "DELETE", "/v1/tasks/"+task.ID, nil)
	do("DELETE /v1/tasks/:id, ended", tenant, "DELETE", "/v1/tasks/"+task.ID, nil)
	do("GET /v1/batches/:id/output, unfinished", tenant, "GET", "/v1/batches/"+batch.ID+"/output", nil)
	do("DELETE /v1/batches/:id", tenant, "DELETE", "/v1/batches/"+batch.ID, nil)
	do("DELETE /v1/batches/:id, ended", tenant, "DELETE", "/v1/batches/"+batch.ID, nil)
	one := `{"tasks":[` + sample8 + `]}`
	do("POST /v1/batches, an Idempotency-Key", tenant, "POST", "/v1/batches", one, "Idempotency-Key", "refusals-1")
	do("POST /v1/batches, the Idempotency-Key with another body", tenant, "POST", "/v1/batches", `{"tasks":[`+sample8+`,`+sample8+`]}`, "Idempotency-Key", "refusals-1")
	// A claim whose batch never commits: a request still in progress,
	// as the same body's retry sees it.
	sum := sha256.Sum256([]byte("json\n" + one))
	if ok, _, _, err := s.Store.ClaimIdempotency(context.Background(), "alice", "refusals-2", "0000000000000000000000zz", hex.EncodeToString(sum[:])); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	do("POST /v1/batches, the Idempotency-Key of a request in progress", tenant, "POST", "/v1/batches", one, "Idempotency-Key", "refusals-2")

	// A task that ended on its own: too late to cancel.
	s.AddWorker(nil)
	_, b = do("submit", tenant, "POST", "/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[0,7,8]]}}`)
	solved := stacktest.Decode[apitype.Task](t, b)
	for end := time.Now().Add(30 * time.Second); solved.State != apitype.TaskStateCompleted; {
		if time.Now().After(end) {
			t.Fatalf("task %s: %s after 30 s, want completed", solved.ID, solved.State)
		}
		_, b = do("poll", tenant, "GET", "/v1/tasks/"+solved.ID+"?wait=5s", nil)
		solved = stacktest.Decode[apitype.Task](t, b)
	}
	do("DELETE /v1/tasks/:id, ended on its own", tenant, "DELETE", "/v1/tasks/"+solved.ID, nil)

	tightRefusals(t, r, tenant)

	// Redis stopped: every route that reads or writes it.
	s.Redis.Stop()
	walk("redis", func(m, p string) {
		if strings.HasPrefix(p, "/v1/") {
			do(rt(m, p, "Redis stopped"), tenant, m, concrete(p, realID(p)), bodyOf(m, p))
		}
	})

	var got []string
	for k, where := range r.seen {
		got = append(got, k.String())
		want, ok := table[[2]string{fmt.Sprint(k.status), k.code}]
		switch {
		case !ok:
			t.Errorf("%s answered %d %s, which %s does not list", where, k.status, k.code, refusalsDoc)
		case want != k.retry:
			t.Errorf("%s answered %s; %s says Retry-After %v", where, k, refusalsDoc, want)
		}
	}
	for k, retry := range table {
		found := false
		for s := range r.seen {
			found = found || (fmt.Sprint(s.status) == k[0] && s.code == k[1])
		}
		if !found {
			t.Errorf("%s lists %s %s (Retry-After %v), which no request produced", refusalsDoc, k[0], k[1], retry)
		}
	}
	slices.Sort(got)
	t.Logf("%d kinds of refusal seen: %s", len(got), strings.Join(got, "; "))
}

// rt names a request of the walk.
func rt(method, path, what string) string { return method + " " + path + ", " + what }

// tightRefusals provokes, on a stack of tight limits, the refusals of a
// key at its limits: its unfinished tasks, its request rate, and a body
// too slow to arrive.
func tightRefusals(t *testing.T, r *refusals, tenant string) {
	t.Helper()
	s := stacktest.Start(t, stacktest.Options{
		Env: map[string]string{"LOG_LEVEL": "warn", "KEY_PREFIX": "tight:"},
		APIEnv: map[string]string{"API_KEYS": "alice:" + tenant, "MAX_PENDING_PER_KEY": "1",
			"RATE_LIMIT_PER_SECOND": "1", "RATE_LIMIT_BURST": "6", "BODY_READ_TIMEOUT": "1s"},
		LogOut: stacktest.Logs(t),
	})
	do := func(where, method, path string, body any) {
		t.Helper()
		code, b, h := s.DoAs(tenant, method, path, body)
		r.note(where, code, b, h)
	}
	// A body that stops: 408.
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"kind\"", tenant)
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("a stalled body: %v", err)
	}
	raw := make([]byte, 4096)
	n, _ := resp.Body.Read(raw)
	resp.Body.Close()
	r.note("POST /v1/tasks, a body that stops", resp.StatusCode, raw[:n], resp.Header)
	// One unfinished task is the quota; then the rate.
	do("POST /v1/tasks", "POST", "/v1/tasks", sample8)
	do("POST /v1/tasks, past MAX_PENDING_PER_KEY", "POST", "/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`)
	for range 10 {
		do("GET /v1/tasks, past the rate", "GET", "/v1/tasks", nil)
	}
}
