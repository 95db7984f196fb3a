package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The floor is the least an HTTP service answering a cache hit can cost
// on this machine: a bare net/http server that reads the body and makes
// one Lua round trip doing what the API's submit script does on a hit
// (look the answer up, write a completed task record with its TTL), then
// writes the task. It validates nothing and has no middleware, so the
// cache scenario run against it beside a separate API process (-server)
// measures what everything else in the API costs (loadgen -serve-floor).

// floorScript is the floor's one round trip.
//
// KEYS[1] the cache entry of the body's hash, KEYS[2] the task record
// ARGV[1] the answer to store on a miss, ARGV[2] now (Unix ms)
//
// Returns the cached answer.
var floorScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
  v = ARGV[1]
  redis.call('SET', KEYS[1], v, 'EX', 86400)
end
redis.call('HSET', KEYS[2], 'kind', 'sliding', 'state', 'completed', 'created_at', ARGV[2], 'result', v, 'cached', '1', 'completed_at', ARGV[2])
redis.call('EXPIRE', KEYS[2], 86400)
return v
`)

// serveFloor serves the floor on addr with Redis at redisAddr until ctx
// ends.
func serveFloor(ctx context.Context, addr, redisAddr string) error {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	if err := floorScript.Load(ctx, rdb).Err(); err != nil {
		return fmt.Errorf("floor: load script: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, `{"status":"ready"}`) })
	mux.HandleFunc("POST /v1/tasks", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(body)
		var idb [16]byte
		_, _ = rand.Read(idb[:])
		id := hex.EncodeToString(idb[:])
		now := strconv.FormatInt(time.Now().UnixMilli(), 10)
		v, err := floorScript.Run(r.Context(), rdb, []string{"floor:cache:" + hex.EncodeToString(sum[:]), "floor:task:" + id},
			`{"moves":0,"solvable":true,"path":""}`, now).Text()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"kind":"sliding","state":"completed","result":%s,"cached":true}`, id, v)
	})
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	slog.Info("floor server listening", "addr", l.Addr().String(), "redis", redisAddr)
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
