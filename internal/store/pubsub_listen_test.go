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

// TestListenResubscribes: the listener reads its subscription itself
// (not through go-redis's Channel), so its health check is its own. It
// must get events again after Redis restarts, after its connection goes
// silent (a ping unanswered for the health interval: it subscribes again
// on a new connection), and after a freeze; and it must end with its
// ctx even while its connection is silent.
func TestListenResubscribes(t *testing.T) {
	t.Parallel()
	const health = 300 * time.Millisecond
	setup := func(t *testing.T, addr string) (s *Store, got chan string, stop func() bool) {
		t.Helper()
		rdb := redistest.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		s = New(rdb, Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
		s.listenHealth = health
		got = make(chan string, 1024)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); s.listen(ctx, s.k.events(), func(m string) { got <- m }) }()
		stop = func() bool {
			cancel()
			select {
			case <-done:
				return true
			case <-time.After(2 * time.Second):
				return false
			}
		}
		t.Cleanup(func() { stop() })
		return s, got, stop
	}
	// delivered publishes msg on pub every 20 ms until the listener gets
	// it, and returns how long that took; it fails after bound.
	delivered := func(t *testing.T, pub *redis.Client, channel, msg string, got chan string, bound time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			_ = pub.Publish(context.Background(), channel, msg).Err()
			select {
			case m := <-got:
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

	t.Run("redis restarted", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		pub := srv.Client(t)
		s, got, _ := setup(t, srv.Addr)
		delivered(t, pub, s.k.events(), "before", got, 5*time.Second)
		srv.Kill()
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		d := delivered(t, pub, s.k.events(), "after", got, 10*time.Second)
		t.Logf("delivered %s after the restart", d.Round(time.Millisecond))
	})

	t.Run("silent connection", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		pub := srv.Client(t)
		proxy := newStallProxy(t, srv.Addr)
		s, got, stop := setup(t, proxy.ln.Addr().String())
		delivered(t, pub, s.k.events(), "before", got, 5*time.Second)
		before := proxy.accepted.Load()
		proxy.stall()
		// The stalled subscription's ping goes unanswered: it is dropped
		// after about two health intervals and a new one made.
		d := delivered(t, pub, s.k.events(), "after", got, 10*time.Second)
		if n := proxy.accepted.Load(); n <= before {
			t.Fatalf("delivered without a new connection (%d, %d before)", n, before)
		}
		if d < health {
			t.Fatalf("delivered %s after the stall, before any health check could have run: the stall did not hold", d)
		}
		t.Logf("delivered %s after the stall, on a new connection", d.Round(time.Millisecond))
		// A silent connection does not hold the listener past its ctx.
		proxy.stall()
		if !stop() {
			t.Fatal("listen did not return within 2 s of its ctx ending, on a stalled connection")
		}
	})

	t.Run("redis frozen", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		pub := srv.Client(t)
		s, got, _ := setup(t, srv.Addr)
		delivered(t, pub, s.k.events(), "before", got, 5*time.Second)
		if err := srv.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * health) // the listener gives the connection up meanwhile
		if err := srv.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		d := delivered(t, pub, s.k.events(), "after", got, 10*time.Second)
		t.Logf("delivered %s after SIGCONT", d.Round(time.Millisecond))
	})
}
