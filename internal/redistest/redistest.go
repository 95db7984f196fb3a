// Package redistest starts real redis-server processes for tests, each on
// a free port with its own data directory, so tests never share state and
// never depend on a Redis someone else left running.
package redistest

import (
	"bufio"
	"context"
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

	t    testing.TB
	args []string
	cmd  *exec.Cmd
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

// Start launches a fresh redis-server and stops it when the test ends.
// extra are additional config directives, e.g. "--appendonly", "yes".
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := Binary()
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("redistest: redis-server not found at %s (install it: apt-get install redis-server): %v", bin, err)
	}
	s := &Server{t: t, Dir: t.TempDir()}
	s.args = extra
	for attempt := 0; ; attempt++ {
		s.Port = freePort(t)
		err := s.start()
		if err == nil {
			break
		}
		if attempt == 4 {
			t.Fatalf("redistest: %v", err)
		}
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
	args = append(args, s.args...)
	cmd := exec.Command(Binary(), args...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
		if err == nil {
			ok := ping(c)
			c.Close()
			if ok {
				return nil
			}
		}
		if cmd.ProcessState != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
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

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

// Stop shuts the server down. It is safe to call twice.
func (s *Server) Stop() { s.Kill() }

// Restart starts the server again on the same port and data directory.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
}

// URL returns a redis:// URL for the server.
func (s *Server) URL() string { return "redis://" + s.Addr + "/0" }

// Client returns a go-redis client closed when the test ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redistest: ping %s: %v", s.Addr, err)
	}
	return c
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
