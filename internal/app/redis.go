package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/store"
)

// Timeouts on every Redis connection, so an unreachable Redis turns into
// an error instead of a hung call. They are the socket's backstop: the
// caller's context deadline applies too (ContextTimeoutEnabled), and
// the API bounds each call tighter (redisCallTimeout).
const (
	redisDialTimeout = 2 * time.Second
	redisIOTimeout   = 3 * time.Second
)

// redisCallTimeout bounds one Redis call of the API: a command or a
// pipeline, with its wait for a pooled connection, its dial and every
// retry go-redis makes. A hung Redis (frozen, paused, or a partition
// that drops packets without a reset) answers nothing, and without it a
// read timed out after redisIOTimeout and was then retried up to three
// times: POST /v1/tasks took 10.1 s to fail. With it the request's first
// call fails after 2 s and the request answers 503, inside the 2.5 s the
// API promises (SECURITY.md); /readyz, whose own limit is 2 s, fails
// within it. The slowest legitimate call (a 1,000-item page, a batch
// commit) takes milliseconds.
const redisCallTimeout = 2 * time.Second

// redisConn parses url into asynq's connection options with our timeouts
// and opens a go-redis client with the same options, so asynq and our
// records always talk to the same Redis. The client caches the store's
// scripts on each new connection (store.LoadScriptsOnConnect), so after a
// Redis restart no script call is sent twice, the second time whole; also,
// when set, runs onConnect on each.
func redisConn(url string, onConnect ...func(context.Context, *redis.Conn) error) (asynq.RedisConnOpt, redis.UniversalClient, error) {
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
	hooks := append([]func(context.Context, *redis.Conn) error{store.LoadScriptsOnConnect}, onConnect...)
	rdb, err := newRedisClient(opt, func(ctx context.Context, cn *redis.Conn) error {
		for _, h := range hooks {
			if err := h(ctx, cn); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return opt, rdb, nil
}

// masterWatch tells when the Redis master a client reaches is another
// one than before: each new connection reads the server's run ID (INFO
// server), which is new after a Sentinel failover (the promoted replica
// has its own) and after a restart. A connection to a Sentinel (a
// failover client connects to them too) is not a master and is skipped.
// The first master seen is no change.
type masterWatch struct {
	mu      sync.Mutex
	runID   string
	changed func(oldID, newID string) // must not block: it runs in a connection's setup
}

// notify makes f hear of every change from now on.
func (m *masterWatch) notify(f func(oldID, newID string)) {
	m.mu.Lock()
	m.changed = f
	m.mu.Unlock()
}

// onConnect is masterWatch's go-redis OnConnect hook. A server that does
// not answer INFO (an ACL that forbids it) leaves the connection as it
// is: the watch then sees nothing, and the connection still works.
func (m *masterWatch) onConnect(ctx context.Context, cn *redis.Conn) error {
	info, err := cn.Info(ctx, "server").Result()
	if err != nil {
		return nil
	}
	fields := infoFields(info, "run_id", "redis_mode")
	id := fields["run_id"]
	if id == "" || fields["redis_mode"] == "sentinel" {
		return nil
	}
	m.mu.Lock()
	old, changed := m.runID, m.changed
	m.runID = id
	m.mu.Unlock()
	if old != "" && old != id && changed != nil {
		changed(old, id)
	}
	return nil
}

// infoFields picks the named fields out of an INFO reply.
func infoFields(info string, names ...string) map[string]string {
	out := make(map[string]string, len(names))
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r\n"), ":")
		if ok && slices.Contains(names, k) {
			out[k] = v
		}
	}
	return out
}

// newRedisClient is opt.MakeRedisClient with an OnConnect hook, which
// asynq's options cannot carry: it maps the same fields as asynq v0.26
// does for the two kinds ParseRedisURI returns. It also turns on
// ContextTimeoutEnabled, so that a caller's deadline bounds the socket's
// reads and writes too: without it go-redis uses the context only
// between retries, and /readyz's 2 s limit took 3.0 s (redisIOTimeout)
// on a frozen Redis.
//
// It speaks RESP2 (Protocol 2): under RESP3, go-redis v9.23 peeks every
// connection for pending push notifications before each reply, which costs
// 5% of the API's and the worker's CPU on the single-task path,
// and we use no RESP3 feature (no client-side caching, no maintenance
// notifications). Pub/Sub works the same on a RESP2 connection.
//
// Its connections skip go-redis's per-checkout socket peek while they are
// busy (idlePeekDial).
func newRedisClient(opt asynq.RedisConnOpt, onConnect func(context.Context, *redis.Conn) error) (redis.UniversalClient, error) {
	var c redis.UniversalClient
	switch o := opt.(type) {
	case asynq.RedisClientOpt:
		c = redis.NewClient(&redis.Options{
			Network: o.Network, Addr: o.Addr, Username: o.Username, Password: o.Password, DB: o.DB,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolSize: o.PoolSize, TLSConfig: o.TLSConfig, OnConnect: onConnect, ContextTimeoutEnabled: true, Protocol: 2,
		})
	case asynq.RedisFailoverClientOpt:
		c = redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: o.MasterName, SentinelAddrs: o.SentinelAddrs,
			SentinelUsername: o.SentinelUsername, SentinelPassword: o.SentinelPassword,
			Username: o.Username, Password: o.Password, DB: o.DB,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
			PoolSize: o.PoolSize, TLSConfig: o.TLSConfig, OnConnect: onConnect, ContextTimeoutEnabled: true, Protocol: 2,
		})
	default:
		return nil, fmt.Errorf("REDIS_URL: unsupported connection type %T", opt)
	}
	c.AddHook(idlePeekDial{})
	return c, nil
}

