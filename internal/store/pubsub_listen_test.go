package store

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/redistest"
)

// stallProxy forwards TCP connections to a Redis. stall makes every
// connection open now stop forwarding, both ways, without closing it: a
// link that drops packets with no reset, which no read ever notices by
// itself. Connections accepted afterwards forward normally.
type stallProxy struct {
	ln       net.Listener
	accepted atomic.Int32

	mu    sync.Mutex
	conns []*stallPair
}

type stallPair struct {
	stalled atomic.Bool
	a, b    net.Conn
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln}
	t.Cleanup(p.close)
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				a.Close()
				continue
			}
			p.accepted.Add(1)
			pair := &stallPair{a: a, b: b}
			p.mu.Lock()
			p.conns = append(p.conns, pair)
			p.mu.Unlock()
			go pair.pipe(a, b)
			go pair.pipe(b, a)
		}
	}()
	return p
}

// pipe copies from src to dst until either fails, dropping what it reads
// once the pair is stalled.
func (c *stallPair) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !c.stalled.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			return
		}
	}
}

func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.stalled.Store(true)
	}
}

func (p *stallProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.a.Close()
		c.b.Close()
	}
}

// listening is a Store listening to its events channel on a Redis
// reached at an address of the test's choosing, with a client of its own
// on that Redis to publish.
type listening struct {
	s    *Store
	pub  *redis.Client
	got  chan string
	stop func() bool // ends the listener; false if it had not returned 2 s later
}

// startListening starts listen with health interval health on a client
// of addr (srv itself, or a proxy in front of it), and waits until an
// event published on srv reaches it.
func startListening(t *testing.T, srv *redistest.Server, addr string, health time.Duration) *listening {
	t.Helper()
	rdb := redistest.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	l := &listening{s: New(rdb, Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour}),
		pub: srv.Client(t), got: make(chan string, 1024)}
	l.s.listenHealth = health
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.s.listen(ctx, l.s.k.events(), func(m string) { l.got <- m }) }()
	l.stop = func() bool {
		cancel()
		select {
		case <-done:
			return true
		case <-time.After(2 * time.Second):
			return false
		}
	}
	t.Cleanup(func() { l.stop() })
	l.delivered(t, "before", 5*time.Second)
	return l
}

// delivered publishes msg every 20 ms until the listener gets it, and
// returns how long that took; it fails after bound.
func (l *listening) delivered(t *testing.T, msg string, bound time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		_ = l.pub.Publish(context.Background(), l.s.k.events(), msg).Err()
		select {
		case m := <-l.got:
			if m == msg {
				return time.Since(start)
			}
		case <-tick.C:
		}
		if time.Since(start) > bound {
			t.Fatalf("%q not delivered within %s", msg, bound)
		}
	}
}

// TestListenResubscribes: the listener reads its subscription itself
// (not through go-redis's Channel), so its health check is its own. It
// must get events again after Redis restarts, after its connection goes
// silent (a ping unanswered for the health interval: it subscribes again
// on a new connection), and after a freeze; and it must end with its
// ctx even while its connection is silent.
func TestListenResubscribes(t *testing.T) {
	t.Parallel()
	const health = 300 * time.Millisecond

	t.Run("redis restarted", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		l := startListening(t, srv, srv.Addr, health)
		srv.Kill()
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		d := l.delivered(t, "after", 10*time.Second)
		t.Logf("delivered %s after the restart", d.Round(time.Millisecond))
	})

	t.Run("silent connection", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		proxy := newStallProxy(t, srv.Addr)
		l := startListening(t, srv, proxy.ln.Addr().String(), health)
		before := proxy.accepted.Load()
		proxy.stall()
		// The stalled subscription's ping goes unanswered: it is dropped
		// after about two health intervals and a new one made.
		d := l.delivered(t, "after", 10*time.Second)
		if n := proxy.accepted.Load(); n <= before {
			t.Fatalf("delivered without a new connection (%d, %d before)", n, before)
		}
		if d < health {
			t.Fatalf("delivered %s after the stall, before any health check could have run: the stall did not hold", d)
		}
		t.Logf("delivered %s after the stall, on a new connection", d.Round(time.Millisecond))
		// A silent connection does not hold the listener past its ctx.
		proxy.stall()
		if !l.stop() {
			t.Fatal("listen did not return within 2 s of its ctx ending, on a stalled connection")
		}
	})

	// A recovery check, not of the health check: a connection to a Redis
	// that resumes works again whether or not the listener gave it up
	// meanwhile (4 health intervals: it may have, more than once).
	t.Run("redis frozen", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		l := startListening(t, srv, srv.Addr, health)
		if err := srv.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * health)
		if err := srv.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		d := l.delivered(t, "after", 10*time.Second)
		t.Logf("delivered %s after SIGCONT", d.Round(time.Millisecond))
	})
}
