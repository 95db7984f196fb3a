package cli

import (
	"context"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// envTrace continues the caller's trace, when the environment names one
// in TRACEPARENT (and TRACESTATE), the W3C trace context as
// OpenTelemetry's environment carriers pass it to a child process (CI
// systems and otel-cli set them): every request puzzlectl sends then
// carries it, and the API's and the workers' spans join that trace.
// puzzlectl records no spans of its own, so it needs no exporter.
func envTrace(ctx context.Context) context.Context {
	parent := os.Getenv("TRACEPARENT")
	if parent == "" {
		return ctx
	}
	carrier := propagation.MapCarrier{"traceparent": parent, "tracestate": os.Getenv("TRACESTATE")}
	// The client writes the headers with the global propagator, which is
	// a no-op until set.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return propagation.TraceContext{}.Extract(ctx, carrier)
}
