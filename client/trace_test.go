package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/puzzleq/puzzleq/client"
)

// TestRequestsCarryTheCallersTrace: with a propagator set, a call made
// in a span sends its traceparent; without a span in ctx, none.
func TestRequestsCarryTheCallersTrace(t *testing.T) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	got := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Traceparent")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"0123456789abcdef0123456789abcdef","kind":"sliding","state":"pending"}`))
	}))
	defer srv.Close()
	c := client.New(srv.URL)
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	if _, err := c.Get(ctx, "0123456789abcdef0123456789abcdef", 0); err != nil {
		t.Fatal(err)
	}
	if h, want := <-got, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; h != want {
		t.Errorf("traceparent %q, want %q", h, want)
	}
	if _, err := c.Get(context.Background(), "0123456789abcdef0123456789abcdef", 0); err != nil {
		t.Fatal(err)
	}
	if h := <-got; h != "" {
		t.Errorf("a call outside a span sent traceparent %q", h)
	}
}
