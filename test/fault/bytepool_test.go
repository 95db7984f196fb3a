//go:build fault

package fault

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBytePoolFairShares holds the byte pool's fair shares (SECURITY.md,
// "bodies and results in memory") against real processes: keys that each
// stall 16 single-task bodies of 1 MiB (MAX_BODY_BYTES) on 16 connections,
// reopening each as soon as it is answered, cannot take the memory other
// keys need. While two such keys, then three, hold all the pool lets them,
// a fourth key's single tasks and 20-item batches are all accepted (2xx),
// each within 2 s, for stallWindow each.
//
// The stalled bodies are cut at their body deadline (BODY_READ_TIMEOUT 5 s
// here, plus 1 MiB at BODY_MIN_RATE 256 KiB/s: 9 s), so each window sees
// every stalled body of the abusive keys end and be reopened twice:
// everything a longer run would repeat (the keys filling the pool, their
// bodies all ending at once and the refill) happens in it.
// The pool is the default, MAX_BYTES_IN_FLIGHT 32 MiB with
// MAX_KEY_BYTES_IN_FLIGHT 16 MiB.
func TestBytePoolFairShares(t *testing.T) {
	timed(t)
	abusive := []string{"abuse-a", "abuse-c", "abuse-e"}
	var keys []string
	for _, o := range append([]string{"fourth"}, abusive...) {
		keys = append(keys, o+":"+o+"-secret-key-0123")
	}
	c := newCluster(t, clusterOpts{workers: 1, api: map[string]string{
		"API_KEYS":              strings.Join(keys, ","),
		"RATE_LIMIT_PER_SECOND": "10000", "RATE_LIMIT_BURST": "10000", "MAX_PENDING_PER_KEY": "1000000",
		"BODY_READ_TIMEOUT": "5s", "BODY_MIN_RATE": "256Ki",
	}})
	fourth := "fourth-secret-key-0123"
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	defer hc.CloseIdleConnections()
	reqs := eightPuzzles(20000, 77)
	next := 0
	take := func(n int) []string { next += n; return reqs[next-n : next] }

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var stallers []*staller
	for _, n := range []int{2, 3} {
		for len(stallers) < n {
			s := &staller{key: abusive[len(stallers)] + "-secret-key-0123", addr: strings.TrimPrefix(c.api.URL(), "http://")}
			stallers = append(stallers, s)
			for range stallConns {
				wg.Add(1)
				go func() { defer wg.Done(); s.run(ctx) }()
			}
		}
		// The abusive keys fill what the pool lets them before the
		// fourth key comes.
		time.Sleep(2 * time.Second)
		name := fmt.Sprintf("%d keys stalling", n)
		var singles, batches []time.Duration
		var held []int64
		end := time.Now().Add(stallWindow)
		for time.Now().Before(end) {
			took, err := timedPost(hc, c.api.URL(), fourth, "/v1/tasks", []byte(take(1)[0]))
			if err != nil || took > fairBound {
				t.Errorf("%s: the fourth key's single task: %v after %v, want 2xx within %v", name, err, took, fairBound)
			}
			singles = append(singles, took)
			took, err = timedPost(hc, c.api.URL(), fourth, "/v1/batches", batchBody(take(20)))
			if err != nil || took > fairBound {
				t.Errorf("%s: the fourth key's 20-item batch: %v after %v, want 2xx within %v", name, err, took, fairBound)
			}
			batches = append(batches, took)
			var h int64
			for _, s := range stallers {
				h += s.holding.Load()
			}
			held = append(held, h)
			time.Sleep(100 * time.Millisecond)
		}
		// The scenario tested something only if the abusive keys held
		// much of the pool meanwhile: at least 16 MiB of stalled bodies
		// (the pool is 32 MiB) most of the time.
		slices.Sort(held)
		if med := held[len(held)/2]; med < 16 {
			t.Errorf("%s: the abusive keys held a median of %d stalled 1 MiB bodies, want at least 16: the scenario tested nothing", name, med)
		}
		slices.Sort(singles)
		slices.Sort(batches)
		var refused, cut []int64
		for _, s := range stallers {
			refused, cut = append(refused, s.refused.Load()), append(cut, s.cut.Load())
		}
		t.Logf("byte pool, %s: FIGURES fourth_single_p50=%v fourth_single_max=%v fourth_batch20_p50=%v fourth_batch20_max=%v requests=%d stalled_conns_open_median=%d max=%d abusive_refused=%v abusive_cut_at_deadline=%v",
			name, pct(singles, 0.5).Round(time.Millisecond), pct(singles, 1).Round(time.Millisecond), pct(batches, 0.5).Round(time.Millisecond), pct(batches, 1).Round(time.Millisecond), len(singles)+len(batches),
			held[len(held)/2], held[len(held)-1], refused, cut)
	}
}

const (
	stallConns  = 16               // connections per abusive key
	stallBody   = 1 << 20          // the declared body: MAX_BODY_BYTES
	stallWindow = 20 * time.Second // how long the fourth key submits beside each set of abusive keys
	fairBound   = 2 * time.Second  // the fourth key's slowest acceptable answer
)

// staller is one abusive key: each of its connections sends all of a
// 1 MiB single-task body but its last byte and waits for the answer,
// then reconnects at once.
type staller struct {
	key, addr string
	holding   atomic.Int64 // bodies sent (to the socket) and not answered yet
	refused   atomic.Int64 // answered 429 or 503 (no room)
	cut       atomic.Int64 // answered 408 (the body's deadline)
}

func (s *staller) run(ctx context.Context) {
	head := "POST /v1/tasks HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer " + s.key +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(stallBody) + "\r\n\r\n"
	prefix := `{"kind":"sweep","puzzle":{"board":["`
	body := head + prefix + strings.Repeat(".", stallBody-len(prefix)-1)
	for ctx.Err() == nil {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", s.addr)
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		_ = conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		_, werr := conn.Write([]byte(body))
		if werr == nil {
			s.holding.Add(1)
		}
		_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if werr == nil {
			s.holding.Add(-1)
		}
		if err == nil {
			switch resp.StatusCode {
			case http.StatusTooManyRequests, http.StatusServiceUnavailable:
				s.refused.Add(1)
			case http.StatusRequestTimeout:
				s.cut.Add(1)
			}
			resp.Body.Close()
		}
		stop()
		conn.Close()
		if err != nil || werr != nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// timedPost posts body to path as key and returns how long the answer
// took; an error unless it is 2xx.
func timedPost(hc *http.Client, base, key, path string, body []byte) (time.Duration, error) {
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(string(body)))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := hc.Do(req)
	took := time.Since(start)
	if err != nil {
		return took, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b := make([]byte, 300)
		n, _ := resp.Body.Read(b)
		return took, fmt.Errorf("%d %s (Retry-After %q)", resp.StatusCode, b[:n], resp.Header.Get("Retry-After"))
	}
	return took, nil
}
