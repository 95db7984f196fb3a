package tracing

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestEndpointURL(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Endpoint: "http://jaeger:4318", Protocol: ProtocolHTTP}, "http://jaeger:4318/v1/traces"},
		{Config{Endpoint: "http://jaeger:4318/", Protocol: ProtocolHTTP}, "http://jaeger:4318/v1/traces"},
		{Config{Endpoint: "http://jaeger:4317", Protocol: ProtocolGRPC}, "http://jaeger:4317"},
		{Config{Endpoint: "http://jaeger:4317", Protocol: ProtocolHTTP, TracesProtocol: ProtocolGRPC}, "http://jaeger:4317"},
		{Config{Endpoint: "http://a:4318", TracesEndpoint: "https://b/otlp/traces", Protocol: ProtocolHTTP}, "https://b/otlp/traces"},
	} {
		if got := c.cfg.endpointURL(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.cfg, got, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{
		{Endpoint: "jaeger:4317", Protocol: ProtocolGRPC, ServiceName: "s"},
		{Endpoint: "http://jaeger:4318", Protocol: "http/json", ServiceName: "s"},
		{TracesEndpoint: "http://jaeger:4318", TracesProtocol: "thrift", ServiceName: "s"},
		{Endpoint: "http://jaeger:4318", Protocol: ProtocolHTTP},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if err := (Config{Protocol: ProtocolHTTP}).Validate(); err != nil {
		t.Errorf("tracing off: %v", err)
	}
}

func TestInjectExtract(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := Extract(context.Background(), tp, "a=1")
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsRemote() || sc.TraceState().Get("a") != "1" {
		t.Fatalf("extracted %+v", sc)
	}
	if p, s := Inject(ctx); p != tp || s != "a=1" {
		t.Errorf("injected %q %q", p, s)
	}
	if p, s := Inject(context.Background()); p != "" || s != "" {
		t.Errorf("injected %q %q without a span", p, s)
	}
	if Extract(context.Background(), "garbage", "") != context.Background() &&
		trace.SpanContextFromContext(Extract(context.Background(), "garbage", "")).IsValid() {
		t.Error("a malformed traceparent gave a span context")
	}
}

// TestOffAllocatesNothing: with tracing off, starting and ending a span
// costs no allocation.
func TestOffAllocatesNothing(t *testing.T) {
	p, err := New(context.Background(), Config{Protocol: ProtocolHTTP, ServiceName: "s"})
	if err != nil || p.On() {
		t.Fatalf("New without an endpoint: on %v, %v", p.On(), err)
	}
	ctx := context.Background()
	n := testing.AllocsPerRun(100, func() {
		c, span := Start(ctx, p.Tracer, "x")
		_, s2 := StartKind(c, p.Tracer, "y", trace.SpanKindProducer)
		Fail(s2, nil)
		s2.End()
		span.End()
	})
	if n != 0 {
		t.Errorf("%v allocations per span with tracing off, want 0", n)
	}
}
