package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// The tests in this file hold the API to internal/api/openapi.yaml: the
// document is valid, its routes and the server's are the same, and every
// answer of the real stack (API and worker processes on a real Redis) to
// the requests below matches it, status included.

// loadDoc loads and validates the committed document.
func loadDoc(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	return doc
}

func TestOpenAPIDocumentIsValid(t *testing.T) {
	doc := loadDoc(t)
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi = %q, want 3.x", doc.OpenAPI)
	}
	if doc.Components == nil || doc.Components.SecuritySchemes["bearerAuth"] == nil {
		t.Errorf("the bearerAuth security scheme is not declared")
	}
	// Every error answer of every operation is an ErrorBody.
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for code, ref := range op.Responses.Map() {
				if code[0] != '4' && code[0] != '5' {
					continue
				}
				mt := ref.Value.Content.Get("application/json")
				if mt == nil || mt.Schema == nil || mt.Schema.Ref != "#/components/schemas/ErrorBody" {
					t.Errorf("%s %s %s: the error answer is not an ErrorBody", method, path, code)
				}
			}
		}
	}
}

// startDocStack starts the API (internal/stacktest) on a real Redis with
// the settings below and extra over them; its logs are printed if the test
// fails. extra may set REDIS_URL: "" for the embedded mode.
func startDocStack(t *testing.T, extra map[string]string) *stacktest.Stack {
	t.Helper()
	return stacktest.Start(t, stacktest.Options{
		Env:    map[string]string{"SHUTDOWN_TIMEOUT": "2s", "LOG_LEVEL": "warn", "KEY_PREFIX": "oapi:", "WORKER_CONCURRENCY": "2"},
		APIEnv: extra, LogOut: stacktest.Logs(t),
	})
}

// Every /v1 route, and every probe, refuses a query parameter it does not
// take with 400 naming it, as the document promises: a misspelt filter
// must not silently list everything. A route left out of the server's
// table of parameters would take anything.
func TestEveryRouteRefusesUnknownQueryParams(t *testing.T) {
	s := startDocStack(t, nil)
	n := 0
	for _, r := range s.API.Routes() {
		method, path, _ := strings.Cut(r, " ")
		if method == http.MethodHead || !(strings.HasPrefix(path, "/v1/") || slices.Contains([]string{"/healthz", "/readyz", "/openapi.yaml", "/history"}, path)) {
			continue
		}
		n++
		code, b := s.Do(method, strings.ReplaceAll(path, ":id", unknownID)+"?zzz=1", nil)
		var e apitype.ErrorBody
		if err := json.Unmarshal(b, &e); code != http.StatusBadRequest || err != nil || e.Error.Field != "zzz" {
			t.Errorf("%s ?zzz=1: %d %.200s, want 400 naming zzz", r, code, b)
		}
	}
	if n < 20 {
		t.Errorf("checked %d routes, want every /v1 route and the probes", n)
	}
}

// ginPath turns an OpenAPI path into the server's route syntax.
func ginPath(p string) string {
	return strings.NewReplacer("{id}", ":id").Replace(p)
}

func TestOpenAPIRoutesMatchServer(t *testing.T) {
	doc := loadDoc(t)
	a := startDocStack(t, nil).API

	served := map[string]bool{}
	for _, r := range a.Routes() {
		served[r] = true
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		if strings.Contains(strings.ReplaceAll(path, "{id}", ""), "{") {
			t.Errorf("path %s has a parameter other than {id}; teach ginPath about it", path)
		}
		for method := range item.Operations() {
			route := method + " " + ginPath(path)
			documented[route] = true
			if !served[route] {
				t.Errorf("the document has %s %s, which the server does not serve", method, path)
			}
		}
	}
	var v1 int
	for route := range served {
		_, path, _ := strings.Cut(route, " ")
		if strings.HasPrefix(path, "/v1/") {
			v1++
			if !documented[route] {
				t.Errorf("the server serves %s, which the document lacks", route)
			}
		}
	}
	// The check above must have had something to check.
	if v1 != 17 || len(documented) < 22 {
		t.Errorf("served %d /v1 routes and documented %d in all, want 17 and at least 22: %v", v1, len(documented), a.Routes())
	}
	for _, r := range []string{"GET /healthz", "GET /readyz", "GET /metrics", "GET /openapi.yaml"} {
		if !documented[r] {
			t.Errorf("%s is not documented", r)
		}
	}
}

// client sends requests to one server and validates every exchange
// against the document.
type client struct {
	t      *testing.T
	doc    *openapi3.T
	router routers.Router
	base   string
	http   *http.Client
	seen   *statusLog
}

// statusLog records the statuses each documented operation answered.
type statusLog struct {
	mu sync.Mutex
	m  map[string]map[int]bool // "GET /v1/tasks/{id}" -> statuses
}

func (l *statusLog) add(op string, status int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m[op] == nil {
		l.m[op] = map[int]bool{}
	}
	l.m[op][status] = true
}

// elsewhere names the operations that TestOpenAPIConformance cannot take
// to a 2xx (it runs without API keys), and the test that does.
var elsewhere = map[string]string{"POST /ui/session": "TestOpenAPIAuth"}

// checkCoverage fails the test unless every documented operation answered
// a 2xx (here, or in the test elsewhere names), and logs the documented
// statuses that were never seen.
func (c *client) checkCoverage(t *testing.T) {
	t.Helper()
	c.seen.mu.Lock()
	defer c.seen.mu.Unlock()
	for path, item := range c.doc.Paths.Map() {
		for method, op := range item.Operations() {
			name := method + " " + path
			got := c.seen.m[name]
			if elsewhere[name] == "" && !slices.ContainsFunc(slices.Collect(maps.Keys(got)), func(s int) bool { return s/100 == 2 }) {
				t.Errorf("%s was never exercised successfully", name)
			}
			var missing []string
			for code := range op.Responses.Map() {
				var n int
				// 429, 500 and 503 cannot be provoked on a healthy server
				// with auth off; TestOpenAPIUnavailable covers 503.
				if _, err := fmt.Sscan(code, &n); err == nil && !got[n] && n != 429 && n != 500 && n != 503 {
					missing = append(missing, code)
				}
			}
			if len(missing) > 0 {
				slices.Sort(missing)
				t.Logf("%s: documented statuses not exercised here: %v", name, missing)
			}
		}
	}
}

func newClient(t *testing.T, doc *openapi3.T, addr string) *client {
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("router: %v", err)
	}
	return &client{t: t, doc: doc, router: router, base: "http://" + addr, http: &http.Client{Timeout: 20 * time.Second},
		seen: &statusLog{m: map[string]map[int]bool{}}}
}

// reqCheck says what the document must say of a request.
type reqCheck int

const (
	reqValid   reqCheck = iota // the document accepts it
	reqInvalid                 // the document rejects it (the server did too)
	reqSkip                    // not checked (an oversized body)
)

