package app

import (
	"context"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
)

// TestRedisConnLoadsScriptsOnConnect: the client the binaries use runs
// the store's script loader on a new connection before its first command,
// which is what keeps a restarted Redis from answering NOSCRIPT (the
// store's TestScriptsPreloadedAfterRestart shows the restart itself).
func TestRedisConnLoadsScriptsOnConnect(t *testing.T) {
	t.Parallel()
	r, rdb := binariesClient(t)
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	info := r.Client(t).Info(ctx, "commandstats").Val()
	if !strings.Contains(info, "cmdstat_script|exists:") || !strings.Contains(info, "cmdstat_script|load:") {
		t.Fatalf("a new connection did not look up and load the scripts:\n%s", info)
	}
}

// binariesClient starts a redis-server and connects to it as the binaries
// do (redisConn).
func binariesClient(t *testing.T) (*redistest.Server, redis.UniversalClient) {
	t.Helper()
	r := redistest.Start(t)
	_, rdb, err := redisConn(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return r, rdb
}

// TestNewRedisClientKeepsAsynqOptions: newRedisClient adds the OnConnect
// hook and otherwise builds the client asynq would, so that asynq and the
// store keep talking to the same Redis the same way.
func TestNewRedisClientKeepsAsynqOptions(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"redis://u:p@127.0.0.1:1/3", "rediss://:p@127.0.0.1:1/0", "redis-socket:///tmp/none.sock?db=2"} {
		opt, rdb, err := redisConn(url)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		theirs := opt.MakeRedisClient().(*redis.Client)
		ours := rdb.(*redis.Client).Options()
		want := theirs.Options()
		if ours.OnConnect == nil {
			t.Errorf("%s: no OnConnect hook", url)
		}
		if ours.Network != want.Network || ours.Addr != want.Addr || ours.Username != want.Username ||
			ours.Password != want.Password || ours.DB != want.DB || ours.DialTimeout != want.DialTimeout ||
			ours.ReadTimeout != want.ReadTimeout || ours.WriteTimeout != want.WriteTimeout ||
			ours.PoolSize != want.PoolSize || (ours.TLSConfig == nil) != (want.TLSConfig == nil) {
			t.Errorf("%s: options differ from asynq's:\nours   %+v\nasynq's %+v", url, ours, want)
		}
		theirs.Close()
		rdb.Close()
	}
}

// TestRedisClientsSpeakTheTestsProtocol: the binaries' clients speak the
// RESP version the tests' clients do (redistest.Protocol), so a test sees
// the replies production sees.
func TestRedisClientsSpeakTheTestsProtocol(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"redis://127.0.0.1:1/0", "redis-sentinel://127.0.0.1:1,127.0.0.1:2?master=m"} {
		_, rdb, err := redisConn(url)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		if p := rdb.(*redis.Client).Options().Protocol; p != redistest.Protocol {
			t.Errorf("%s: the binaries' client speaks RESP%d, the tests' clients RESP%d", url, p, redistest.Protocol)
		}
		rdb.Close()
	}
}

// hungRedis listens on a free port and accepts connections, reading what
// is sent and never answering: a frozen Redis as its clients see it.
func hungRedis(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	return "redis://" + ln.Addr().String() + "/0"
}

// TestRedisCallsFailFastWhenRedisHangs: on a Redis that takes commands
// and never answers, a call ends at its deadline, not at the socket's
// redisIOTimeout and again at each of go-redis's retries: the caller's
// context bounds the socket (ContextTimeoutEnabled), and the API's hook
// (callDeadline) bounds a call with no deadline of its own, retries
// included. The bounds asserted are a third of the socket's timeout;
// the calls' own are far below them.
func TestRedisCallsFailFastWhenRedisHangs(t *testing.T) {
	t.Parallel()
	url := hungRedis(t)
	cases := []struct {
		name string
		hook bool
		call func(ctx context.Context, rdb redis.UniversalClient) error
	}{
		{"context deadline", false, func(ctx context.Context, rdb redis.UniversalClient) error {
			ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			return rdb.Ping(ctx).Err()
		}},
		{"hook, command", true, func(ctx context.Context, rdb redis.UniversalClient) error {
			return rdb.Get(ctx, "k").Err()
		}},
		{"hook, pipeline", true, func(ctx context.Context, rdb redis.UniversalClient) error {
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.Get(ctx, "a")
				p.Get(ctx, "b")
				return nil
			})
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, rdb, err := redisConn(url)
			if err != nil {
				t.Fatal(err)
			}
			defer rdb.Close()
			if tc.hook {
				rdb.AddHook(callDeadline(100 * time.Millisecond))
			}
			start := time.Now()
			err = tc.call(context.Background(), rdb)
			took := time.Since(start)
			if err == nil {
				t.Fatal("a call to a Redis that never answers succeeded")
			}
			if took > redisIOTimeout/3 {
				t.Errorf("the call failed after %v (%v), want at its 100ms deadline, far below the socket's %v", took, err, redisIOTimeout)
			}
		})
	}
}

