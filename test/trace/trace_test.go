// Package trace_test runs the API and a worker, wired as the binaries
// wire them (internal/stacktest), on a real redis-server, exporting
// their traces over OTLP to a real Jaeger (internal/jaegertest), and
// reads the traces back through Jaeger's query API.
package trace_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/jaegertest"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// TestTracesInJaeger submits a single task with ?wait and a batch, each
// under a caller's traceparent, over each OTLP protocol, and checks in
// Jaeger that the task's API and worker spans are one trace under the
// caller's span, with the expected names and parents in the expected
// order, and that each unit of the batch has a trace of its own linked
// to the batch's commit.
func TestTracesInJaeger(t *testing.T) {
	j := jaegertest.Start(t)
	for _, tc := range []struct{ protocol, endpoint, name string }{
		{"http/protobuf", j.OTLPHTTP, "http"},
		{"grpc", j.OTLPGRPC, "grpc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			apiSvc, workerSvc := "puzzleq-api-"+tc.name, "puzzleq-worker-"+tc.name
			logs := stacktest.Logs(t)
			s := stacktest.Start(t, stacktest.Options{
				Workers:   1,
				Env:       map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": tc.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": tc.protocol},
				APIEnv:    map[string]string{"OTEL_SERVICE_NAME": apiSvc},
				WorkerEnv: map[string]string{"OTEL_SERVICE_NAME": workerSvc},
				LogOut:    logs,
			})
			single, singleParent := randomHex(t, 16), randomHex(t, 8)
			code, body, _ := s.DoH("POST", "/v1/tasks?wait=30s", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`,
				"traceparent", "00-"+single+"-"+singleParent+"-01")
			if task := stacktest.Decode[apitype.Task](t, body); code != http.StatusOK || task.State != apitype.TaskStateCompleted {
				t.Fatalf("POST /v1/tasks?wait=30s: %d %s", code, body)
			}

			batch, batchParent := randomHex(t, 16), randomHex(t, 8)
			items := `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}` + "\n" +
				`{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[0,1]]}}` + "\n" +
				`{"kind":"sweep","puzzle":{"board":["..","*.","*."]}}` + "\n"
			code, body, _ = s.DoH("POST", "/v1/batches", items, "traceparent", "00-"+batch+"-"+batchParent+"-01",
				"Content-Type", "application/x-ndjson")
			if code != http.StatusAccepted {
				t.Fatalf("POST /v1/batches: %d %s", code, body)
			}
			id := stacktest.Decode[apitype.BatchCreated](t, body).ID
			code, body = s.Do("GET", "/v1/batches/"+id+"/results?wait=30s", nil)
			if code != http.StatusOK || strings.Count(string(body), `"state":"completed"`) != 3 {
				t.Fatalf("the batch's results: %d %s", code, body)
			}
			// Stopping the stack exports what the processes still hold,
			// as a SIGTERM does.
			s.Close()

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			checkSingle(t, ctx, j, single, singleParent, apiSvc, workerSvc)
			checkBatch(t, ctx, j, batch, batchParent, apiSvc, workerSvc)
		})
	}
}

// checkSingle checks the single task's trace.
func checkSingle(t *testing.T, ctx context.Context, j *jaegertest.Jaeger, traceID, parent, apiSvc, workerSvc string) {
	t.Helper()
	tr := waitTrace(t, ctx, j, traceID, "POST /v1/tasks", "task.admit", "task.enqueue", "task.wait",
		"task.process", "task.solve", "task.write")
	one := func(name string) jaegertest.Span {
		t.Helper()
		var found []jaegertest.Span
		for _, s := range tr.Spans {
			if s.OperationName == name {
				found = append(found, s)
			}
		}
		if len(found) != 1 {
			t.Fatalf("trace %s has %d spans named %q, want 1:\n%s", traceID, len(found), name, describe(tr))
		}
		return found[0]
	}
	req, admit, enqueue, wait := one("POST /v1/tasks"), one("task.admit"), one("task.enqueue"), one("task.wait")
	process, solve, write := one("task.process"), one("task.solve"), one("task.write")
	for _, c := range []struct {
		span    jaegertest.Span
		parent  string
		service string
	}{
		{req, parent, apiSvc}, // the caller's span, sent as traceparent
		{admit, req.SpanID, apiSvc},
		{enqueue, req.SpanID, apiSvc},
		{wait, req.SpanID, apiSvc},
		{process, enqueue.SpanID, workerSvc}, // through the task's payload
		{solve, process.SpanID, workerSvc},
		{write, process.SpanID, workerSvc},
	} {
		if got := c.span.Parent(); got != c.parent {
			t.Errorf("%s's parent is %q, want %q:\n%s", c.span.OperationName, got, c.parent, describe(tr))
		}
		if got := tr.Service(c.span); got != c.service {
			t.Errorf("%s is of service %q, want %q", c.span.OperationName, got, c.service)
		}
	}
	// The Redis scripts: the submission's under the enqueue, the
	// result's under the write.
	for _, p := range []jaegertest.Span{enqueue, write} {
		if !hasChild(tr, p, "redis EVALSHA", "redis EVAL") {
			t.Errorf("%s has no Redis script span under it:\n%s", p.OperationName, describe(tr))
		}
	}
	ordered := func(a, b jaegertest.Span, what string) {
		t.Helper()
		if !(a.StartTime <= b.StartTime) {
			t.Errorf("%s: %s started at %d, %s at %d", what, a.OperationName, a.StartTime, b.OperationName, b.StartTime)
		}
	}
	ordered(admit, enqueue, "the body is admitted before the task is queued")
	ordered(enqueue, process, "the task is queued before the worker takes it")
	ordered(solve, write, "the puzzle is solved before its result is written")
	if end := solve.StartTime + solve.Duration; end > write.StartTime {
		t.Errorf("task.solve ends at %d, after task.write starts at %d", end, write.StartTime)
	}
	if end := enqueue.StartTime + enqueue.Duration; end > wait.StartTime {
		t.Errorf("task.enqueue ends at %d, after task.wait starts at %d", end, wait.StartTime)
	}
	if end := wait.StartTime + wait.Duration; end < write.StartTime {
		t.Errorf("task.wait ended at %d, before the result's write started at %d", end, write.StartTime)
	}
	woken := false
	for _, l := range wait.Logs {
		for _, f := range l.Fields {
			woken = woken || (f.Key == "event" && f.Value == "woken")
		}
	}
	if !woken {
		t.Errorf("task.wait has no \"woken\" event: %+v", wait.Logs)
	}
}

// checkBatch checks the batch's trace, and that its units' traces link
// to it.
func checkBatch(t *testing.T, ctx context.Context, j *jaegertest.Jaeger, traceID, parent, apiSvc, workerSvc string) {
	t.Helper()
	tr := waitTrace(t, ctx, j, traceID, "POST /v1/batches", "batch.ingest", "batch.commit")
	var req, commit jaegertest.Span
	for _, s := range tr.Spans {
		switch s.OperationName {
		case "POST /v1/batches":
			req = s
		case "batch.commit":
			commit = s
		}
	}
	if req.Parent() != parent || tr.Service(req) != apiSvc {
		t.Errorf("POST /v1/batches: parent %q of %q, want %q of %q", req.Parent(), tr.Service(req), parent, apiSvc)
	}
	for _, s := range tr.Spans {
		if (s.OperationName == "batch.ingest" || s.OperationName == "batch.commit") && s.Parent() != req.SpanID {
			t.Errorf("%s's parent is %q, want the request's %q", s.OperationName, s.Parent(), req.SpanID)
		}
	}
	// Two units: the chunk of the cheap items (sliding, fill) and the
	// sweep's own; each delivery is a trace of its own, linked to the
	// commit (a delivery that waited for a slot is one more).
	var units []jaegertest.Trace
	for {
		ts, err := j.Find(ctx, workerSvc, "unit.process", 20)
		if err != nil {
			t.Fatal(err)
		}
		units = units[:0]
		for _, u := range ts {
			for _, s := range u.Spans {
				if s.OperationName != "unit.process" {
					continue
				}
				for _, r := range s.References {
					if r.TraceID == traceID && r.SpanID == commit.SpanID {
						units = append(units, u)
					}
				}
			}
		}
		if written(units) >= 2 || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := written(units); n < 2 {
		t.Fatalf("found %d unit.process traces linked to the batch's commit span %s that wrote their items, want 2", n, commit.SpanID)
	}
	for _, u := range units {
		if u.TraceID == traceID {
			t.Errorf("a unit's span is in the batch's trace %s, not in one of its own linked to it", traceID)
		}
		for _, s := range u.Spans {
			if s.OperationName == "unit.process" && u.Service(s) != workerSvc {
				t.Errorf("unit.process is of service %q, want %q", u.Service(s), workerSvc)
			}
		}
	}
}

// written counts the unit traces that wrote their items' outcomes.
func written(units []jaegertest.Trace) int {
	n := 0
	for i := range units {
		if hasName(&units[i], "unit.write") {
			n++
		}
	}
	return n
}

// waitTrace reads a trace from Jaeger until it holds spans of every name.
func waitTrace(t *testing.T, ctx context.Context, j *jaegertest.Jaeger, traceID string, names ...string) *jaegertest.Trace {
	t.Helper()
	var last *jaegertest.Trace // the last read, for the failure's message
	for {
		tr, err := j.Trace(ctx, traceID)
		if err != nil && ctx.Err() == nil {
			t.Fatal(err)
		}
		if tr == nil {
			tr = last
		}
		last = tr
		missing := names
		if tr != nil {
			missing = nil
			for _, n := range names {
				if !hasName(tr, n) {
					missing = append(missing, n)
				}
			}
		}
		if len(missing) == 0 {
			return tr
		}
		if ctx.Err() != nil {
			got := "none"
			if tr != nil {
				got = "\n" + describe(tr)
			}
			t.Fatalf("trace %s lacks spans %v; it has: %s", traceID, missing, got)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func hasName(tr *jaegertest.Trace, name string) bool {
	for _, s := range tr.Spans {
		if s.OperationName == name {
			return true
		}
	}
	return false
}

func hasChild(tr *jaegertest.Trace, p jaegertest.Span, names ...string) bool {
	for _, s := range tr.Spans {
		for _, n := range names {
			if s.OperationName == n && s.Parent() == p.SpanID {
				return true
			}
		}
	}
	return false
}

// describe lists a trace's spans: service, name, ID and parent.
func describe(tr *jaegertest.Trace) string {
	var b strings.Builder
	for _, s := range tr.Spans {
		fmt.Fprintf(&b, "  %s %q %s <- %s at %d +%dµs\n", tr.Service(s), s.OperationName, s.SpanID, s.Parent(), s.StartTime, s.Duration)
	}
	return b.String()
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
