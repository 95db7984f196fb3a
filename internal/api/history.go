package api

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
)

// HistoryStore reads the per-minute history (store.Store.History).
type HistoryStore interface {
	History(ctx context.Context, owner string, all bool, first, last int64) ([]store.HistoryMinute, error)
}

// HistoryRecorder counts tasks that end in the API itself (single tasks
// answered from the cache) into the history; worker.History is one.
type HistoryRecorder interface {
	Ended(owner string, completed bool, n int, acceptedAt int64)
}

// defaultHistoryMinutes is the span of a history read without ?minutes.
const defaultHistoryMinutes = 60

// historyRefill is the period of a key's history budget
// (Options.HistoryReadMinutes).
const historyRefill = 10 * time.Second

// historyLimiter is a token bucket of minutes per reader, refilled
// budget per historyRefill. A day's read costs Redis milliseconds of CPU
// (BenchmarkHistoryRead, 10 to 1,000 keys), so without it one key polling
// minutes=1440 at its request rate would take most of Redis's thread
// from every tenant. Readers are configured keys (or the anonymous owner,
// or the operators), so the map stays small.
type historyLimiter struct {
	mu     sync.Mutex
	now    func() time.Time
	budget int
	by     map[string]*historyBucket
}

type historyBucket struct {
	tokens float64
	at     time.Time
}

// take spends n minutes of who's budget; when there are too few, it
// spends nothing and says how long until there are enough.
func (l *historyLimiter) take(who string, n int) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	if l.by == nil {
		l.by = map[string]*historyBucket{}
	}
	b := l.by[who]
	if b == nil {
		b = &historyBucket{tokens: float64(l.budget), at: now}
		l.by[who] = b
	}
	rate := float64(l.budget) / historyRefill.Seconds()
	b.tokens = min(float64(l.budget), b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
	if b.tokens < float64(n) {
		// A millisecond over, so that the wait it names is enough
		// whatever the floating point makes of it.
		return false, time.Duration((float64(n)-b.tokens)/rate*float64(time.Second)) + time.Millisecond
	}
	b.tokens -= float64(n)
	return true, 0
}

// history answers GET /v1/history: the caller's own tasks, or everyone's
// when /v1 needs no key (every task then has the one anonymous owner).
func (s *Server) history(c *gin.Context) {
	s.renderHistory(c, ownerOf(c), !s.tenantAuth)
}

// operatorHistory answers the operators' GET /history: every key's.
func (s *Server) operatorHistory(c *gin.Context) { s.renderHistory(c, "", true) }

func (s *Server) renderHistory(c *gin.Context, owner string, all bool) {
	minutes := defaultHistoryMinutes
	if v, ok := c.GetQuery("minutes"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > store.HistoryMaxMinutes {
			fail(c, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "minutes",
				"minutes must be a whole number from 1 to %d, got %q", store.HistoryMaxMinutes, truncate(v, 20)))
			return
		}
		minutes = n
	}
	who := "key:" + owner
	if all {
		who = "all"
	}
	if ok, wait := s.historyReads.take(who, minutes); !ok {
		c.Header("Retry-After", retryAfter(wait))
		fail(c, newError(http.StatusTooManyRequests, apitype.CodeRateLimited, "",
			"this key has read its %d minutes of history for %s (HISTORY_READ_MINUTES); retry after %s s",
			s.opts.HistoryReadMinutes, historyRefill, retryAfter(wait)))
		return
	}
	last := time.Now().Unix() / 60
	ms, err := s.store.History(c.Request.Context(), owner, all, last-int64(minutes)+1, last)
	if err != nil {
		fail(c, err)
		return
	}
	out := apitype.History{Scope: apitype.HistoryScopeKey, Minutes: make([]apitype.HistoryPoint, len(ms))}
	if all {
		out.Scope = apitype.HistoryScopeAll
	}
	for i, m := range ms {
		p := apitype.HistoryPoint{Time: time.Unix(m.Minute*60, 0).UTC(), Completed: m.Completed, Failed: m.Failed}
		for _, n := range m.Latency {
			p.Singles += n
		}
		if p.Singles > 0 {
			p.P50Ms = latencyPercentile(m.Latency, p.Singles, 0.50)
			p.P90Ms = latencyPercentile(m.Latency, p.Singles, 0.90)
			p.P99Ms = latencyPercentile(m.Latency, p.Singles, 0.99)
		}
		if m.Pending >= 0 {
			p.Pending = &m.Pending
		}
		out.Minutes[i] = p
	}
	c.JSON(http.StatusOK, out)
}

// latencyPercentile is the upper bound, in milliseconds, of the bucket of
// counts (store.LatencyBounds, then one for longer) that holds the q-th
// quantile of the total; the last bucket reads as the last bound.
func latencyPercentile(counts []int64, total int64, q float64) *float64 {
	rank := int64(q*float64(total) + 0.999999) // the ceiling: at least 1
	i, seen := 0, counts[0]
	for seen < rank && i < len(counts)-1 {
		i++
		seen += counts[i]
	}
	ms := float64(store.LatencyBounds[min(i, len(store.LatencyBounds)-1)]) / float64(time.Millisecond)
	return &ms
}
