package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
)

// TestScriptsPreloadedAfterRestart: after Redis restarts, a client with
// the store's OnConnect hook has the scripts cached again before it calls
// one, so no call fails with NOSCRIPT and none is resent whole as EVAL.
// Without the hook the same call shows one NOSCRIPT and one EVAL, which
// is checked too, so the measurement itself is known to see them.
func TestScriptsPreloadedAfterRestart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		onConnect  func(context.Context, *redis.Conn) error
		wantResent bool
	}{
		{"without the hook", nil, true},
		{"with the hook", store.LoadScriptsOnConnect, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := redistest.Start(t)
			rdb := redistest.NewClient(&redis.Options{Addr: r.Addr, OnConnect: c.onConnect})
			t.Cleanup(func() { rdb.Close() })
			s := store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
			ctx := context.Background()
			if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: "a", Kind: "fill"}, 0); err != nil {
				t.Fatal(err)
			}

			r.Kill()
			if err := r.Restart(); err != nil {
				t.Fatal(err)
			}
			// go-redis finds its pooled connections dead and dials anew.
			if _, _, err := s.SubmitTask(ctx, store.NewTask{ID: "b", Kind: "fill"}, 0); err != nil {
				t.Fatalf("submit after restart: %v", err)
			}

			info := r.Client(t).Info(ctx, "commandstats", "errorstats").Val()
			evals, noscript := stat(info, "cmdstat_eval:", "calls="), stat(info, "errorstat_NOSCRIPT:", "count=")
			shas := stat(info, "cmdstat_evalsha:", "calls=")
			if shas == 0 {
				t.Fatalf("no EVALSHA after the restart:\n%s", info)
			}
			if resent := evals > 0 || noscript > 0; resent != c.wantResent {
				t.Fatalf("after the restart: %d EVAL, %d NOSCRIPT, %d EVALSHA; want resent=%v",
					evals, noscript, shas, c.wantResent)
			}
		})
	}
}

// stat reads the number after field in INFO's line starting with line
// ("cmdstat_eval:calls=3,usec=..."), 0 when there is no such line.
func stat(info, line, field string) int {
	for l := range strings.SplitSeq(info, "\n") {
		if !strings.HasPrefix(l, line) {
			continue
		}
		_, v, _ := strings.Cut(l, field)
		v, _, _ = strings.Cut(v, ",")
		n := 0
		for _, ch := range strings.TrimSpace(v) {
			if ch < '0' || ch > '9' {
				break
			}
			n = n*10 + int(ch-'0')
		}
		return n
	}
	return 0
}