type call struct {
	method, path string
	body         []byte
	contentType  string // default application/json when body is set
	chunked      bool   // send without Content-Length
	accept       string // Accept header, optional
	header       map[string]string
	want         int
	req          reqCheck
}

type reply struct {
	status int
	header http.Header
	body   []byte
	took   time.Duration
}

// json decodes the reply into a generic value.
func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("reply is not a JSON object: %v: %s", err, r.body)
	}
	return v
}

// errorOf returns the error member of an error reply.
func (r reply) errorOf(t *testing.T) map[string]any {
	t.Helper()
	e, ok := r.json(t)["error"].(map[string]any)
	if !ok {
		t.Fatalf("reply has no error object: %s", r.body)
	}
	return e
}

func (c *client) newRequest(k call) *http.Request {
	var body io.Reader
	if k.body != nil {
		body = bytes.NewReader(k.body)
		if k.chunked {
			body = struct{ io.Reader }{body} // hides the length
		}
	}
	req, err := http.NewRequest(k.method, c.base+k.path, body)
	if err != nil {
		c.t.Fatalf("%s %s: %v", k.method, k.path, err)
	}
	if k.body != nil {
		ct := k.contentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	if k.accept != "" {
		req.Header.Set("Accept", k.accept)
	}
	for h, v := range k.header {
		req.Header.Set(h, v)
	}
	return req
}

// do sends the call, checks its status and validates request and response
// against the document.
func (c *client) do(k call) reply {
	c.t.Helper()
	start := time.Now()
	resp, err := c.http.Do(c.newRequest(k))
	if err != nil {
		c.t.Fatalf("%s %s: %v", k.method, k.path, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		c.t.Fatalf("%s %s: read body: %v", k.method, k.path, err)
	}
	r := reply{status: resp.StatusCode, header: resp.Header, body: body, took: time.Since(start)}
	if r.status != k.want {
		c.t.Fatalf("%s %s: status %d, want %d: %s", k.method, k.path, r.status, k.want, body)
	}

	// Validate against the document with a fresh copy of the request.
	vreq := c.newRequest(k)
	route, params, err := c.router.FindRoute(vreq)
	if err != nil {
		c.t.Fatalf("%s %s: no operation in the document: %v", k.method, k.path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
		Options: &openapi3filter.Options{MultiError: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	switch verr := openapi3filter.ValidateRequest(context.Background(), in); {
	case k.req == reqValid && verr != nil:
		c.t.Errorf("%s %s: the server took a request the document rejects: %v", k.method, k.path, verr)
	case k.req == reqInvalid && verr == nil:
		c.t.Errorf("%s %s: the server rejected (%d) a request the document accepts", k.method, k.path, r.status)
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: r.status, Header: r.header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		c.t.Errorf("%s %s: %d reply does not match the document: %v\nbody: %s", k.method, k.path, r.status, err, body)
	}
	c.seen.add(route.Method+" "+route.Path, r.status)
	return r
}

// undocumented sends a request that no operation covers and checks its
// error body against the ErrorBody schema.
func (c *client) undocumented(method, path string, want int, wantCode string) {
	c.t.Helper()
	req := c.newRequest(call{method: method, path: path})
	if _, _, err := c.router.FindRoute(req); err == nil {
		c.t.Fatalf("%s %s is documented", method, path)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		c.t.Fatalf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, want, body)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		c.t.Fatalf("%s %s: body is not JSON: %s", method, path, body)
	}
	if err := c.doc.Components.Schemas["ErrorBody"].Value.VisitJSON(v); err != nil {
		c.t.Errorf("%s %s: body is not an ErrorBody: %v: %s", method, path, err, body)
	}
	if code := v.(map[string]any)["error"].(map[string]any)["code"]; code != wantCode {
		c.t.Errorf("%s %s: code %v, want %s", method, path, code, wantCode)
	}
}

// wantError checks the code and, when field is not "", the field of an
// error reply; a field ending in "*" is a prefix.
func wantError(t *testing.T, r reply, code, field string) {
	t.Helper()
	e := r.errorOf(t)
	if e["code"] != code {
		t.Errorf("error code %v, want %s: %s", e["code"], code, r.body)
	}
	if field == "" {
		return
	}
	got, _ := e["field"].(string)
	if p, ok := strings.CutSuffix(field, "*"); ok {
		if !strings.HasPrefix(got, p) {
			t.Errorf("error field %q, want prefix %q: %s", got, p, r.body)
		}
	} else if got != field {
		t.Errorf("error field %q, want %q: %s", got, field, r.body)
	}
}

func wantEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// wantJSON compares a JSON value with the JSON text want.
func wantJSON(t *testing.T, what string, got any, want string) {
	t.Helper()
	var w any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(w)
	if !bytes.Equal(gb, wb) {
		t.Errorf("%s = %s, want %s", what, gb, wb)
	}
}

const (
	sample    = `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`
	sampleRes = `{"moves":3,"solvable":true,"path":"DRD"}`
	unknownID = "0123456789abcdef0123456789abcdef"
	boj9944In = "5 5\n**...\n.....\n....*\n..*..\n.....\n3 4\n****\n****\n....\n"
	p84021In  = `{"game_board": [[1,1,0],[1,1,0],[0,0,0]], "table": [[1,1,1],[0,0,1],[0,0,1]]}`
	sweepTask = `{"kind":"sweep","puzzle":{"board":["..","*.","*."]},"options":{"max_nodes":1000000}}`
	// pendingSweep is another sweep, for the batches that only show the
	// pending states: once a worker runs them their answers are cached
	// (sweeps are searches), and sweepTask must still be a miss later.
	pendingSweep = `{"kind":"sweep","puzzle":{"board":["...","*..","*.."]}}`
	fillTask     = `{"kind":"fill","puzzle":{"game_board":[[1,1,0],[1,1,0],[0,0,0]],"table":[[1,1,1],[0,0,1],[0,0,1]]},"options":{"allow_flip":true}}`
	maxBodySize  = 4096
)

// protobufMetrics is the Accept header of a Prometheus scrape that
// prefers the protobuf format. kin-openapi has no decoder for it, so the
// tests treat it as opaque bytes.
const protobufMetrics = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"

func init() {
	openapi3filter.RegisterBodyDecoder("application/vnd.google.protobuf", openapi3filter.FileBodyDecoder)
	openapi3filter.RegisterBodyDecoder("application/x-ndjson", ndjsonDecoder)
	openapi3filter.RegisterBodyDecoder("text/event-stream", sseDecoder)
}

// sseDecoder holds every event of a text/event-stream answer (/events) to
// the document's schema, which describes one event by its fields (event,
// id, and data as JSON), and hands the validator the first event. A block
// without an event name (the stream's opening retry:) is not an event.
func sseDecoder(body io.Reader, _ http.Header, schema *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	var first any
	for _, block := range strings.Split(string(b), "\n\n") {
		ev := map[string]any{}
		for _, line := range strings.Split(block, "\n") {
			field, value, _ := strings.Cut(line, ": ")
			switch field {
			case "event", "id":
				ev[field] = value
			case "data":
				var v any
				if err := json.Unmarshal([]byte(value), &v); err != nil {
					return nil, fmt.Errorf("event data %q: %w", value, err)
				}
				ev[field] = v
			}
		}
		if ev["event"] == nil {
			continue
		}
		if err := schema.Value.VisitJSON(ev); err != nil {
			return nil, fmt.Errorf("event %v: %w", ev["event"], err)
		}
		if first == nil {
			first = ev
		}
	}
	if first == nil {
		return nil, fmt.Errorf("no event in the stream: %q", b)
	}
	return first, nil
}

// sseEvents splits a text/event-stream body into its events, holding each
// one's data to the document's schema of its kind, and returns the events'
// names, ids ("" for none) and data.
func sseEvents(t *testing.T, doc *openapi3.T, body []byte) (names, ids []string, data []map[string]any) {
	t.Helper()
	schemas := map[string]string{"progress": "BatchProgress", "done": "BatchProgress", "item": "ItemEvent"}
	for _, block := range strings.Split(string(body), "\n\n") {
		var name, id, d string
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, "event: "):
				name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "id: "):
				id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				d = strings.TrimPrefix(line, "data: ")
			}
		}
		if name == "" {
			continue
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(d), &v); err != nil {
			t.Fatalf("event %s: data %q: %v", name, d, err)
		}
		sch := doc.Components.Schemas[schemas[name]]
		if sch == nil {
			t.Fatalf("event %q has no schema", name)
		}
		if err := sch.Value.VisitJSON(map[string]any(v)); err != nil {
			t.Errorf("event %s: %s: %v", name, d, err)
		}
		names, ids, data = append(names, name), append(ids, id), append(data, v)
	}
	return names, ids, data
}

