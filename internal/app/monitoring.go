package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/hibiken/asynq"
	"github.com/hibiken/asynqmon"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
)

// MonitoringPath is where the asynqmon dashboard is served.
const MonitoringPath = "/monitoring/"

// MonitoringMaxPageSize is the largest ?size= the dashboard's task lists
// serve: the largest page the asynqmon UI offers. asynqmon itself takes
// any size and holds the whole page, decoded, in memory: four
// pending_tasks?size=100000 requests take an API to 3.8 GB, and one
// answers 500.
const MonitoringMaxPageSize = 100

// monitoringMaxPage bounds ?page=, so that page×size, the offset asynq
// computes, stays far from overflowing.
const monitoringMaxPage = 1_000_000

// mount adds the operator routes, which are not part of the v1 API:
// /metrics (unless METRICS_ADDR moves it to a listener of its own), and,
// unless MONITORING is off, asynqmon's read-only queue dashboard at
// /monitoring/ on the same Redis as the API (the in-memory one when
// embedded). operator checks the operator credential and rate limit
// (api.Server.Operator).
func (a *API) mount(e *gin.Engine, operator api.OperatorAuth) {
	if a.cfg.MetricsAddr == "" {
		e.GET("/metrics", operator.Check, gin.WrapH(a.metricsHandler()))
	}
	if !a.cfg.Monitoring {
		return
	}
	a.monitor = asynqmon.New(asynqmon.Options{RootPath: MonitoringPath, RedisConnOpt: boundedConnOpt{a.redisOpt}, ReadOnly: true})
	e.GET(MonitoringPath+"*path", a.signIn, operator.Check, pageLimits, unavailableOn5xx(a.monitor))
	e.POST(MonitoringPath+"login", operator.Login(MonitoringPath))
}

// boundedConnOpt is the API's Redis connection for the dashboard.
// asynqmon makes clients of its own from the option it is given (one for
// its handlers, one for its inspector), and asynq's would wait out
// redisIOTimeout and retry on a hung Redis: about 3 s a try, where every
// other route answers 503 within 2.5 s. Its clients get the
// API's: the caller's deadline reaching the socket and redisCallTimeout
// over each call.
type boundedConnOpt struct{ asynq.RedisConnOpt }

// MakeRedisClient returns a client like the API's own.
func (o boundedConnOpt) MakeRedisClient() any {
	c, err := newRedisClient(o.RedisConnOpt, nil)
	if err != nil {
		return o.RedisConnOpt.MakeRedisClient()
	}
	c.AddHook(callDeadline(redisCallTimeout))
	return c
}

// unavailableOn5xx serves h (the dashboard) and answers its server errors
// as the API's 503 unavailable: asynqmon answers a failed Redis call with
// a 500 and the error's text, where the rest of the API says, in its
// error shape, that Redis is unavailable and when to try again.
func unavailableOn5xx(h http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		h.ServeHTTP(&no5xx{ResponseWriter: c.Writer}, c.Request)
	}
}

// no5xx is a ResponseWriter that turns a 5xx status into 503 unavailable
// and drops the body that came with it.
type no5xx struct {
	http.ResponseWriter
	wrote, failed bool
}

func (w *no5xx) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote = true
	if code < 500 {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.failed = true
	body, _ := json.Marshal(apitype.ErrorBody{Error: apitype.Error{Code: apitype.CodeUnavailable,
		Message: "the dashboard could not read Redis; try again shortly"}})
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Retry-After", "1")
	w.ResponseWriter.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.ResponseWriter.Write(body)
}

func (w *no5xx) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.failed {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// loginPath is the dashboard's sign-in page.
const loginPath = MonitoringPath + "login"

// loginPage is the sign-in form: a browser cannot send a bearer header to
// the dashboard, so the operator key is posted once and a session cookie
// (api.OperatorCookie) carries the sign-in.
const loginPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>puzzleq operator sign-in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="/ui/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/ui/style.css"></head>
<body>
<header><h1>puzzleq</h1><span class="muted">operators</span></header>
<main>
<section id="signin">
<h2>Sign in to the queue dashboard</h2>
<p class="muted">The queue dashboard shows every key's tasks; it needs one of the <code>OPERATOR_KEYS</code>. The browser keeps a session cookie, never the key.</p>
<form method="post" action="` + loginPath + `">
<label>Operator key <input type="password" name="key" autocomplete="current-password" required autofocus></label>
<button type="submit">Sign in</button>
</form>
<p class="muted">Tenant API keys sign in at <a href="/ui/">/ui/</a>, the jobs dashboard.</p>
</section>
</main>
</body></html>
`

// signIn serves the sign-in page, and sends a browser that asks for a
// dashboard page with no credential to it, when keys are configured.
func (a *API) signIn(c *gin.Context) {
	if len(a.cfg.keys) == 0 {
		c.Next()
		return
	}
	if c.Request.URL.Path == loginPath {
		c.Header("Cache-Control", "no-store")
		// The page shares the jobs dashboard's style sheet and icon.
		c.Header("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
		c.Data(http.StatusOK, "text/html; charset=utf-8", []byte(loginPage))
		c.Abort()
		return
	}
	_, cookieErr := c.Cookie(api.OperatorCookie)
	if c.GetHeader("Authorization") == "" && cookieErr != nil && !strings.HasPrefix(c.Param("path"), "/api/") &&
		strings.Contains(c.GetHeader("Accept"), "text/html") {
		c.Redirect(http.StatusSeeOther, loginPath)
		c.Abort()
		return
	}
	c.Next()
}

// pageLimits refuses, with 400, a dashboard request whose ?size= or
// ?page= is not a whole number within bounds (asynqmon would take the
// default for a malformed one, and any size at all). It also answers 404
// for asynqmon's Prometheus proxy (api/metrics): no Prometheus is
// configured, and asynqmon answers that 500 after nine failed fetches.
func pageLimits(c *gin.Context) {
	if c.Param("path") == "/api/metrics" {
		c.AbortWithStatusJSON(http.StatusNotFound, apitype.ErrorBody{Error: apitype.Error{
			Code: apitype.CodeNotFound, Message: "the dashboard has no Prometheus to query; use /metrics"}})
		return
	}
	q := c.Request.URL.Query()
	for _, p := range []struct {
		name string
		max  int
	}{{"size", MonitoringMaxPageSize}, {"page", monitoringMaxPage}} {
		v, ok := q[p.name]
		if !ok {
			continue
		}
		if len(v) != 1 {
			pageError(c, p.name, fmt.Sprintf("%s is given %d times", p.name, len(v)))
			return
		}
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 1 || n > p.max {
			pageError(c, p.name, fmt.Sprintf("%s must be a whole number from 1 to %d", p.name, p.max))
			return
		}
	}
	c.Next()
}

func pageError(c *gin.Context, field, msg string) {
	c.AbortWithStatusJSON(http.StatusBadRequest, apitype.ErrorBody{Error: apitype.Error{
		Code: apitype.CodeInvalidRequest, Message: msg, Field: field}})
}
