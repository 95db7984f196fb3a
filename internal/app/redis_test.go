package app

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/redistest"
)

// TestRedisConnLoadsScriptsOnConnect: the client the binaries use runs
// the store's script loader on a new connection before its first command,
// which is what keeps a restarted Redis from answering NOSCRIPT (the
// store's TestScriptsPreloadedAfterRestart shows the restart itself).
func TestRedisConnLoadsScriptsOnConnect(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	_, rdb, err := redisConn(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	info := r.Client(t).Info(ctx, "commandstats").Val()
	if !strings.Contains(info, "cmdstat_script|exists:") || !strings.Contains(info, "cmdstat_script|load:") {
		t.Fatalf("a new connection did not look up and load the scripts:\n%s", info)
	}
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
