// Package tracing sets up OpenTelemetry tracing for the API and the
// worker: a tracer provider that exports over OTLP (HTTP or gRPC) when an
// endpoint is configured, and nothing at all otherwise; the W3C trace
// context that a task carries in its payload; a go-redis hook that spans
// the commands run inside a trace; and the HTTP server's spans.
//
// Off, Provider.Tracer is nil and every caller skips its spans behind a
// nil check: a no-op tracer would still allocate a context per span, on
// a path whose allocations are counted (docs/performance.md).
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of puzzleq's own spans.
const ScopeName = "github.com/puzzleq/puzzleq"

// The protocols of OTEL_EXPORTER_OTLP_PROTOCOL that the exporter speaks.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Config is the part of the OTEL_* settings that the binaries' Config
// reads through its own getenv, so that a test can run two processes
// with different settings in one test binary. The SDK reads the rest
// (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, OTEL_BSP_*,
// OTEL_TRACES_SAMPLER, OTEL_RESOURCE_ATTRIBUTES...) from the process's
// environment itself.
type Config struct {
	// Endpoint is OTEL_EXPORTER_OTLP_ENDPOINT: the base URL of every
	// signal; traces go to its path /v1/traces over HTTP, to the URL
	// itself over gRPC.
	Endpoint string
	// TracesEndpoint is OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, used as it is;
	// it wins over Endpoint.
	TracesEndpoint string
	// Protocol is OTEL_EXPORTER_OTLP_PROTOCOL, TracesProtocol its traces
	// variant, which wins when set: http/protobuf or grpc.
	Protocol, TracesProtocol string
	// ServiceName is OTEL_SERVICE_NAME.
	ServiceName string
}

// On reports whether traces are exported: an endpoint is set.
func (c Config) On() bool { return c.Endpoint != "" || c.TracesEndpoint != "" }

// protocol is the traces' protocol.
func (c Config) protocol() string {
	if c.TracesProtocol != "" {
		return c.TracesProtocol
	}
	return c.Protocol
}

// endpointURL is the URL traces are sent to.
func (c Config) endpointURL() string {
	if c.TracesEndpoint != "" {
		return c.TracesEndpoint
	}
	if c.protocol() == ProtocolGRPC {
		return c.Endpoint
	}
	return strings.TrimSuffix(c.Endpoint, "/") + "/v1/traces"
}

// Validate checks the settings, named by their variables.
func (c Config) Validate() error {
	for _, p := range []struct{ name, v string }{
		{"OTEL_EXPORTER_OTLP_PROTOCOL", c.Protocol}, {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", c.TracesProtocol},
	} {
		if p.v != "" && p.v != ProtocolHTTP && p.v != ProtocolGRPC {
			return fmt.Errorf("%s: must be %s or %s, got %q", p.name, ProtocolHTTP, ProtocolGRPC, p.v)
		}
	}
	for _, e := range []struct{ name, v string }{
		{"OTEL_EXPORTER_OTLP_ENDPOINT", c.Endpoint}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", c.TracesEndpoint},
	} {
		if e.v == "" {
			continue
		}
		u, err := url.Parse(e.v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%s: must be an http:// or https:// URL, got %q", e.name, e.v)
		}
	}
	if c.On() && c.ServiceName == "" {
		return errors.New("OTEL_SERVICE_NAME: must not be empty")
	}
	return nil
}

// Provider is a process's tracing.
type Provider struct {
	// Tracer starts puzzleq's spans; nil when tracing is off.
	Tracer trace.Tracer
	// TP is the tracer provider of the libraries' spans (the HTTP
	// server's); nil when tracing is off.
	TP trace.TracerProvider

	sdk      *sdktrace.TracerProvider
	stopOnce sync.Once
	stopErr  error
}

// New builds the process's tracing from c: off (a Provider with a nil
// Tracer, which costs nothing) without an endpoint.
func New(ctx context.Context, c Config) (*Provider, error) {
	if !c.On() {
		return &Provider{}, nil
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch c.protocol() {
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(c.endpointURL()))
	default:
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(c.endpointURL()))
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// The environment's resource (OTEL_RESOURCE_ATTRIBUTES) first, then
	// the service name of the Config, which reads OTEL_SERVICE_NAME with
	// each binary's default.
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost(),
		resource.WithAttributes(attribute.String("service.name", c.ServiceName)))
	if err != nil && res == nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	// WithBatcher's processor reads OTEL_BSP_*, and the provider
	// OTEL_TRACES_SAMPLER (parent-based, always on by default).
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Provider{Tracer: sdk.Tracer(ScopeName), TP: sdk, sdk: sdk}, nil
}

// On reports whether spans are recorded and exported.
func (p *Provider) On() bool { return p != nil && p.Tracer != nil }

// Shutdown exports the spans still buffered, within ctx, and stops the
// exporter. Later calls return the first one's error.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	p.stopOnce.Do(func() { p.stopErr = p.sdk.Shutdown(ctx) })
	return p.stopErr
}

// ShutdownTimeout bounds the final export at a process's exit.
const ShutdownTimeout = 5 * time.Second

// propagator writes and reads the W3C trace context (traceparent and
// tracestate). It is used directly, not through otel's global
// propagator, which is a no-op until a program sets one.
var propagator propagation.TraceContext

// Inject returns the W3C traceparent and tracestate of ctx's span, ""
// when ctx holds no valid span context.
func Inject(ctx context.Context) (traceparent, tracestate string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	var c pair
	propagator.Inject(ctx, &c)
	return c.parent, c.state
}

// Extract returns ctx with the remote span context of a traceparent and
// tracestate; ctx itself when traceparent is "" or malformed.
func Extract(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagator.Extract(ctx, &pair{parent: traceparent, state: tracestate})
}

// SpanContext is the span context of a traceparent and tracestate,
// invalid when traceparent is "" or malformed.
func SpanContext(traceparent, tracestate string) trace.SpanContext {
	return trace.SpanContextFromContext(Extract(context.Background(), traceparent, tracestate))
}

// pair is a propagation.TextMapCarrier of the two W3C fields alone.
type pair struct{ parent, state string }

func (p *pair) Get(key string) string {
	switch key {
	case "traceparent":
		return p.parent
	case "tracestate":
		return p.state
	}
	return ""
}

func (p *pair) Set(key, value string) {
	switch key {
	case "traceparent":
		p.parent = value
	case "tracestate":
		p.state = value
	}
}

func (p *pair) Keys() []string { return []string{"traceparent", "tracestate"} }

// none is the span of a context without one: its methods do nothing.
var none = trace.SpanFromContext(context.Background())

// Start starts an internal span named name under ctx. With a nil tracer
// (tracing off) it returns ctx and a span that does nothing, allocating
// nothing.
func Start(ctx context.Context, tr trace.Tracer, name string) (context.Context, trace.Span) {
	if tr == nil {
		return ctx, none
	}
	return tr.Start(ctx, name)
}

// StartKind is Start for a span of another kind than internal: a
// producer's enqueue, a consumer's processing.
func StartKind(ctx context.Context, tr trace.Tracer, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	if tr == nil {
		return ctx, none
	}
	return tr.Start(ctx, name, trace.WithSpanKind(kind))
}

// Fail marks span failed with err, when err is not nil.
func Fail(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}
