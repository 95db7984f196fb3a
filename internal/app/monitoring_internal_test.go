package app

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
)

// TestDashboardClientFailsFast: the clients asynqmon makes from
// boundedConnOpt end a call to a Redis that never answers at
// redisCallTimeout, where asynq's own (the option it wraps) waits out
// redisIOTimeout and then retries. (TestMonitoringFailsFastWhenRedisHangs
// holds the route itself on a frozen redis-server.)
func TestDashboardClientFailsFast(t *testing.T) {
	t.Parallel()
	opt, rdb, err := redisConn(hungRedis(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb.Close()
	for _, tc := range []struct {
		name    string
		make    func() any
		fastest time.Duration // the call may not end sooner: it was bounded by the socket, not the hook
		slowest time.Duration
	}{
		{"bounded", boundedConnOpt{opt}.MakeRedisClient, 0, redisCallTimeout + 500*time.Millisecond},
		{"asynq's own", opt.MakeRedisClient, redisIOTimeout, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := tc.make().(redis.UniversalClient)
			defer c.Close()
			start := time.Now()
			err := c.Get(context.Background(), "k").Err()
			took := time.Since(start)
			if err == nil {
				t.Fatal("a call to a Redis that never answers succeeded")
			}
			if took < tc.fastest || took > tc.slowest {
				t.Errorf("the call failed after %v (%v), want between %v and %v", took, err, tc.fastest, tc.slowest)
			}
		})
	}
}

// TestNo5xxAnswersUnavailable: a dashboard handler's 500 reaches the
// client as the API's 503 unavailable, its own body dropped; any other
// status passes through untouched.
func TestNo5xxAnswersUnavailable(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.TestMode)
	for _, tc := range []struct {
		status   int
		wantCode int
	}{{500, 503}, {502, 503}, {200, 200}, {404, 404}} {
		e := gin.New()
		e.GET("/x", unavailableOn5xx(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "dial tcp 10.0.0.7:6379: i/o timeout", tc.status)
		})))
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil))
		if rec.Code != tc.wantCode {
			t.Errorf("handler status %d: answered %d, want %d", tc.status, rec.Code, tc.wantCode)
			continue
		}
		if tc.wantCode != 503 {
			continue
		}
		var body apitype.ErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Code != apitype.CodeUnavailable {
			t.Errorf("handler status %d: body %q, want the unavailable error shape only", tc.status, rec.Body.String())
		}
		if rec.Header().Get("Retry-After") == "" {
			t.Errorf("handler status %d: no Retry-After", tc.status)
		}
	}
}
