package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Timeouts on every Redis call, so an unreachable Redis turns into a fast
// 503 instead of a hung request.
const (
	redisDialTimeout = 2 * time.Second
	redisIOTimeout   = 3 * time.Second
)

// redisConn parses url into asynq's connection options with our timeouts
// and opens a go-redis client with the same options, so asynq and our
// records always talk to the same Redis.
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
	rdb, ok := opt.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		return nil, nil, fmt.Errorf("REDIS_URL: unsupported connection type %T", opt)
	}
	return opt, rdb, nil
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
