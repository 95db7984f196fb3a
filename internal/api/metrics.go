package api

import (
	"fmt"
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

// observe counts and times every request and logs server errors.
func (s *Server) observe() gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		route := c.FullPath()
		if route == "" {
			route = "unmatched"
		}
		status := c.Writer.Status()
		s.metrics.requests.WithLabelValues(route, c.Request.Method, strconv.Itoa(status)).Inc()
		s.metrics.latency.WithLabelValues(route, c.Request.Method).Observe(time.Since(start).Seconds())
		if status >= 500 {
			s.log.Warn("request failed", "route", route, "method", c.Request.Method, "status", status,
				"duration_ms", time.Since(start).Milliseconds(), "err", c.Errors.String())
		}
	}
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
