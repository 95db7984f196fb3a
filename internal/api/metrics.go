package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/apitype"
)

type metrics struct {
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	cacheHits prometheus.Counter
	submitted *prometheus.CounterVec
	// bodyTimeouts counts bodies cut off by BodyReadTimeout.
	bodyTimeouts prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "puzzleq_http_requests_total", Help: "HTTP requests by route, method and status.",
		}, []string{"route", "method", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "puzzleq_http_request_duration_seconds", Help: "HTTP request latency by route (long polls included).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 14),
		}, []string{"route", "method"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "puzzleq_api_cache_hits_total", Help: "Submitted items answered from the cache without enqueueing.",
		}),
		submitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "puzzleq_submitted_total", Help: "Items accepted by the API, by kind.",
		}, []string{"kind"}),
		bodyTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "puzzleq_http_body_timeouts_total", Help: "Request bodies cut off (408) because they did not arrive within BODY_READ_TIMEOUT.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.latency, m.cacheHits, m.submitted, m.bodyTimeouts)
	}
	return m
}

// observe counts and times every request and writes its access log line
// (accessLog).
func (s *Server) observe() gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		id := s.requestID(c)
		c.Header(RequestIDHeader, id)
		c.Next()
		route := c.FullPath()
		if route == "" {
			route = "unmatched"
		}
		status := c.Writer.Status()
		took := time.Since(start)
		s.metrics.requests.WithLabelValues(route, c.Request.Method, strconv.Itoa(status)).Inc()
		s.metrics.latency.WithLabelValues(route, c.Request.Method).Observe(took.Seconds())
		s.accessLog(c, route, status, id, took)
	}
}

// RequestIDHeader carries a request's ID: the client's (or its proxy's)
// when it sends a fit one, else one the API makes; the answer always
// carries it, and so does the request's access log line, so a report
// quoting it finds the line.
const RequestIDHeader = "X-Request-Id"

// maxRequestID bounds a request ID taken from the client, so that a
// request cannot make its log line as large as it likes.
const maxRequestID = 64

// requestID returns the ID of the request: the client's when it is 1 to
// maxRequestID bytes of letters, digits and ".-_:", otherwise this
// process's random prefix and the request's number.
func (s *Server) requestID(c *gin.Context) string {
	if v := c.GetHeader(RequestIDHeader); v != "" && len(v) <= maxRequestID && plainID(v) {
		return v
	}
	return s.idPrefix + strconv.FormatUint(s.requests.Add(1), 36)
}

// plainID reports whether v is letters, digits and ".-_:" only: nothing
// that a log reader could take for another field or line.
func plainID(v string) bool {
	for i := 0; i < len(v); i++ {
		b := v[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == '-' || b == '_' || b == ':') {
			return false
		}
	}
	return true
}

// accessLog writes one structured line for a request: its route (the
// pattern, so no ID, query or credential of the URL is logged), method,
// status, bytes written, duration, the key's name and the request ID.
// The key itself, the cookie and the body are never logged. One request
// in AccessLogEvery is logged at Info, and every server error (5xx) at
// Warn with its error, whatever the sampling.
func (s *Server) accessLog(c *gin.Context, route string, status int, id string, took time.Duration) {
	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelWarn
	} else if n := s.opts.AccessLogEvery; n <= 0 || s.logged.Add(1)%uint64(n) != 0 {
		return
	}
	ctx := c.Request.Context()
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("route", route), slog.String("method", c.Request.Method), slog.Int("status", status),
		slog.Int("bytes", max(c.Writer.Size(), 0)), slog.Int64("duration_ms", took.Milliseconds()),
		slog.String("key_id", ownerOf(c)), slog.String("request_id", id),
	}
	if status >= 500 {
		attrs = append(attrs, slog.String("err", c.Errors.String()))
	}
	s.log.LogAttrs(context.WithoutCancel(ctx), level, "request", attrs...)
}

// recoverer turns a panic in a handler into a JSON 500 and a log line. It
// should never fire; it exists so that a bug costs one request, not the
// process.
func (s *Server) recoverer() gin.HandlerFunc {
	return func(c *gin.Context) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					panic(r)
				}
				s.log.Error("handler panic", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				c.AbortWithStatusJSON(http.StatusInternalServerError,
					apitype.ErrorBody{Error: apitype.Error{Code: apitype.CodeInternal, Message: "internal error"}})
			}
		}()
		c.Next()
	}
}
