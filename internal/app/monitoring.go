package app

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"
	"github.com/hibiken/asynqmon"

	"github.com/puzzleq/puzzleq/apitype"
)

// MonitoringPath is where the asynqmon dashboard is served.
const MonitoringPath = "/monitoring/"

// MonitoringMaxPageSize is the largest ?size= the dashboard's task lists
// serve: the largest page the asynqmon UI offers. asynqmon itself takes
// any size and holds the whole page, decoded, in memory: four
// pending_tasks?size=100000 requests took an API to 3.8 GB, and one
// answered 500 (issue 13).
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
func (a *API) mount(e *gin.Engine, operator gin.HandlerFunc) {
	if a.cfg.MetricsAddr == "" {
		e.GET("/metrics", operator, gin.WrapH(a.metricsHandler()))
	}
	if !a.cfg.Monitoring {
		return
	}
	a.monitor = asynqmon.New(asynqmon.Options{RootPath: MonitoringPath, RedisConnOpt: a.redisOpt, ReadOnly: true})
	e.GET(MonitoringPath+"*path", operator, pageLimits, gin.WrapH(a.monitor))
}

// pageLimits refuses, with 400, a dashboard request whose ?size= or
// ?page= is not a whole number within bounds (asynqmon would take the
// default for a malformed one, and any size at all).
func pageLimits(c *gin.Context) {
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
