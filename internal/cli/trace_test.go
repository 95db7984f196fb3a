package cli_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestTraceparentFromEnvironment: with TRACEPARENT and TRACESTATE set, as
// a CI system or otel-cli sets them for a child process, puzzlectl's
// requests carry them, so the API's spans join the caller's trace.
func TestTraceparentFromEnvironment(t *testing.T) {
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	t.Setenv("TRACEPARENT", parent)
	t.Setenv("TRACESTATE", "vendor=v1")
	t.Setenv("PUZZLECTL_CONFIG", t.TempDir()+"/none.yaml")
	var (
		mu     sync.Mutex
		header http.Header
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		header = r.Header.Clone()
		mu.Unlock()
		http.Error(w, `{"error":{"code":"not_found","message":"no such task"}}`, http.StatusNotFound)
	}))
	defer srv.Close()
	run(t, "", "get", "--server", srv.URL, "0123456789abcdef0123456789abcdef")
	mu.Lock()
	defer mu.Unlock()
	if header == nil {
		t.Fatal("puzzlectl sent no request")
	}
	if got := header.Get("Traceparent"); got != parent {
		t.Errorf("traceparent %q, want %q", got, parent)
	}
	if got := header.Get("Tracestate"); got != "vendor=v1" {
		t.Errorf("tracestate %q, want vendor=v1", got)
	}
}