// ndjsonDecoder holds every line of an NDJSON answer (/results) to the
// document's schema, which describes one line, and hands the validator the
// first line. An empty answer has no line to hand it, so the requests
// below never ask for one.
func ndjsonDecoder(body io.Reader, h http.Header, schema *openapi3.SchemaRef, enc openapi3filter.EncodingFn) (any, error) {
	if schema.Value.Type.Is("string") {
		// A request body documented as text (POST /v1/batches' NDJSON
		// upload, whose lines the server itself validates).
		return openapi3filter.PlainBodyDecoder(body, h, schema, enc)
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		return nil, fmt.Errorf("an NDJSON answer must be lines, each ended by a newline; got %d bytes", len(b))
	}
	var first any
	for i, line := range bytes.Split(b[:len(b)-1], []byte("\n")) {
		var v any
		if err := json.Unmarshal(line, &v); err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		if err := schema.Value.VisitJSON(v); err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		if i == 0 {
			first = v
		}
	}
	return first, nil
}

func TestOpenAPIConformance(t *testing.T) {
	doc := loadDoc(t)
	st := startDocStack(t, map[string]string{
		"MAX_BODY_BYTES": fmt.Sprint(maxBodySize), "MAX_BATCH_BODY_BYTES": "65536", "CHUNK_SIZE": "2",
		"MAX_BATCH_ITEMS": "5",
	})
	a := st.API
	c := newClient(t, doc, a.Addr())

	t.Run("operations", func(t *testing.T) {
		c := *c
		c.t = t
		wantEqual(t, "healthz", c.do(call{method: "GET", path: "/healthz", want: 200}).json(t)["status"], "ok")
		wantEqual(t, "readyz", c.do(call{method: "GET", path: "/readyz", want: 200}).json(t)["status"], "ready")
		m := c.do(call{method: "GET", path: "/metrics", want: 200})
		if !bytes.Contains(m.body, []byte("puzzleq_http_requests_total")) {
			t.Errorf("/metrics lacks the API's metrics")
		}
		// Prometheus may ask for the protobuf format.
		pb := c.do(call{method: "GET", path: "/metrics", want: 200, accept: protobufMetrics})
		if ct := pb.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/vnd.google.protobuf") {
			t.Errorf("/metrics in protobuf: Content-Type %q", ct)
		}
		y := c.do(call{method: "GET", path: "/openapi.yaml", want: 200})
		if !bytes.Equal(y.body, api.OpenAPI) {
			t.Errorf("/openapi.yaml is not the embedded document")
		}
		wantError(t, c.do(call{method: "GET", path: "/healthz?verbose=1", want: 400}), "invalid_request", "verbose")
		// The dashboard's sign-in, without API keys: no one to sign in.
		ui := map[string]string{"X-Puzzleq-UI": "1"}
		wantJSON(t, "session", c.do(call{method: "GET", path: "/ui/session", want: 200}).json(t),
			`{"auth":false,"name":"","expires_at":null}`)
		wantError(t, c.do(call{method: "POST", path: "/ui/session", body: []byte(`{"key":"k"}`), header: ui, want: 409}), "conflict", "")
		wantError(t, c.do(call{method: "DELETE", path: "/ui/session", want: 403, req: reqInvalid}), "forbidden", "X-Puzzleq-UI")
		c.do(call{method: "DELETE", path: "/ui/session", header: ui, want: 200})
		c.undocumented("GET", "/v1/nope", 404, "not_found")
		c.undocumented("PUT", "/v1/tasks/"+unknownID, 405, "method_not_allowed")
		c.undocumented("POST", "/v1/batches/"+unknownID+"/output", 405, "method_not_allowed")
	})

	// No worker runs yet, so tasks stay pending: this is when a long poll
	// must time out and a cancel must succeed.
	var pendingTask string
	t.Run("pending", func(t *testing.T) {
		c := *c
		c.t = t
		r := c.do(call{method: "POST", path: "/v1/tasks", body: []byte(sample), want: 202})
		task := r.json(t)
		pendingTask, _ = task["id"].(string)
		wantEqual(t, "Location", r.header.Get("Location"), "/v1/tasks/"+pendingTask)
		wantEqual(t, "state", task["state"], "pending")
		wantEqual(t, "cached", task["cached"], false)

		r = c.do(call{method: "GET", path: "/v1/tasks/" + pendingTask, want: 200})
		wantEqual(t, "state", r.json(t)["state"], "pending")
		r = c.do(call{method: "GET", path: "/v1/tasks/" + pendingTask + "?wait=300ms", want: 200})
		wantEqual(t, "state after a wait", r.json(t)["state"], "pending")
		if r.took < 250*time.Millisecond {
			t.Errorf("?wait=300ms on a pending task answered after %s", r.took)
		}

		r = c.do(call{method: "DELETE", path: "/v1/tasks/" + pendingTask, want: 200})
		task = r.json(t)
		wantEqual(t, "state", task["state"], "canceled")
		wantJSON(t, "error", task["error"], `{"code":"canceled","message":"canceled by request"}`)
		// A retried cancel (its answer lost) succeeds as the first did.
		r = c.do(call{method: "DELETE", path: "/v1/tasks/" + pendingTask, want: 200})
		wantEqual(t, "state on a repeated cancel", r.json(t)["state"], "canceled")
		// A single task is deleted once it has ended; a batch item
		// cannot be on its own.
		gone := c.do(call{method: "POST", path: "/v1/tasks", body: []byte(pendingSweep), want: 202}).json(t)["id"].(string)
		wantError(t, c.do(call{method: "DELETE", path: "/v1/tasks/" + gone + "?purge=true", want: 409}), "conflict", "purge")
		c.do(call{method: "DELETE", path: "/v1/tasks/" + gone, want: 200})
		wantError(t, c.do(call{method: "DELETE", path: "/v1/tasks/" + gone + "-0?purge=true", want: 400}), "invalid_request", "purge")
		c.do(call{method: "DELETE", path: "/v1/tasks/" + gone + "?purge=true", want: 204})
		c.do(call{method: "GET", path: "/v1/tasks/" + gone, want: 404})

		r = c.do(call{method: "POST", path: "/v1/batches", want: 202, contentType: "application/x-ndjson",
			body: []byte(`{"custom_id":"first",` + sample[1:] + "\n" + pendingSweep + "\n")})
		wantEqual(t, "NDJSON total", r.json(t)["total"], 2)
		r = c.do(call{method: "POST", path: "/v1/batches", want: 202,
			body: []byte(`{"tasks":[` + sample + `,` + pendingSweep + `,` + fillTask + `]}`)})
		b := r.json(t)
		id, _ := b["id"].(string)
		wantEqual(t, "Location", r.header.Get("Location"), "/v1/batches/"+id)
		wantEqual(t, "total", b["total"], 3)
		r = c.do(call{method: "GET", path: "/v1/batches/" + id, want: 200})
		wantEqual(t, "done", r.json(t)["done"], false)
		wantEqual(t, "format", r.json(t)["format"], nil)
		wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + id + "/output", want: 409}), "incomplete", "")
		r = c.do(call{method: "GET", path: "/v1/batches/" + id + "/output?wait=200ms", want: 409})
		if r.took < 150*time.Millisecond {
			t.Errorf("output ?wait=200ms on a pending batch answered after %s", r.took)
		}
		r = c.do(call{method: "DELETE", path: "/v1/batches/" + id, want: 200})
		wantEqual(t, "canceled", r.json(t)["canceled"], 3)
		r = c.do(call{method: "DELETE", path: "/v1/batches/" + id, want: 200})
		wantEqual(t, "canceled by a repeated cancel", r.json(t)["canceled"], 0)
		r = c.do(call{method: "GET", path: "/v1/batches/" + id, want: 200})
		wantJSON(t, "counts", r.json(t)["counts"], `{"pending":0,"active":0,"completed":0,"failed":0,"canceled":3}`)
		// Ended by the cancel, it can be deleted.
		wantError(t, c.do(call{method: "DELETE", path: "/v1/batches/" + id + "?purge=maybe", want: 400, req: reqInvalid}), "invalid_request", "purge")
		c.do(call{method: "DELETE", path: "/v1/batches/" + id + "?purge=true", want: 204})
		c.do(call{method: "GET", path: "/v1/batches/" + id, want: 404})
	})

	t.Run("errors", func(t *testing.T) {
		c := *c
		c.t = t
		post := func(path, body string, want int, rc reqCheck) reply {
			t.Helper()
			return c.do(call{method: "POST", path: path, body: []byte(body), want: want, req: rc})
		}
		wantError(t, post("/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"optoins":{}}`, 400, reqInvalid),
			"invalid_request", "optoins")
		wantError(t, post("/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]],"size":3}}`, 400, reqInvalid),
			"invalid_request", "puzzle.size")
		wantError(t, post("/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"allow_flip":true}}`, 400, reqInvalid),
			"invalid_request", "options.allow_flip")
		wantError(t, post("/v1/tasks", `{"kind":"sliding","puzzle":{"board":"123"}}`, 400, reqInvalid),
			"invalid_request", "puzzle.board")
		wantError(t, post("/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"max_nodes":-1}}`, 400, reqInvalid),
			"invalid_request", "options.max_nodes")
		wantError(t, post("/v1/tasks", `{"kind":"chess","puzzle":{"board":[]}}`, 400, reqInvalid), "invalid_request", "kind")
		wantError(t, post("/v1/tasks", `{"puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`, 400, reqInvalid), "invalid_request", "kind")
		wantError(t, post("/v1/tasks", `{"kind":"sliding"`, 400, reqInvalid), "invalid_request", "")
		wantError(t, post("/v1/tasks", `{"kind":"sweep","puzzle":{"board":["..x"]}}`, 400, reqInvalid), "invalid_puzzle", "puzzle.board*")
		wantError(t, post("/v1/tasks", `{"kind":"fill","puzzle":{"game_board":[[0,2]],"table":[[1,1]]}}`, 400, reqInvalid),
			"invalid_puzzle", "puzzle.game_board*")
		// Rules beyond a schema: the document accepts these, the solver does not.
		wantError(t, post("/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,1,3],[4,2,5],[7,8,6]]}}`, 400, reqValid),
			"invalid_puzzle", "puzzle.board*")
		// 5x5 is beyond the sliding solver's limit of 16 cells.
		wantError(t, post("/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,2,3,4,5],[6,7,8,9,10],[11,12,13,14,15],[16,17,18,19,20],[21,22,23,24,0]]}}`, 400, reqValid),
			"too_large", "puzzle.board*")

		wantError(t, post("/v1/batches", `{"tasks":[]}`, 400, reqInvalid), "invalid_request", "tasks")
		wantError(t, post("/v1/batches", `{}`, 400, reqInvalid), "invalid_request", "tasks")
		wantError(t, post("/v1/batches", `{"tasks":[`+sample+`,{"kind":"sliding","puzzle":{}}]}`, 400, reqInvalid),
			"invalid_puzzle", "tasks[1].puzzle.board")
		wantError(t, post("/v1/batches", `{"tasks":[`+sample+`],"priority":1}`, 400, reqInvalid), "invalid_request", "priority")
		// Over MAX_BATCH_ITEMS, which this server sets below the documented default.
		wantError(t, post("/v1/batches", `{"tasks":[`+strings.Repeat(sample+",", 5)+sample+`]}`, 400, reqValid), "too_large", "tasks")
		// NDJSON: the document takes any text; the server names the line.
		nd := func(body string) call {
			return call{method: "POST", path: "/v1/batches", body: []byte(body), contentType: "application/x-ndjson", want: 400}
		}
		wantError(t, c.do(nd(sample+"\n"+`{"kind":"sliding","puzzle":{}}`+"\n")), "invalid_puzzle", "puzzle.board")
		wantError(t, c.do(nd(`{"custom_id":"a",`+sample[1:]+"\n"+`{"custom_id":"a",`+sample[1:]+"\n")), "invalid_request", "custom_id")
		wantError(t, c.do(nd(strings.Repeat(sample+"\n", 6))), "too_large", "")
		wantError(t, c.do(call{method: "POST", path: "/v1/batches?format=boj1234", body: []byte("1 2 3\n"),
			contentType: "text/plain", want: 400, req: reqInvalid}), "invalid_request", "format")
		wantError(t, c.do(call{method: "POST", path: "/v1/batches?format=boj1525", body: []byte("1 0 3\n4 2\n7 8 6\n"),
			contentType: "text/plain", want: 400}), "invalid_puzzle", "body*")
		wantError(t, c.do(call{method: "POST", path: "/v1/batches?format=boj9944", body: []byte("2 5\n.....\n....\n"),
			contentType: "text/plain", want: 400}), "invalid_puzzle", "body*")

		// 36028797018963998 seconds overflows time.Duration to exactly 30s.
		for _, q := range []string{"wait=soon", "wait=-1s", "wait=2h", "wait=61", "wait=36028797018963998"} {
			wantError(t, c.do(call{method: "GET", path: "/v1/tasks/" + unknownID + "?" + q, want: 400}), "invalid_request", "wait")
			wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + unknownID + "/output?" + q, want: 400}), "invalid_request", "wait")
		}
		wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + unknownID + "?limit=0", want: 400, req: reqInvalid}), "invalid_request", "limit")
		wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + unknownID + "?limit=1001", want: 400, req: reqInvalid}), "invalid_request", "limit")
		wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + unknownID + "?cursor=-1", want: 400, req: reqInvalid}), "invalid_request", "cursor")

		for _, k := range []call{
			{method: "GET", path: "/v1/tasks/" + unknownID},
			{method: "GET", path: "/v1/tasks/not-an-id", req: reqInvalid},
			{method: "GET", path: "/v1/tasks/" + unknownID + "/puzzle"},
			{method: "GET", path: "/v1/tasks/" + unknownID + "-0/puzzle"},
			// A single task's puzzle is not kept.
			{method: "GET", path: "/v1/tasks/" + pendingTask + "/puzzle"},
			{method: "DELETE", path: "/v1/tasks/" + unknownID},
			{method: "GET", path: "/v1/batches/" + unknownID},
			{method: "GET", path: "/v1/batches/" + strings.ToUpper(unknownID), req: reqInvalid},
			{method: "DELETE", path: "/v1/batches/" + unknownID},
			{method: "GET", path: "/v1/batches/" + unknownID + "/output"},
			// A task ID is not a batch ID.
			{method: "GET", path: "/v1/batches/" + pendingTask},
		} {
			k.want = 404
			wantError(t, c.do(k), "not_found", "")
		}

		big := []byte(`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}` + strings.Repeat(" ", maxBodySize))
		wantError(t, c.do(call{method: "POST", path: "/v1/tasks", body: big, want: 413, req: reqSkip}), "body_too_large", "")
		wantError(t, c.do(call{method: "POST", path: "/v1/tasks", body: big, chunked: true, want: 413, req: reqSkip}), "body_too_large", "")
		bigBatch := []byte(`{"tasks":[` + strings.Repeat(sample+",", 65536/len(sample)) + sample + `]}`)
		wantError(t, c.do(call{method: "POST", path: "/v1/batches", body: bigBatch, want: 413, req: reqSkip}), "body_too_large", "")
	})

	st.AddWorker(nil)

	t.Run("tasks", func(t *testing.T) {
		c := *c
		c.t = t
		// solve submits body, expects 202, and long-polls the task until it
		// ends.
		solve := func(body string) map[string]any {
			t.Helper()
			r := c.do(call{method: "POST", path: "/v1/tasks", body: []byte(body), want: 202})
			loc := r.header.Get("Location")
			r = c.do(call{method: "GET", path: loc + "?wait=10s", want: 200})
			task := r.json(t)
			if task["state"] == "pending" || task["state"] == "active" {
				t.Fatalf("task %s did not end within the wait: %s", loc, r.body)
			}
			// The long poll is woken by the task's end, not by the
			// periodic re-read (every 5s).
			if r.took > 4*time.Second {
				t.Errorf("the long poll answered %s after the task ended", r.took)
			}
			return task
		}
		task := solve(sample)
		wantEqual(t, "state", task["state"], "completed")
		wantJSON(t, "result", task["result"], sampleRes)
		wantEqual(t, "error", task["error"], nil)
		wantEqual(t, "cached", task["cached"], false)
		if task["started_at"] == nil || task["completed_at"] == nil || task["attempts"].(float64) < 1 {
			t.Errorf("a completed task lacks started_at, completed_at or attempts: %v", task)
		}
		wantError(t, c.do(call{method: "DELETE", path: "/v1/tasks/" + task["id"].(string), want: 409}), "conflict", "")

		// The same puzzle again is a cache hit: 200, completed, cached.
		r := c.do(call{method: "POST", path: "/v1/tasks", body: []byte(sample), want: 200})
		hit := r.json(t)
		wantEqual(t, "cached", hit["cached"], true)
		wantEqual(t, "state", hit["state"], "completed")
		wantJSON(t, "result", hit["result"], sampleRes)
		if hit["id"] == task["id"] {
			t.Errorf("a cache hit reused the task ID")
		}
		r = c.do(call{method: "GET", path: "/v1/tasks/" + hit["id"].(string), want: 200})
		wantEqual(t, "cached on read", r.json(t)["cached"], true)

		// The canceled task stays canceled once a worker runs.
		r = c.do(call{method: "GET", path: "/v1/tasks/" + pendingTask, want: 200})
		wantEqual(t, "canceled task", r.json(t)["state"], "canceled")

		task = solve(`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[8,7,0]]},"options":null}`)
		wantJSON(t, "unsolvable sliding", task["result"], `{"moves":-1,"solvable":false,"path":""}`)
		task = solve(sweepTask)
		wantJSON(t, "sweep", task["result"], `{"moves":2,"start":[0,0],"path":"RD"}`)
		task = solve(`{"kind":"sweep","puzzle":{"board":[".*."]}}`)
		wantEqual(t, "unsolvable sweep", task["state"], "completed")
		wantEqual(t, "unsolvable sweep start", task["result"].(map[string]any)["start"], nil)
		task = solve(fillTask)
		wantEqual(t, "fill filled", task["result"].(map[string]any)["filled"], 5)
		task = solve(`{"kind":"fill","puzzle":{"game_board":[[0,0,0],[1,1,0],[1,1,1]],"table":[[1,1,1],[1,0,0],[0,0,0]]},"options":{"allow_flip":true}}`)
		pl := task["result"].(map[string]any)["placements"].([]any)
		if len(pl) != 1 || pl[0].(map[string]any)["flipped"] != true {
			t.Errorf("a mirrored placement is not flipped: %v", pl)
		}
		task = solve(`{"kind":"sweep","puzzle":{"board":[".....",".....","....."]},"options":{"max_nodes":1}}`)
		wantEqual(t, "over budget", task["state"], "failed")
		if e, _ := task["error"].(map[string]any); e == nil || e["code"] != "budget_exceeded" {
			t.Errorf("over budget: error %v, want code budget_exceeded", task["error"])
		}
	})

	t.Run("batches", func(t *testing.T) {
		c := *c
		c.t = t
		items := []string{sample, sweepTask, fillTask,
			`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`,
			`{"kind":"sliding","puzzle":{"board":[[1,2],[0,3]]}}`}
		r := c.do(call{method: "POST", path: "/v1/batches", want: 202,
			body: []byte(`{"tasks":[` + strings.Join(items, ",") + `]}`)})
		created := r.json(t)
		id := created["id"].(string)
		wantEqual(t, "Location", r.header.Get("Location"), "/v1/batches/"+id)
		wantEqual(t, "total", created["total"], len(items))

		r = c.do(call{method: "GET", path: "/v1/batches/" + id + "?wait=10s&limit=2", want: 200})
		b := r.json(t)
		if b["done"] != true {
			t.Fatalf("batch not done after ?wait=10s: %s", r.body)
		}
		wantJSON(t, "counts", b["counts"], `{"pending":0,"active":0,"completed":5,"failed":0,"canceled":0}`)
		// Each item's puzzle reads back as submitted, its options in
		// canonical form.
		for i, item := range items {
			var sub struct{ Kind, Puzzle, Options any }
			if err := json.Unmarshal([]byte(item), &sub); err != nil {
				t.Fatal(err)
			}
			pz := c.do(call{method: "GET", path: "/v1/tasks/" + id + "-" + fmt.Sprint(i) + "/puzzle", want: 200}).json(t)
			wantEqual(t, "puzzle id", pz["id"], id+"-"+fmt.Sprint(i))
			wantEqual(t, "puzzle kind", pz["kind"], sub.Kind)
			wantJSON(t, "puzzle", pz["puzzle"], mustJSON(t, sub.Puzzle))
			if sub.Options != nil {
				wantJSON(t, "options", pz["options"], mustJSON(t, sub.Options))
			} else if _, ok := pz["options"].(map[string]any); !ok {
				t.Errorf("item %d: options %v, want an object", i, pz["options"])
			}
		}
		wantError(t, c.do(call{method: "GET", path: "/v1/tasks/" + id + "-" + fmt.Sprint(len(items)) + "/puzzle", want: 404}), "not_found", "")
		if b["done_at"] == nil {
			t.Errorf("a done batch has no done_at")
		}
		var seen []any
		for page := 0; ; page++ {
			tasks := b["tasks"].([]any)
			if len(tasks) > 2 {
				t.Fatalf("page of %d tasks with limit=2", len(tasks))
			}
			for _, tk := range tasks {
				seen = append(seen, tk.(map[string]any)["id"])
				wantEqual(t, "batch_id", tk.(map[string]any)["batch_id"], id)
			}
			next := b["next_cursor"]
			if next == nil {
				break
			}
			if page > 5 {
				t.Fatalf("paging does not end")
			}
			b = c.do(call{method: "GET", path: "/v1/batches/" + id + "?limit=2&cursor=" + next.(string), want: 200}).json(t)
		}
		wantEqual(t, "paged task IDs", seen, created["task_ids"])
		// The first item was solved above as a single, but an 8-puzzle in
		// a batch is solved, not looked up: its table lookup costs less
		// than a cache round trip (docs/batches.md, "Stored once").
		first := c.do(call{method: "GET", path: "/v1/batches/" + id + "?limit=1", want: 200}).json(t)["tasks"].([]any)[0].(map[string]any)
		wantEqual(t, "cheap item cached", first["cached"], false)
		wantJSON(t, "cheap item result", first["result"], sampleRes)

		out := c.do(call{method: "GET", path: "/v1/batches/" + id + "/output", want: 200})
		lines := strings.Split(strings.TrimSuffix(string(out.body), "\n"), "\n")
		if len(lines) != len(items) || lines[0] != sampleRes {
			t.Errorf("JSON batch output:\n%s", out.body)
		}
		wantError(t, c.do(call{method: "DELETE", path: "/v1/batches/" + id, want: 409}), "conflict", "")

		// A batch with a failed item has no judge output.
		r = c.do(call{method: "POST", path: "/v1/batches", want: 202,
			body: []byte(`{"tasks":[` + sample + `,{"kind":"sweep","puzzle":{"board":[".....","....."]},"options":{"max_nodes":1}}]}`)})
		fid := r.json(t)["id"].(string)
		r = c.do(call{method: "GET", path: "/v1/batches/" + fid + "/output?wait=10s", want: 409})
		wantError(t, r, "incomplete", "")
		if msg, _ := r.errorOf(t)["message"].(string); !strings.Contains(msg, "/v1/batches/"+fid+"/results") {
			t.Errorf("the 409 of /output does not point to /results: %q", msg)
		}
		// /results lists every item, whatever its state, and filters.
		r = c.do(call{method: "GET", path: "/v1/batches/" + fid + "/results", want: 200})
		if rl := strings.Split(strings.TrimSuffix(string(r.body), "\n"), "\n"); len(rl) != 2 ||
			!strings.Contains(rl[0], `"state":"completed"`) || !strings.Contains(rl[1], `"state":"failed"`) {
			t.Errorf("results of a batch with a failed item:\n%s", r.body)
		}
		r = c.do(call{method: "GET", path: "/v1/batches/" + fid + "/results?state=failed&wait=1s", want: 200})
		if rl := strings.Split(strings.TrimSuffix(string(r.body), "\n"), "\n"); len(rl) != 1 || !strings.Contains(rl[0], `"index":1,`) {
			t.Errorf("results?state=failed:\n%s", r.body)
		}
		wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + fid + "/results?state=done", want: 400, req: reqInvalid}), "invalid_request", "state")
		wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + unknownID + "/results", want: 404}), "not_found", "")
		// /events of a done batch: its progress, every item, done.
		r = c.do(call{method: "GET", path: "/v1/batches/" + fid + "/events", want: 200})
		names, ids, _ := sseEvents(t, doc, r.body)
		if strings.Join(names, ",") != "progress,item,item,done" || ids[2] != "2" {
			t.Errorf("events of a done batch: %v %v\n%s", names, ids, r.body)
		}
		r = c.do(call{method: "GET", path: "/v1/batches/" + fid + "/events", want: 200, header: map[string]string{"Last-Event-ID": "1"}})
		if names, _, data := sseEvents(t, doc, r.body); strings.Join(names, ",") != "progress,item,done" || data[1]["index"] != 1.0 {
			t.Errorf("events from Last-Event-ID 1: %v\n%s", names, r.body)
		}
		wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + fid + "/events?from=x", want: 400, req: reqInvalid}), "invalid_request", "from")
		wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + unknownID + "/events", want: 404}), "not_found", "")
		b = c.do(call{method: "GET", path: "/v1/batches/" + fid, want: 200}).json(t)
		wantEqual(t, "failed count", b["counts"].(map[string]any)["failed"], 1)

		// The lists, the failed items and their retry (lists_test.go
		// covers them further).
		l := c.do(call{method: "GET", path: "/v1/batches?limit=1", want: 200}).json(t)
		wantEqual(t, "newest batch", l["batches"].([]any)[0].(map[string]any)["id"], fid)
		c.do(call{method: "GET", path: "/v1/batches?state=failed&kind=sweep&created_after=2026-01-01T00:00:00Z", want: 200})
		wantError(t, c.do(call{method: "GET", path: "/v1/batches?state=done", want: 400, req: reqInvalid}), "invalid_request", "state")
		wantError(t, c.do(call{method: "GET", path: "/v1/batches?stat=failed", want: 400}), "invalid_request", "stat")
		c.do(call{method: "GET", path: "/v1/tasks?state=completed&limit=5", want: 200})
		failedItems := c.do(call{method: "GET", path: "/v1/batches/" + fid + "/items?state=failed", want: 200}).json(t)
		wantEqual(t, "failed items", len(failedItems["tasks"].([]any)), 1)
		wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + unknownID + "/items", want: 404}), "not_found", "")
		wantError(t, c.do(call{method: "GET", path: "/v1/batches/" + fid + "/items?limit=0", want: 400, req: reqInvalid}), "invalid_request", "limit")
		// One item's retry (retryitem_test.go covers it further): the
		// completed one is a conflict, the failed one runs again, and
		// the batch's retry then finds it failed again.
		wantError(t, c.do(call{method: "POST", path: "/v1/tasks/" + fid + "-0/retry", want: 409}), "conflict", "")
		wantError(t, c.do(call{method: "POST", path: "/v1/tasks/" + unknownID + "-0/retry", want: 404}), "not_found", "")
		wantError(t, c.do(call{method: "POST", path: "/v1/tasks/" + fid + "-1/retry?x=1", want: 400}), "invalid_request", "x")
		wantEqual(t, "retried item", c.do(call{method: "POST", path: "/v1/tasks/" + fid + "-1/retry", want: 200}).json(t)["id"], fid+"-1")
		b = c.do(call{method: "GET", path: "/v1/batches/" + fid + "?wait=10s", want: 200}).json(t)
		wantEqual(t, "failed count after the item's retry", b["counts"].(map[string]any)["failed"], 1)
		wantJSON(t, "retry", c.do(call{method: "POST", path: "/v1/batches/" + fid + "/retry", want: 200}).json(t),
			`{"id":"`+fid+`","retried":1,"complete":true}`)
		wantError(t, c.do(call{method: "POST", path: "/v1/batches/" + unknownID + "/retry", want: 404}), "not_found", "")
		wantError(t, c.do(call{method: "POST", path: "/v1/batches/" + fid + "/retry?all=1", want: 400}), "invalid_request", "all")
		st := c.do(call{method: "GET", path: "/v1/status", want: 200}).json(t)
		wantEqual(t, "workers alive", st["workers_alive"], 1)
		h := c.do(call{method: "GET", path: "/v1/history?minutes=5", want: 200}).json(t)
		wantEqual(t, "history scope", h["scope"], "all")
		wantEqual(t, "history minutes", len(h["minutes"].([]any)), 5)
		c.do(call{method: "GET", path: "/history", want: 200})
		wantError(t, c.do(call{method: "GET", path: "/v1/history?minutes=1441", want: 400, req: reqInvalid}), "invalid_request", "minutes")
		wantError(t, c.do(call{method: "GET", path: "/history?minutes=x", want: 400, req: reqInvalid}), "invalid_request", "minutes")
	})

	t.Cleanup(func() { c.checkCoverage(t) })

	t.Run("judge", func(t *testing.T) {
		c := *c
		c.t = t
		for _, j := range []struct{ format, in, out string }{
			{"boj1525", "1 0 3\n4 2 5\n7 8 6\n", "3\n"},
			{"boj9944", boj9944In, "Case 1: 10\nCase 2: 1\n"},
			{"p84021", p84021In, "5\n"},
		} {
			r := c.do(call{method: "POST", path: "/v1/batches?format=" + j.format, body: []byte(j.in),
				contentType: "text/plain", want: 202})
			id := r.json(t)["id"].(string)
			out := c.do(call{method: "GET", path: "/v1/batches/" + id + "/output?wait=10s", want: 200})
			if string(out.body) != j.out {
				t.Errorf("%s output %q, want %q", j.format, out.body, j.out)
			}
			if ct := out.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("%s output Content-Type %q", j.format, ct)
			}
			b := c.do(call{method: "GET", path: "/v1/batches/" + id, want: 200}).json(t)
			wantEqual(t, j.format+" format", b["format"], j.format)
		}
		// format=json is a JSON body.
		c.do(call{method: "POST", path: "/v1/batches?format=json", body: []byte(`{"tasks":[` + sample + `]}`), want: 202})
	})
}

