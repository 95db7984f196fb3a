package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelOpts configure StartSentinel.
type SentinelOpts struct {
	// Name is the master's name (sentinel monitor Name ...).
	Name string
	// Master is the master's host:port.
	Master string
	// Quorum is how many Sentinels must agree the master is down.
	Quorum int
	// DownAfter is how long the master must not answer to be down; Redis's
	// default of 30 s is for real networks, a test wants about 1 s.
	DownAfter time.Duration
}

// StartSentinel starts a Redis Sentinel (redis-server --sentinel) on a
// free port, watching o.Master, and stops it when the test ends. Sentinels
// watching the same master find each other and the master's replicas
// through the master, within a few seconds (see WaitSentinels).
func StartSentinel(t testing.TB, o SentinelOpts) *Server {
	t.Helper()
	dir := t.TempDir()
	host, port, err := net.SplitHostPort(o.Master)
	if err != nil {
		t.Fatalf("redistest: sentinel: master %q: %v", o.Master, err)
	}
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s %[4]d\n"+
		"sentinel down-after-milliseconds %[1]s %[5]d\n"+
		"sentinel failover-timeout %[1]s 10000\n"+
		"sentinel parallel-syncs %[1]s 1\n", o.Name, host, port, o.Quorum, o.DownAfter.Milliseconds())
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &Server{Dir: dir, sentinel: conf}
	for range 5 {
		if s.Port, err = FreePort(); err != nil {
			continue
		}
		if err = s.start(); err == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: sentinel: %v", err)
	return nil
}

// WaitSentinels waits up to d until every Sentinel knows the others and
// replicas replicas of master name: before that, a failover could not
// choose a replica or reach its quorum.
func WaitSentinels(t testing.TB, name string, replicas int, d time.Duration, sentinels ...*Server) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(d)
	for _, s := range sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
		for {
			others, err1 := c.Sentinels(ctx, name).Result()
			reps, err2 := c.Replicas(ctx, name).Result()
			if err1 == nil && err2 == nil && len(others) == len(sentinels)-1 && len(reps) >= replicas {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("redistest: sentinel %s knows %d other sentinels (%v) and %d replicas (%v) of %s after %v, want %d and %d",
					s.Addr, len(others), err1, len(reps), err2, name, d, len(sentinels)-1, replicas)
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Close()
	}
}

// MasterAddr asks a Sentinel which address it holds for master name.
func MasterAddr(ctx context.Context, sentinel *Server, name string) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer c.Close()
	hp, err := c.GetMasterAddrByName(ctx, name).Result()
	if err != nil {
		return "", err
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("redistest: sentinel answered %v", hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// ReplicaOf is the redis-server directive that makes a server replicate
// master (host:port), for Start's extra.
func ReplicaOf(master string) []string {
	host, port, _ := net.SplitHostPort(master)
	return []string{"--replicaof", host, port}
}