// TestCallDeadlineKeepsSoonerDeadline: the hook never extends a caller's
// deadline, and adds one where there is none.
func TestCallDeadlineKeepsSoonerDeadline(t *testing.T) {
	d := callDeadline(time.Minute)
	soon, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	want, _ := soon.Deadline()
	ctx, c1 := d.bound(soon)
	defer c1()
	if got, _ := ctx.Deadline(); !got.Equal(want) {
		t.Errorf("deadline %v, want the caller's %v", got, want)
	}
	ctx, c2 := d.bound(context.Background())
	defer c2()
	if got, ok := ctx.Deadline(); !ok || time.Until(got) > time.Minute || time.Until(got) < 59*time.Second {
		t.Errorf("deadline %v (%v), want a minute from now", got, ok)
	}
}

// TestIdleConnectionClosedByRedis: the binaries' clients let go-redis
// check a pooled connection's socket only once it sat idle for
// peekAfterIdle (idlePeekDial). A connection that Redis closed while it
// sat idle that long must be found by the check, invisibly to callers:
// each kind of call the store makes (a command, a script, a pipeline)
// succeeds on the first try after Redis dropped every idle connection,
// and runs once. (Without the check the calls fail with EOF: go-redis's
// retries land on the pool's other dead connections.)
func TestIdleConnectionClosedByRedis(t *testing.T) {
	t.Parallel()
	r, rdb := binariesClient(t)
	ctx := context.Background()
	admin := r.Client(t)
	single, ok := rdb.(*redis.Client)
	if !ok {
		t.Fatalf("the binaries' client for one Redis is a %T, want *redis.Client", rdb)
	}
	script := redis.NewScript(`return redis.call("INCR", KEYS[1])`)
	calls := []struct {
		name string
		do   func() error
	}{
		{"command", func() error { return rdb.Set(ctx, "k", "v", 0).Err() }},
		{"script", func() error { return script.Run(ctx, rdb, []string{"n"}).Err() }},
		{"pipeline", func() error {
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.Get(ctx, "k")
				p.Incr(ctx, "n")
				return nil
			})
			return err
		}},
	}
	for _, c := range calls {
		// Fill the pool with several connections, let them sit idle, then
		// have Redis close every one of them but the admin's. Each is held
		// while the others are taken, so the pool holds six: concurrent
		// pings alone could all share one connection on a loaded machine.
		conns := make([]*redis.Conn, 6)
		for i := range conns {
			conns[i] = single.Conn()
			if err := conns[i].Ping(ctx).Err(); err != nil {
				t.Fatalf("ping: %v", err)
			}
		}
		for _, cn := range conns {
			cn.Close() // back to the pool
		}
		time.Sleep(peekAfterIdle + 50*time.Millisecond)
		killed, err := admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Result()
		if err != nil || killed < int64(len(conns)) {
			t.Fatalf("CLIENT KILL: %d killed, %v", killed, err)
		}
		if err := c.do(); err != nil {
			t.Errorf("%s on a connection Redis closed while idle: %v", c.name, err)
		}
	}
	if n := admin.Get(ctx, "n").Val(); n != "2" {
		t.Errorf("the script and the pipeline incremented n to %s, want 2 (once each)", n)
	}
}

