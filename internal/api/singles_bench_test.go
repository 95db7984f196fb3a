package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
