package tracing

import (
	"net/http"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Handler wraps the API's handler in otelhttp's: a server span per
// request, continuing the caller's traceparent, with the semantic
// conventions' attributes and status. It is used rather than otelgin,
// whose releases stopped with contrib v0.65; Route names the span by the
// route once Gin has matched it.
func Handler(h http.Handler, tp trace.TracerProvider) http.Handler {
	return otelhttp.NewHandler(h, "http", otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagator),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }),
		otelhttp.WithFilter(func(r *http.Request) bool { return !probes[r.URL.Path] }))
}

// probes are the paths that load balancers, kubelets and Prometheus
// request every few seconds: a trace of each would bury the requests'.
var probes = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// Route names the request's server span "METHOD /route", as the HTTP
// conventions ask, and sets http.route, once Gin knows the route. It
// does nothing outside a recorded span.
func Route() gin.HandlerFunc {
	return func(c *gin.Context) {
		if span := trace.SpanFromContext(c.Request.Context()); span.IsRecording() {
			if r := c.FullPath(); r != "" {
				span.SetName(c.Request.Method + " " + r)
				span.SetAttributes(attribute.String("http.route", r))
			}
		}
		c.Next()
	}
}
