package api

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/internal/admission"
	"github.com/puzzleq/puzzleq/internal/store"
)

// bodyTime: the grace, plus the bytes at the rate, never past
// maxBodyTime.
func TestBodyTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		grace time.Duration
		rate  int64
		n     int64
		want  time.Duration
	}{
		{30 * time.Second, 64 << 10, 0, 30 * time.Second},
		{30 * time.Second, 64 << 10, 640 << 10, 40 * time.Second},
		{time.Second, 1000, 1500, 2500 * time.Millisecond},
		{30 * time.Second, 64 << 10, 256 << 20, maxBodyTime}, // 4,126 s at the rate
		{time.Hour, 64 << 10, 0, maxBodyTime},
	} {
		if got := bodyTime(tc.grace, tc.rate, tc.n); got != tc.want {
			t.Errorf("bodyTime(%s, %d B/s, %d B) = %s, want %s", tc.grace, tc.rate, tc.n, got, tc.want)
		}
	}
	if maxBodyTime >= store.StagingTTL {
		t.Errorf("maxBodyTime %s: a batch's staged items (StagingTTL %s) would expire before its body is in", maxBodyTime, store.StagingTTL)
	}
}

// TestPanickingHandlerGivesBackItsBytes: a handler that panics after
// reading its body (the recoverer answers 500) still gives its bytes back
// to the pool. Without it they were lost for good, and the ticket stayed
// its key's oldest holder.
func TestPanickingHandlerGivesBackItsBytes(t *testing.T) {
	s := &Server{admit: admission.New(1<<20, 1<<20), metrics: newMetrics(prometheus.NewRegistry()),
		log: slog.New(slog.DiscardHandler), opts: Options{BodyReadTimeout: 5 * time.Second, BodyMinRate: 1}}
	e := gin.New()
	e.Use(s.recoverer(), s.admitted())
	e.POST("/boom", func(c *gin.Context) {
		if _, err := s.readBody(c, 1<<20); err != nil {
			t.Errorf("read: %v", err)
		}
		panic("boom")
	})
	w := httptest.NewRecorder()
	e.ServeHTTP(w, httptest.NewRequest("POST", "/boom", strings.NewReader(strings.Repeat("x", 100<<10))))
	if w.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500", w.Code)
	}
	if n := s.admit.InUse(); n != 0 {
		t.Fatalf("the pool holds %d bytes after the panic", n)
	}
}

// TestPageBytes: a page of a batch's results needs at most half of what
// it may take from, the key's share or (without keys, or with a share as
// large as the pool) the pool, and never more than pageResultBytes.
func TestPageBytes(t *testing.T) {
	for _, tc := range []struct {
		capacity, share int64
		owner           string
		want            int64
	}{
		{32 << 20, 16 << 20, "", pageResultBytes},
		{32 << 20, 16 << 20, "alice", 4 << 20},
		{1 << 20, 1 << 20, "", 256 << 10},
		{1 << 20, 1 << 20, "alice", 256 << 10},
		{64 << 20, 64 << 20, "alice", pageResultBytes},
		{2, 2, "alice", 1},
	} {
		if got := admission.New(tc.capacity, tc.share).PageBytes(tc.owner, pageResultBytes); got != tc.want {
			t.Errorf("pool %d, share %d, owner %q: %d, want %d", tc.capacity, tc.share, tc.owner, got, tc.want)
		}
	}
}