// TestIdlePeekSkipsOnlyRecentConnections: the wrapped connection's
// RawConn runs go-redis's peek only after peekAfterIdle without a read or
// a write, and a connection without SyscallConn (TLS) is left as it is.
func TestIdlePeekSkipsOnlyRecentConnections(t *testing.T) {
	t.Parallel()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	dial := idlePeekDial{}.DialHook(func(context.Context, string, string) (net.Conn, error) { return raw, nil })
	c, err := dial(context.Background(), "tcp", "x")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, ok := c.(syscall.Conn)
	if !ok {
		t.Fatalf("%T hides SyscallConn: go-redis would never check it", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	peeked := func() bool {
		called := false
		if err := rc.Read(func(uintptr) bool { called = true; return true }); err != nil {
			t.Fatal(err)
		}
		return called
	}
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if peeked() {
		t.Error("a connection written a moment ago was peeked")
	}
	time.Sleep(peekAfterIdle + 20*time.Millisecond)
	if !peeked() {
		t.Errorf("a connection idle for over %s was not peeked", peekAfterIdle)
	}
	a, b := net.Pipe()
	defer b.Close()
	pc, err := idlePeekDial{}.DialHook(func(context.Context, string, string) (net.Conn, error) { return a, nil })(context.Background(), "tcp", "x")
	if err != nil || pc != a {
		t.Errorf("a connection without SyscallConn came back as %T (%v), want it unwrapped", pc, err)
	}
	if _, err := (idlePeekDial{}).DialHook(func(context.Context, string, string) (net.Conn, error) {
		return nil, io.ErrClosedPipe
	})(context.Background(), "tcp", "x"); err != io.ErrClosedPipe {
		t.Errorf("a dial error: got %v", err)
	}
}

// A worker's call without a deadline (asynq's loops) that Redis refuses
// as a write returns refusalPause later, single or in a pipeline, so
// asynq's dequeue loop does not spin on a full Redis; reads, a write Redis
// takes and a refused call with a deadline return at once.
func TestWorkerPausesOnRefusedWrites(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	admin := r.Client(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, Protocol: 2})
	t.Cleanup(func() { rdb.Close() })
	// A longer pause than the worker's, so "at once" and "paused" stay
	// apart on a loaded machine.
	const pause = 500 * time.Millisecond
	rdb.AddHook(pauseOnRefusal(pause))

	timed := func(f func() error) (time.Duration, error) {
		start := time.Now()
		err := f()
		return time.Since(start), err
	}
	if d, err := timed(func() error { return rdb.Set(ctx, "k", "v", 0).Err() }); err != nil || d >= pause {
		t.Fatalf("a write Redis takes: %v after %v", err, d)
	}
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	d, err := timed(func() error { return rdb.Set(ctx, "k2", "v", 0).Err() })
	if !store.RefusesWrites(err) || d < pause {
		t.Errorf("a refused write: %v after %v, want OOM after at least %v", err, d, pause)
	}
	d, err = timed(func() error {
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Get(ctx, "k")
			p.Set(ctx, "k3", "v", 0)
			return nil
		})
		return err
	})
	if !store.RefusesWrites(err) || d < pause {
		t.Errorf("a pipeline with a refused write: %v after %v, want OOM after at least %v", err, d, pause)
	}
	if d, err := timed(func() error { return rdb.Get(ctx, "k").Err() }); err != nil || d >= pause {
		t.Errorf("a read: %v after %v, want at once", err, d)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if d, err := timed(func() error { return rdb.Set(cctx, "k4", "v", 0).Err() }); !store.RefusesWrites(err) || d >= pause {
		t.Errorf("a refused write with a deadline: %v after %v, want OOM at once", err, d)
	}
}

// TestMasterWatch: the connection hook reports a Redis restarted on the
// same address (a new run ID) once, on the first connection after it, and
// nothing for connections that only reconnect to the same server, nor for
// a failover client's connections to its Sentinels.
func TestMasterWatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := redistest.Start(t)
	type change struct{ old, new string }
	changes := make(chan change, 10)
	watch := &masterWatch{}
	watch.notify(func(o, n string) { changes <- change{o, n} })
	_, rdb, err := redisConn(r.URL(), watch.onConnect)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	first := serverRunID(t, rdb)

	// The same server, its connections cut: no change.
	if err := r.Client(t).ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	if again := serverRunID(t, rdb); again != first {
		t.Fatalf("run ID %s, then %s with no restart", first, again)
	}
	select {
	case c := <-changes:
		t.Fatalf("a reconnection to the same server reported a change: %+v", c)
	default:
	}

	// Restarted: one change, from the old run ID to the new.
	r.Kill()
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	second := serverRunID(t, rdb)
	select {
	case c := <-changes:
		if c.old != first || c.new != second || first == second {
			t.Errorf("change %+v, want %s -> %s", c, first, second)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a restarted Redis was not reported")
	}
	serverRunID(t, rdb)
	select {
	case c := <-changes:
		t.Errorf("a second change reported: %+v", c)
	default:
	}

	// Through a Sentinel: its own connections are not a master's.
	s := redistest.StartSentinel(t, redistest.SentinelOpts{Name: "pqwatch", Master: r.Addr, Quorum: 1, DownAfter: time.Second})
	watch2 := &masterWatch{}
	watch2.notify(func(o, n string) { changes <- change{o, n} })
	_, frdb, err := redisConn("redis-sentinel://"+s.Addr+"?master=pqwatch", watch2.onConnect)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { frdb.Close() })
	if id := serverRunID(t, frdb); id != second {
		t.Fatalf("through the Sentinel: run ID %s, want the master's %s", id, second)
	}
	if err := frdb.Set(ctx, "pq:watch", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-changes:
		t.Errorf("connections through a Sentinel reported a change: %+v", c)
	default:
	}
}

// serverRunID is the run ID of the server rdb reaches, read once it
// answers again.
func serverRunID(t *testing.T, rdb redis.UniversalClient) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := rdb.Info(context.Background(), "server").Result()
		if err == nil {
			if id := infoFields(info, "run_id")["run_id"]; id != "" {
				return id
			}
			t.Fatal("no run_id in INFO server")
		}
		if time.Now().After(deadline) {
			t.Fatalf("INFO server: %v", err)
		}
	}
}
