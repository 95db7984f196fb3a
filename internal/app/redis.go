package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/store"
)

// Timeouts on every Redis call, so an unreachable Redis turns into a fast
// 503 instead of a hung request.
const (
	redisDialTimeout = 2 * time.Second
	redisIOTimeout   = 3 * time.Second
)

// redisConn parses url into asynq's connection options with our timeouts
// and opens a go-redis client with the same options, so asynq and our
// records always talk to the same Redis. The client caches the store's
// scripts on each new connection (store.LoadScriptsOnConnect), so after a
// Redis restart no script call is sent twice, the second time whole.
func redisConn(url string) (asynq.RedisConnOpt, redis.UniversalClient, error) {
	opt, err := asynq.ParseRedisURI(url)
	if err != nil {
		return nil, nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	switch o := opt.(type) {
	case asynq.RedisClientOpt:
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = redisDialTimeout, redisIOTimeout, redisIOTimeout
		opt = o
	case asynq.RedisFailoverClientOpt:
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = redisDialTimeout, redisIOTimeout, redisIOTimeout
		opt = o
	}
	rdb, err := newRedisClient(opt, store.LoadScriptsOnConnect)
	if err != nil {
		return nil, nil, err
	}
	return opt, rdb, nil
}

// newRedisClient is opt.MakeRedisClient with an OnConnect hook, which
// asynq's options cannot carry: it maps the same fields as asynq v0.26
// does for the two kinds ParseRedisURI returns.
func newRedisClient(opt asynq.RedisConnOpt, onConnect func(context.Context, *redis.Conn) error) (redis.UniversalClient, error) {
	switch o := opt.(type) {
	case asynq.RedisClientOpt:
		return redis.NewClient(&redis.Options{
			Network: o.Network, Addr: o.Addr, Username: o.Username, Password: o.Password, DB: o.DB,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolSize: o.PoolSize, TLSConfig: o.TLSConfig, OnConnect: onConnect,
		}), nil
	case asynq.RedisFailoverClientOpt:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: o.MasterName, SentinelAddrs: o.SentinelAddrs,
			SentinelUsername: o.SentinelUsername, SentinelPassword: o.SentinelPassword,
			Username: o.Username, Password: o.Password, DB: o.DB,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolSize: o.PoolSize, TLSConfig: o.TLSConfig, OnConnect: onConnect,
		}), nil
	}
	return nil, fmt.Errorf("REDIS_URL: unsupported connection type %T", opt)
}

// loadScripts caches the store's scripts at start, so that even the first
// call of each goes as EVALSHA. It is best effort: a Redis that is down
// now gets them through the OnConnect hook when it is back, and the
// embedded one (whose client has no hook) never restarts.
func loadScripts(st *store.Store, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), redisIOTimeout)
	defer cancel()
	if err := st.LoadScripts(ctx); err != nil {
		log.Warn("could not cache the Lua scripts in Redis at start; they load on the next connection", "err", err)
	}
}

var setRedisLogger sync.Once

// routeRedisLogs sends go-redis's own log lines (reconnect attempts) to
// slog at debug level instead of its default stderr logger: during a Redis
// outage it prints a line per dial, which would drown the real logs. The
// outage itself is reported by readiness and the health check.
func routeRedisLogs(log *slog.Logger) {
	setRedisLogger.Do(func() { redis.SetLogger(redisLogger{log.With(libraryKey, "go-redis")}) })
}

type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, fmt.Sprintf(format, v...))
}
