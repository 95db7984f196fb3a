package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
)

// BenchmarkCacheHit is one cache hit through the API's handler (the
// cache scenario's request, without the network): the allocations and
// CPU that the API adds to its one Lua round trip. -benchmem shows what
// each change to the middleware or the submit path costs.
func BenchmarkCacheHit(b *testing.B) {
	for _, auth := range []bool{false, true} {
		name := "anonymous"
		if auth {
			name = "key"
		}
		b.Run(name, func(b *testing.B) {
			s := newReadStack(b, func(o *Options) {
				if !auth {
					o.Keys = nil
				}
				o.RatePerSecond, o.RateBurst = 1<<30, 1<<30
			})
			req := sliding8(b, 7)
			body := string(req)
			do := func() int {
				req := httptest.NewRequest(http.MethodPost, "/v1/tasks", strings.NewReader(body))
				if auth {
					req.Header.Set("Authorization", "Bearer "+aliceKey)
				}
				w := httptest.NewRecorder()
				s.srv.Handler().ServeHTTP(w, req)
				return w.Code
			}
			p, err := puzzle.Decode(req)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.rdb.Set(context.Background(), "rd:cache:"+p.Key(), `{"moves":3}`, 0).Err(); err != nil {
				b.Fatal(err)
			}
			if c := do(); c != http.StatusOK {
				b.Fatalf("status %d, want a cache hit", c)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				do()
			}
		})
	}
}

// hitStore answers every submission from the cache without Redis, so
// BenchmarkCacheHitHandler measures the API's own share of a hit: the
// middleware, decoding, hashing and rendering, not the Redis client.
type hitStore struct {
	Store
	hit json.RawMessage
}

func (h hitStore) SubmitTask(context.Context, store.NewTask, int) (json.RawMessage, time.Time, error) {
	return h.hit, time.UnixMilli(1_700_000_000_000).UTC(), nil
}

func (h hitStore) SubmitCached(context.Context, store.NewTask) (json.RawMessage, time.Time, error) {
	return h.hit, time.UnixMilli(1_700_000_000_000).UTC(), nil
}

// BenchmarkCacheHitHandler is BenchmarkCacheHit/anonymous with the store's
// round trip taken out: what the API itself costs per hit, in CPU
// (ns/op, one goroutine, no I/O) and allocations.
func BenchmarkCacheHitHandler(b *testing.B) {
	s := newReadStack(b, func(o *Options) { o.Keys = nil; o.RatePerSecond, o.RateBurst = 1<<30, 1<<30 })
	srv := New(hitStore{Store: s.st, hit: json.RawMessage(`{"moves":3,"solvable":true,"path":"LUR"}`)}, s.hub, prometheus.NewRegistry(), nil, s.srv.opts)
	h := srv.Handler()
	body := sliding8(b, 7)
	tmpl := httptest.NewRequest(http.MethodPost, "/v1/tasks", nil)
	tmpl.Header.Set("Content-Type", "application/json")
	do := func() int {
		req := tmpl.Clone(context.Background())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	if c := do(); c != http.StatusOK {
		b.Fatalf("status %d, want a cache hit", c)
	}
	b.ReportAllocs()
	for b.Loop() {
		do()
	}
}