// idlePeekDial is a go-redis hook that makes go-redis check only the
// connections that sat idle. go-redis v9.23 checks every connection it
// takes from its pool with a non-blocking recvfrom (MSG_PEEK) on the
// socket: a system call on every command and pipeline, 4.7% of the
// process's CPU on the single-task path, where a task makes
// about five such calls across the API and the worker. The check finds a
// connection the server closed while it sat in the pool (a Redis restart,
// an idle timeout, CLIENT KILL), which would otherwise fail the next
// command with EOF; go-redis retries that on the next pooled connection,
// which may be just as dead, so after a restart every dead connection
// would cost a caller an attempt. A connection used within peekAfterIdle
// is not checked: under load a connection goes back to work within
// microseconds, and one the server closed that recently is a restart
// within that window, which fails the calls in flight anyway. TLS
// connections were never checked (tls.Conn has no SyscallConn), and are
// passed through as they are.
type idlePeekDial struct{}

// peekAfterIdle is how long a pooled connection must have been idle for
// go-redis's socket check to run on it.
const peekAfterIdle = 100 * time.Millisecond

func (idlePeekDial) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sc, ok := c.(syscall.Conn)
		if !ok {
			return c, nil
		}
		raw, err := sc.SyscallConn()
		if err != nil {
			return c, nil
		}
		ic := &idlePeekConn{Conn: c, raw: raw}
		ic.touch()
		return ic, nil
	}
}

func (idlePeekDial) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (idlePeekDial) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// monoEpoch is the origin of idlePeekConn's clock, which reads the
// monotonic clock through time.Since.
var monoEpoch = time.Now()

// idlePeekConn is a connection that remembers when it was last read or
// written, and whose SyscallConn skips go-redis's peek until it has been
// idle for peekAfterIdle.
type idlePeekConn struct {
	net.Conn
	raw  syscall.RawConn
	used atomic.Int64 // time.Since(monoEpoch) at the last Read or Write
}

func (c *idlePeekConn) touch() { c.used.Store(int64(time.Since(monoEpoch))) }