// TestOpenAPIUnavailable holds the 503 answers to the document: an API
// whose Redis is down.
func TestOpenAPIUnavailable(t *testing.T) {
	doc := loadDoc(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now
	a := startDocStack(t, map[string]string{"REDIS_URL": "redis://" + dead + "/0"}).API
	c := newClient(t, doc, a.Addr())

	c.do(call{method: "GET", path: "/healthz", want: 200})
	// Every request waits out the Redis client's dial retries, so they run
	// in parallel.
	t.Run("readyz", func(t *testing.T) {
		t.Parallel()
		c := *c
		c.t = t
		wantError(t, c.do(call{method: "GET", path: "/readyz", want: 503}), "unavailable", "")
	})
	for _, k := range []call{
		{method: "POST", path: "/v1/tasks", body: []byte(sample)},
		{method: "GET", path: "/v1/tasks/" + unknownID},
		{method: "DELETE", path: "/v1/tasks/" + unknownID},
		{method: "POST", path: "/v1/batches", body: []byte(`{"tasks":[` + sample + `]}`)},
		{method: "GET", path: "/v1/batches/" + unknownID},
		{method: "DELETE", path: "/v1/batches/" + unknownID},
		{method: "GET", path: "/v1/batches/" + unknownID + "/output"},
	} {
		t.Run(k.method+" "+k.path, func(t *testing.T) {
			t.Parallel()
			c := *c
			c.t = t
			k.want = 503
			r := c.do(k)
			wantError(t, r, "unavailable", "")
			if r.header.Get("Retry-After") != "1" {
				t.Errorf("503 with Retry-After %q, want 1", r.header.Get("Retry-After"))
			}
		})
	}
}

// TestOpenAPIEmbedded holds the embedded mode (no REDIS_URL: in-memory
// Redis and an in-process worker) to the document too.
func TestOpenAPIEmbedded(t *testing.T) {
	doc := loadDoc(t)
	a := startDocStack(t, map[string]string{"REDIS_URL": ""}).API
	if !a.Embedded() {
		t.Fatal("the API is not embedded without REDIS_URL")
	}
	c := newClient(t, doc, a.Addr())
	c.do(call{method: "GET", path: "/readyz", want: 200})
	r := c.do(call{method: "POST", path: "/v1/tasks", body: []byte(sample), want: 202})
	task := c.do(call{method: "GET", path: r.header.Get("Location") + "?wait=10s", want: 200}).json(t)
	wantEqual(t, "state", task["state"], "completed")
	wantJSON(t, "result", task["result"], sampleRes)
	hit := c.do(call{method: "POST", path: "/v1/tasks", body: []byte(sample), want: 200}).json(t)
	wantEqual(t, "cached", hit["cached"], true)
	r = c.do(call{method: "POST", path: "/v1/batches?format=boj9944", body: []byte(boj9944In), contentType: "text/plain", want: 202})
	out := c.do(call{method: "GET", path: r.header.Get("Location") + "/output?wait=10s", want: 200})
	wantEqual(t, "output", string(out.body), "Case 1: 10\nCase 2: 1\n")
	c.do(call{method: "GET", path: "/metrics", want: 200})
}

// TestOpenAPIAuth holds the answers of API keys, quotas, rate limits and
// idempotent batches to the document.
func TestOpenAPIAuth(t *testing.T) {
	doc := loadDoc(t)
	keysFile := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(keysFile, []byte(`[{"name":"bob","key":"bob-key-0123456789ab","rate_per_second":1,"burst":1}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startDocStack(t, map[string]string{
		"API_KEYS": "alice:alice-key-0123456789", "API_KEYS_FILE": keysFile,
		"MAX_PENDING_PER_KEY": "2", "RATE_LIMIT_BURST": "100",
	}).API
	c := newClient(t, doc, a.Addr())
	alice := map[string]string{"Authorization": "Bearer alice-key-0123456789"}

	wantError(t, c.do(call{method: "POST", path: "/v1/tasks", body: []byte(sample), want: 401}), "unauthorized", "")
	wantError(t, c.do(call{method: "GET", path: "/v1/tasks/" + unknownID, header: map[string]string{"Authorization": "Bearer nope"}, want: 401}), "unauthorized", "")
	c.do(call{method: "POST", path: "/v1/tasks", body: []byte(sample), header: alice, want: 202})

	idem := map[string]string{"Authorization": "Bearer alice-key-0123456789", "Idempotency-Key": "run-1/0"}
	batch := []byte(`{"tasks":[{"kind":"sweep","puzzle":{"board":["..."]}}]}`)
	first := c.do(call{method: "POST", path: "/v1/batches", body: batch, header: idem, want: 202})
	again := c.do(call{method: "POST", path: "/v1/batches", body: batch, header: idem, want: 202})
	if again.header.Get("Idempotent-Replayed") != "true" || again.json(t)["id"] != first.json(t)["id"] {
		t.Errorf("replay: %v %s", again.header, again.body)
	}
	wantError(t, c.do(call{method: "POST", path: "/v1/batches", body: []byte(`{"tasks":[` + sample + `]}`), header: idem, want: 422}), "idempotency_key_reused", "Idempotency-Key")
	// Alice has 2 unfinished tasks: her quota.
	q := c.do(call{method: "POST", path: "/v1/tasks", body: []byte(`{"kind":"sweep","puzzle":{"board":[".."]}}`), header: alice, want: 429})
	wantError(t, q, "quota_exceeded", "")
	// Bob's bucket holds one request.
	bob := map[string]string{"Authorization": "Bearer bob-key-0123456789ab"}
	c.do(call{method: "GET", path: "/v1/tasks/" + unknownID, header: bob, want: 404})
	rl := c.do(call{method: "GET", path: "/v1/tasks/" + unknownID, header: bob, want: 429})
	wantError(t, rl, "rate_limited", "")
	if rl.header.Get("Retry-After") == "" || q.header.Get("Retry-After") == "" {
		t.Errorf("429 without Retry-After: %v %v", rl.header, q.header)
	}

	// The dashboard signs in with a key; its cookie then stands in for
	// the header.
	ui := map[string]string{"X-Puzzleq-UI": "1"}
	signIn := []byte(`{"key":"alice-key-0123456789"}`)
	wantError(t, c.do(call{method: "POST", path: "/ui/session", body: signIn, want: 403, req: reqInvalid}), "forbidden", "X-Puzzleq-UI")
	wantError(t, c.do(call{method: "POST", path: "/ui/session", body: []byte(`{"key":"nope"}`), header: ui, want: 401}), "unauthorized", "key")
	wantError(t, c.do(call{method: "POST", path: "/ui/session", body: []byte(`{}`), header: ui, want: 400, req: reqInvalid}), "invalid_request", "key")
	in := c.do(call{method: "POST", path: "/ui/session", body: signIn, header: ui, want: 200})
	wantEqual(t, "signed in as", in.json(t)["name"], "alice")
	var cookie string
	for _, ck := range (&http.Response{Header: in.header}).Cookies() {
		if ck.Name == api.SessionCookie {
			cookie = ck.Name + "=" + ck.Value
		}
	}
	if cookie == "" {
		t.Fatalf("POST /ui/session set no %s cookie: %v", api.SessionCookie, in.header)
	}
	jar := map[string]string{"Cookie": cookie}
	wantEqual(t, "session of the cookie", c.do(call{method: "GET", path: "/ui/session", header: jar, want: 200}).json(t)["name"], "alice")
	c.do(call{method: "GET", path: "/v1/tasks", header: jar, want: 200})
	c.do(call{method: "DELETE", path: "/ui/session", header: map[string]string{"Cookie": cookie, "X-Puzzleq-UI": "1"}, want: 200})
	wantError(t, c.do(call{method: "GET", path: "/v1/tasks", header: jar, want: 401}), "unauthorized", "")
}

// mustJSON encodes v as JSON text.
func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
