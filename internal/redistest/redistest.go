// Package redistest starts real redis-server processes, each on a free
// port with its own data directory, so tests never share state and never
// depend on a Redis someone else left running. Launch works without a
// test (cmd/loadgen starts its Redis with it); Start ties the server to a
// test.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server child process.
type Server struct {
	Addr string // host:port
	Dir  string // data directory (AOF and RDB files live here)
	Port int

	args     []string
	sentinel string // the Sentinel's config file; "" for a redis-server
	cmd      *exec.Cmd
	exited   chan struct{} // closed once cmd has been reaped
	ownsDir  bool          // Launch made Dir, so Stop removes it
}

// Binary returns the redis-server binary to use: $REDIS_SERVER, else the
// one on PATH, else /usr/bin/redis-server.
func Binary() string {
	if b := os.Getenv("REDIS_SERVER"); b != "" {
		return b
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	return "/usr/bin/redis-server"
}

// Launch starts a fresh redis-server in a new temporary directory, which
// Stop removes. extra are additional config directives, e.g.
// "--appendonly", "yes".
func Launch(extra ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	s, err := launch(dir, extra)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.ownsDir = true
	return s, nil
}

// launch starts a server in dir. It tries a few ports: another process
// may take the free port between our probe and redis-server's bind.
func launch(dir string, extra []string) (*Server, error) {
	bin := Binary()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("redistest: redis-server not found at %s (install it: apt-get install redis-server): %w", bin, err)
	}
	s := &Server{Dir: dir, args: extra}
	var err error
	for range 5 {
		if s.Port, err = FreePort(); err != nil {
			continue
		}
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("redistest: %w", err)
}

// Start launches a fresh redis-server and stops it when the test ends.
// extra are additional config directives, e.g. "--appendonly", "yes".
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := launch(t.TempDir(), extra)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() error {
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
	args := []string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--dir", s.Dir, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--logfile", filepath.Join(s.Dir, "redis.log"),
	}
	if s.sentinel != "" {
		// A Sentinel reads (and rewrites) its config file, and has no
		// persistence of its own.
		args = []string{s.sentinel, "--sentinel", "--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
			"--dir", s.Dir, "--daemonize", "no", "--logfile", filepath.Join(s.Dir, "redis.log")}
	}
	args = append(args, s.args...)
	cmd := exec.Command(Binary(), args...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
		if err == nil {
			ok := ping(c)
			c.Close()
			if ok {
				s.cmd, s.exited = cmd, exited
				return nil
			}
		}
		select {
		case <-exited: // e.g. the port was taken
			deadline = time.Time{}
		case <-time.After(10 * time.Millisecond):
		}
	}
	cmd.Process.Kill()
	<-exited
	log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	return fmt.Errorf("redis-server on %s did not come up: %s", s.Addr, lastLines(string(log), 5))
}

func ping(c net.Conn) bool {
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// Kill stops the server with SIGKILL, as a crash would. The data
// directory stays, for Restart.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		<-s.exited
		s.cmd = nil
	}
}

// Signal sends sig to the server. The fault tests freeze it with
// SIGSTOP, a hung Redis: the kernel still accepts connections and takes
// writes, and nothing answers; SIGCONT thaws it. Kill works on a frozen
// server too.
func (s *Server) Signal(sig os.Signal) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return errors.New("redistest: signal: the server is not running")
	}
	return s.cmd.Process.Signal(sig)
}

// Stop kills the server and, if Launch made its data directory, removes
// it. It is safe to call twice.
func (s *Server) Stop() {
	s.Kill()
	if s.ownsDir {
		os.RemoveAll(s.Dir)
		s.ownsDir = false
	}
}

// Restart starts the server again on the same port and data directory,
// after Kill: the fault tests restart Redis with the data it persisted.
func (s *Server) Restart() error {
	if s.cmd != nil {
		return errors.New("redistest: restart: the server is still running")
	}
	if err := s.start(); err != nil {
		return fmt.Errorf("redistest: restart: %w", err)
	}
	return nil
}

// URL returns a redis:// URL for database 0 of the server.
func (s *Server) URL() string { return s.DBURL(0) }

// DBURL returns a redis:// URL for database db of the server.
func (s *Server) DBURL(db int) string { return "redis://" + s.Addr + "/" + strconv.Itoa(db) }

// Protocol is the RESP version the binaries' Redis clients speak
// (internal/app's newRedisClient: RESP2). The clients tests make speak it
// too, through NewClient and NewFailoverClient, so that a test sees the
// replies production sees; internal/app's tests check the two agree.
// Sentinel clients are left at go-redis's default, as the binaries'
// failover client leaves its connections to the Sentinels.
const Protocol = 2

// NewClient is redis.NewClient speaking the binaries' Protocol.
func NewClient(o *redis.Options) *redis.Client {
	o.Protocol = Protocol
	return redis.NewClient(o)
}

// NewFailoverClient is redis.NewFailoverClient speaking the binaries'
// Protocol to the master.
func NewFailoverClient(o *redis.FailoverOptions) *redis.Client {
	o.Protocol = Protocol
	return redis.NewFailoverClient(o)
}

// Client returns a client (NewClient) closed when the test ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redistest: ping %s: %v", s.Addr, err)
	}
	return c
}

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// FreePort returns a loopback port that was free a moment ago (see
// FreeAddr).
func FreePort() (int, error) {
	addr, err := FreeAddr()
	if err != nil {
		return 0, err
	}
	_, p, _ := net.SplitHostPort(addr)
	return strconv.Atoi(p)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// ScriptUsec is the time Redis has spent running scripts (EVALSHA and
// EVAL), in microseconds, from INFO commandstats: what a benchmark
// reports as a script's cost to Redis, which the client's wall time
// hides behind the round trip.
func ScriptUsec(tb testing.TB, rdb *redis.Client) float64 {
	tb.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				u, _ := strconv.ParseFloat(v, 64)
				total += u
			}
		}
	}
	return total
}
