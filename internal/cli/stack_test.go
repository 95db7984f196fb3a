package cli_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/app"
	"github.com/puzzleq/puzzleq/internal/redistest"
)

// stack is a real deployment in miniature: a redis-server process, the
// API and a worker, wired by the same code as the binaries.
type stack struct {
	t    *testing.T
	base string
	rdb  *redis.Client
}

func testLogger() *slog.Logger {
	if os.Getenv("PUZZLEQ_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startStack starts redis, the API and, unless workers is 0, a worker.
func startStack(t *testing.T, workers int) *stack {
	t.Helper()
	r := redistest.Start(t)
	env := map[string]string{"REDIS_URL": r.URL(), "HTTP_ADDR": "127.0.0.1:0", "TASK_CHECK_INTERVAL": "5ms", "PDB_PRELOAD": "false"}
	getenv := func(k string) string { return env[k] }
	cfg, err := app.LoadAPIConfig(nil, getenv, io.Discard)
	if err != nil {
		t.Fatalf("api config: %v", err)
	}
	a, err := app.NewAPI(cfg, testLogger())
	if err != nil {
		t.Fatalf("new api: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.Run(ctx) }()
	for range workers {
		wcfg, err := app.LoadWorkerConfig(nil, getenv, io.Discard)
		if err != nil {
			t.Fatalf("worker config: %v", err)
		}
		w, err := app.NewWorker(wcfg, testLogger())
		if err != nil {
			t.Fatalf("new worker: %v", err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); w.Run(ctx); w.Close() }()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		a.Close()
	})
	s := &stack{t: t, base: "http://" + a.Addr(), rdb: r.Client(t)}
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(s.base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("api never became ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

// submitted reads the API's puzzleq_submitted_total, summed over kinds.
func (s *stack) submitted() int {
	s.t.Helper()
	resp, err := http.Get(s.base + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n := 0
	for _, m := range regexp.MustCompile(`(?m)^puzzleq_submitted_total\{[^}]*\} (\S+)$`).FindAllStringSubmatch(string(b), -1) {
		f, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			s.t.Fatal(err)
		}
		n += int(f)
	}
	return n
}

func (s *stack) keys(pattern string) int {
	s.t.Helper()
	n := 0
	iter := s.rdb.Scan(context.Background(), 0, pattern, 1000).Iterator()
	for iter.Next(context.Background()) {
		n++
	}
	if err := iter.Err(); err != nil {
		s.t.Fatal(err)
	}
	return n
}

// flakyProxy forwards TCP to target, but drops the first `drops`
// connections whose response starts with "HTTP/1.1 202" (an accepted batch
// POST) before the client sees a byte of it: the server did the work and
// the client lost the answer.
type flakyProxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	drops   int
	dropped int
	conns   map[net.Conn]bool
	wg      sync.WaitGroup
}

func startFlakyProxy(t *testing.T, target string, drops int) *flakyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &flakyProxy{ln: ln, target: target, drops: drops, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *flakyProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *flakyProxy) Dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

func (p *flakyProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.handle(c) }()
	}
}

// track registers c to be closed by the test's cleanup; false once closed.
func (p *flakyProxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

func (p *flakyProxy) handle(c net.Conn) {
	defer c.Close()
	p.track(c, true)
	defer p.track(c, false)
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer u.Close()
	p.track(u, true)
	defer p.track(u, false)
	go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := u.Read(buf)
		if n > 0 {
			if strings.HasPrefix(string(buf[:n]), "HTTP/1.1 202") {
				p.mu.Lock()
				drop := p.dropped < p.drops
				if drop {
					p.dropped++
				}
				p.mu.Unlock()
				if drop {
					return // close both sides without forwarding the answer
				}
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
