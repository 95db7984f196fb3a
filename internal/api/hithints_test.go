package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestCacheHitHint: a key's first hit goes the full submit and leaves a
// hint, its next hits go the short path (SubmitCached) with the same
// answer and record, and once the entry is gone a hinted submission
// still reaches the queue through the full submit, and drops the hint.
func TestCacheHitHint(t *testing.T) {
	s := newReadStack(t, func(o *Options) { o.RatePerSecond, o.RateBurst = 1<<30, 1<<30 })
	ctx := context.Background()
	body := sliding8(t, 11)
	p, err := puzzle.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	key := p.Key()
	post := func(t *testing.T) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/v1/tasks", strings.NewReader(string(body)))
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		w := httptest.NewRecorder()
		s.srv.Handler().ServeHTTP(w, req)
		return w
	}
	// A miss: queued, no hint.
	first := want[apitype.Task](t, post(t), http.StatusAccepted)
	if s.srv.hits.has(key) {
		t.Fatal("a miss left a hint")
	}
	const result = `{"moves":5,"solvable":true,"path":"LURDL"}`
	if err := s.rdb.Set(ctx, "rd:cache:"+key, result, 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The first hit: the full submit, which leaves the hint.
	full := want[apitype.Task](t, post(t), http.StatusOK)
	if !s.srv.hits.has(key) {
		t.Fatal("a hit left no hint")
	}
	// The next: the short path (its script has 3 keys, the full
	// submit's 9), whose answer and record are the same.
	keys := &evalKeys{}
	s.rdb.AddHook(keys)
	short := want[apitype.Task](t, post(t), http.StatusOK)
	if got := submits(keys.take()); got != "[3]" {
		t.Fatalf("a hinted hit ran submit scripts with %s keys, want one with 3", got)
	}
	for _, tk := range []apitype.Task{full, short} {
		if tk.State != apitype.TaskStateCompleted || !tk.Cached || string(tk.Result) != result || tk.ID == first.ID {
			t.Fatalf("hit answered %+v", tk)
		}
	}
	recFull := s.rdb.HGetAll(ctx, "rd:task:"+full.ID).Val()
	recShort := s.rdb.HGetAll(ctx, "rd:task:"+short.ID).Val()
	delete(recFull, "created_at")
	delete(recFull, "completed_at")
	delete(recShort, "created_at")
	delete(recShort, "completed_at")
	if fmt.Sprint(recFull) != fmt.Sprint(recShort) || len(recShort) == 0 {
		t.Fatalf("records differ:\nfull  %v\nshort %v", recFull, recShort)
	}
	got := want[apitype.Task](t, s.do(t, http.MethodGet, "/v1/tasks/"+short.ID, aliceKey), http.StatusOK)
	if got.State != apitype.TaskStateCompleted || string(got.Result) != result {
		t.Fatalf("GET of the short path's task: %+v", got)
	}
	// The entry expires: the hinted submission is queued after all.
	if err := s.rdb.Del(ctx, "rd:cache:"+key).Err(); err != nil {
		t.Fatal(err)
	}
	queued := want[apitype.Task](t, post(t), http.StatusAccepted)
	if got := submits(keys.take()); got != "[3 9]" {
		t.Fatalf("a hinted miss ran submit scripts with %s keys, want the short one, then the full submit", got)
	}
	if queued.State != apitype.TaskStatePending || s.srv.hits.has(key) {
		t.Fatalf("after the entry expired: %+v, hint kept %v", queued, s.srv.hits.has(key))
	}
	if _, err := s.insp.GetTaskInfo(tasks.QueueCheap, queued.ID); err != nil {
		t.Fatalf("the hinted miss is not on asynq's queue: %v", err)
	}
}

// evalKeys is a go-redis hook that records the key count of each
// EVALSHA, which tells the store's two submit scripts apart.
type evalKeys struct {
	mu   sync.Mutex
	seen []int64
}

func (h *evalKeys) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *evalKeys) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 2 && cmd.Name() == "evalsha" {
			if n, ok := a[2].(int); ok {
				h.mu.Lock()
				h.seen = append(h.seen, int64(n))
				h.mu.Unlock()
			}
		}
		return next(ctx, cmd)
	}
}

func (h *evalKeys) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// take returns the counts seen since the last take.
func (h *evalKeys) take() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.seen
	h.seen = nil
	return s
}

// submits keeps the key counts of the two submit scripts (3 and 9 keys)
// from what evalKeys saw: the rate limit's script has one.
func submits(seen []int64) string {
	var out []int64
	for _, n := range seen {
		if n == 3 || n == 9 {
			out = append(out, n)
		}
	}
	return fmt.Sprint(out)
}

// TestHitHintsBounded: the hints hold at most maxHitHints keys, the
// newest always among them.
func TestHitHintsBounded(t *testing.T) {
	var h hitHints
	for i := range maxHitHints + 100 {
		k := fmt.Sprintf("%064x", i)
		h.add(k)
		if !h.has(k) {
			t.Fatalf("key %d not kept", i)
		}
	}
	n := 0
	h.keys.Range(func(_, _ any) bool { n++; return true })
	if n != maxHitHints || h.n.Load() != maxHitHints {
		t.Fatalf("%d keys held (counted %d), want %d", n, h.n.Load(), maxHitHints)
	}
	h.forget(fmt.Sprintf("%064x", maxHitHints+99))
	if h.n.Load() != maxHitHints-1 {
		t.Fatalf("count %d after forget", h.n.Load())
	}
}
