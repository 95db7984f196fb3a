// Package jaegertest starts a real Jaeger (v2, the OpenTelemetry
// Collector-based all-in-one) for tests: in-memory storage, its OTLP
// receivers (gRPC and HTTP) and its query API each on a free loopback
// port, and reads traces back through the query API.
//
// The binary is built from tools/jaeger, a module of its own so that
// Jaeger's hundreds of modules never reach puzzleq's go.mod, by
// scripts/build-jaeger into a cache directory keyed by that module's
// go.mod and go.sum; $PUZZLEQ_JAEGER names another binary.
package jaegertest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/redistest"
)

// BinaryEnv names the Jaeger binary to use instead of the cached build.
const BinaryEnv = "PUZZLEQ_JAEGER"

// Binary returns the Jaeger binary: $PUZZLEQ_JAEGER, else the one
// scripts/build-jaeger left in the tools cache for tools/jaeger's
// current go.mod and go.sum. When there is none, the test fails under CI
// (which builds it first) and is skipped elsewhere, saying how to build
// it: a cold build takes tens of CPU-minutes, too long to start inside
// a test run.
func Binary(t testing.TB) string {
	t.Helper()
	if b := os.Getenv(BinaryEnv); b != "" {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("%s=%s: %v", BinaryEnv, b, err)
		}
		return b
	}
	b, err := CachedBinary()
	if err == nil {
		if _, err = os.Stat(b); err == nil {
			return b
		}
	}
	msg := fmt.Sprintf("no Jaeger binary (%v): build it with scripts/build-jaeger (.ci/run does), or set %s", err, BinaryEnv)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// CachedBinary is where scripts/build-jaeger puts the binary:
// ${PUZZLEQ_TOOLS_CACHE:-$HOME/.cache/puzzleq-tools}/jaeger-<key>/jaeger,
// the key the first 16 hex digits of the SHA-256 of tools/jaeger's
// go.mod followed by its go.sum (the script's `cat go.mod go.sum |
// sha256sum`).
func CachedBinary() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("jaegertest: cannot locate the repository")
	}
	mod := filepath.Join(filepath.Dir(file), "..", "..", "tools", "jaeger")
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(mod, f))
		if err != nil {
			return "", fmt.Errorf("jaegertest: %w", err)
		}
		h.Write(b)
	}
	cache := os.Getenv("PUZZLEQ_TOOLS_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("jaegertest: %w", err)
		}
		cache = filepath.Join(home, ".cache", "puzzleq-tools")
	}
	return filepath.Join(cache, "jaeger-"+hex.EncodeToString(h.Sum(nil))[:16], "jaeger"), nil
}

// Jaeger is a running Jaeger.
type Jaeger struct {
	// OTLPHTTP and OTLPGRPC are the receivers' base URLs, for
	// OTEL_EXPORTER_OTLP_ENDPOINT with either protocol.
	OTLPHTTP, OTLPGRPC string
	// Query is the query service's base URL (/api/traces...).
	Query string
}

// config is Jaeger's configuration: the all-in-one's pipeline with
// in-memory storage, without the batch processor (a span is queryable
// as soon as it is received), and only the components the tests use,
// each on the given port.
const config = `service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:%d
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%d
      http:
        endpoint: 127.0.0.1:%d
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// Start starts Jaeger for t and stops it when t ends; it returns once
// the query API answers. Its log is printed if t fails.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	var ports [5]int
	for i := range ports {
		ports[i] = freePort(t)
	}
	health, query, queryGRPC, otlpGRPC, otlpHTTP := ports[0], ports[1], ports[2], ports[3], ports[4]
	cfg := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, config, health, query, queryGRPC, otlpGRPC, otlpHTTP), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "jaeger.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start jaeger: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("jaeger's log:\n%s", b)
		}
	})
	j := &Jaeger{
		OTLPHTTP: "http://127.0.0.1:" + strconv.Itoa(otlpHTTP),
		OTLPGRPC: "http://127.0.0.1:" + strconv.Itoa(otlpGRPC),
		Query:    "http://127.0.0.1:" + strconv.Itoa(query),
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("jaeger exited at start:\n%s", b)
		default:
		}
		resp, err := http.Get(j.Query + "/api/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && dialable(otlpGRPC) && dialable(otlpHTTP) {
				return j
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger's query API did not answer within 60 s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func dialable(port int) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Trace is a trace as the query API's /api/traces answers it.
type Trace struct {
	TraceID   string             `json:"traceID"`
	Spans     []Span             `json:"spans"`
	Processes map[string]Process `json:"processes"`
}

// Span is one span of a Trace.
type Span struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []Reference `json:"references"`
	StartTime     int64       `json:"startTime"` // µs since the epoch
	Duration      int64       `json:"duration"`  // µs
	ProcessID     string      `json:"processID"`
	Tags          []KeyValue  `json:"tags"`
	Logs          []struct {
		Fields []KeyValue `json:"fields"`
	} `json:"logs"`
}

// Reference is a span's parent (CHILD_OF) or a link (FOLLOWS_FROM).
type Reference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// KeyValue is a tag or a log field.
type KeyValue struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

// Process names the service of a span.
type Process struct {
	ServiceName string `json:"serviceName"`
}

// Service is the service name of s.
func (tr *Trace) Service(s Span) string { return tr.Processes[s.ProcessID].ServiceName }

// Parent is the span ID of s's parent in its own trace, "" for a root.
func (s Span) Parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" && r.TraceID == s.TraceID {
			return r.SpanID
		}
	}
	return ""
}

// Trace reads one trace by its ID; nil when Jaeger has none.
func (j *Jaeger) Trace(ctx context.Context, traceID string) (*Trace, error) {
	var out struct {
		Data []Trace `json:"data"`
	}
	code, err := j.get(ctx, "/api/traces/"+traceID, &out)
	if code == http.StatusNotFound {
		return nil, nil
	}
	if err != nil || len(out.Data) == 0 {
		return nil, err
	}
	return &out.Data[0], nil
}

// Find reads the traces of service having a span named operation, at
// most limit of them.
func (j *Jaeger) Find(ctx context.Context, service, operation string, limit int) ([]Trace, error) {
	q := url.Values{"service": {service}, "operation": {operation}, "limit": {strconv.Itoa(limit)},
		"lookback": {"1h"}}
	var out struct {
		Data []Trace `json:"data"`
	}
	if _, err := j.get(ctx, "/api/traces?"+q.Encode(), &out); err != nil {
		return nil, err
	}
	return out.Data, nil
}

func (j *Jaeger) get(ctx context.Context, path string, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", j.Query+path, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("jaeger: GET %s: %d %s", path, resp.StatusCode, b)
	}
	return resp.StatusCode, json.Unmarshal(b, out)
}