func (c *idlePeekConn) Read(b []byte) (int, error) {
	c.touch()
	return c.Conn.Read(b)
}

func (c *idlePeekConn) Write(b []byte) (int, error) {
	c.touch()
	return c.Conn.Write(b)
}

// SyscallConn is what go-redis's check uses, and only it: the reads and
// writes go through Read and Write.
func (c *idlePeekConn) SyscallConn() (syscall.RawConn, error) { return peekIfIdle{c}, nil }

// peekIfIdle is the connection's RawConn: its Read, go-redis's peek,
// reports a healthy connection without a system call when the
// connection was used within peekAfterIdle.
type peekIfIdle struct{ c *idlePeekConn }

func (p peekIfIdle) Control(f func(fd uintptr)) error { return p.c.raw.Control(f) }

func (p peekIfIdle) Read(f func(fd uintptr) bool) error {
	if time.Duration(int64(time.Since(monoEpoch))-p.c.used.Load()) < peekAfterIdle {
		return nil
	}
	return p.c.raw.Read(f)
}

func (p peekIfIdle) Write(f func(fd uintptr) bool) error { return p.c.raw.Write(f) }

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

// callDeadline is a go-redis hook that bounds each command and pipeline
// to its duration (see redisCallTimeout), unless the caller's deadline is
// sooner. The hook runs outside go-redis's retry loop, so the bound
// covers every attempt: once it passes, the retry's backoff sleep sees
// the context done and go-redis returns instead of reading again. The
// store uses no blocking commands (BLPOP and the like), which a bound
// would cut; pub/sub does not pass through process hooks.
type callDeadline time.Duration

// bound returns ctx with the call's deadline.
func (d callDeadline) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	limit := time.Now().Add(time.Duration(d))
	if dl, ok := ctx.Deadline(); ok && !dl.After(limit) {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, limit)
}

func (d callDeadline) DialHook(next redis.DialHook) redis.DialHook { return next }

func (d callDeadline) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		ctx, cancel := d.bound(ctx)
		defer cancel()
		return next(ctx, cmd)
	}
}

func (d callDeadline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		ctx, cancel := d.bound(ctx)
		defer cancel()
		return next(ctx, cmds)
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

// refusalPause is how long a worker's Redis call that Redis refused as a
// write (OOM at maxmemory, READONLY, MISCONF) waits before it returns.
const refusalPause = 25 * time.Millisecond

// pauseOnRefusal is a go-redis hook for the worker's client that makes a
// call without a deadline that Redis refused as a write return
// refusalPause later. asynq's loops call without one, and its processor
// dequeues again at once after a dequeue error, so a Redis that refuses
// writes gets the dequeue script in a tight loop: 12,000 calls a second
// from one idle worker, 11 % of Redis's core (scripts/bench-oom-idle.sh).
// Paused, it gets about 40 a second per
// asynq server, and a worker sees within refusalPause that Redis takes
// writes again. The worker's own calls carry deadlines and their callers'
// retry policies (a refused task write retries after 1–2 s), so they
// return at once.
type pauseOnRefusal time.Duration

func (p pauseOnRefusal) wait(ctx context.Context, err error) {
	if !store.RefusesWrites(err) {
		return
	}
	if _, ok := ctx.Deadline(); ok {
		return
	}
	t := time.NewTimer(time.Duration(p))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (p pauseOnRefusal) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p pauseOnRefusal) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		p.wait(ctx, err)
		return err
	}
}

func (p pauseOnRefusal) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		// go-redis returns the first failed command's error.
		err := next(ctx, cmds)
		p.wait(ctx, err)
		return err
	}
}

// redisAddr is the address a client connects to, for the Redis spans'
// server.address; "" for a failover client, whose master moves.
func redisAddr(rdb redis.UniversalClient) string {
	if c, ok := rdb.(*redis.Client); ok {
		return c.Options().Addr
	}
	return ""
}
