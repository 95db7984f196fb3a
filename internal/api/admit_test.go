package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/app"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// The tests in this file drive a real API (app.NewAPI on a real
// redis-server) with real TCP clients on 127.0.0.1, some of them slow on
// purpose: admission and body deadlines are about sockets, so a recorder
// would prove nothing.

// envOf serves a map as the environment a Config is loaded from.
func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// run starts fn(ctx) in a goroutine and arranges for the test to stop it
// and wait for it before the cleanups of resources it uses.
func run(t *testing.T, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("a server did not stop within 10s")
		}
	})
}

// admitAPI starts an API with no worker on its own Redis.
func admitAPI(t *testing.T, extra map[string]string) *app.API {
	t.Helper()
	logs := stacktest.Logs(t)
	rs := redistest.Start(t)
	env := map[string]string{
		"REDIS_URL": rs.URL(), "HTTP_ADDR": "127.0.0.1:0", "SHUTDOWN_TIMEOUT": "2s",
		"LOG_LEVEL": "warn", "KEY_PREFIX": "admit:", "PDB_PRELOAD": "false",
	}
	for k, v := range extra {
		env[k] = v
	}
	cfg, err := app.LoadAPIConfig(nil, envOf(env), io.Discard)
	if err != nil {
		t.Fatalf("api config: %v", err)
	}
	a, err := app.NewAPI(cfg, cfg.Logger(logs))
	if err != nil {
		t.Fatalf("NewAPI: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	run(t, a.Run)
	return a
}

// slowUpload is a raw TCP client that declares a body and then sends it
// one byte per interval, like a client on a dying link (or an attacker).
type slowUpload struct {
	conn    net.Conn
	started time.Time
	answer  chan slowAnswer
}

type slowAnswer struct {
	status int
	body   []byte
	after  time.Duration // since the headers were sent
	err    error
}

// startSlowUpload sends the headers of a POST with a Content-Length of
// declared bytes, then at most maxBytes of its body, one per interval,
// and reads the answer whenever it comes.
func startSlowUpload(t *testing.T, addr, path string, declared, maxBytes int, interval time.Duration) *slowUpload {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	u := &slowUpload{conn: conn, answer: make(chan slowAnswer, 1)}
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, addr, declared)
	u.started = time.Now()
	stop := make(chan struct{})
	go func() {
		body := []byte(`{"tasks":[` + strings.Repeat(" ", declared))
		for i := 0; i < maxBytes && i < len(body); i++ {
			if _, err := conn.Write(body[i : i+1]); err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(interval):
			}
		}
	}()
	go func() {
		defer close(stop)
		u.await()
	}()
	return u
}

// await reads the server's answer and hands it to u.answer.
func (u *slowUpload) await() {
	resp, err := http.ReadResponse(bufio.NewReader(u.conn), nil)
	if err != nil {
		u.answer <- slowAnswer{err: err, after: time.Since(u.started)}
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	u.answer <- slowAnswer{status: resp.StatusCode, body: b, after: time.Since(u.started)}
}

// answered reports whether the server has answered the upload yet.
func (u *slowUpload) answered() bool { return len(u.answer) > 0 }

// eightPuzzles returns a batch body of n distinct solvable 8-puzzles
// starting at the seed-th one.
func eightPuzzles(n, seed int) []byte {
	var items []string
	perm := []int{1, 2, 3, 4, 5, 6, 7, 8, 0}
	// Walk the blank around: every step gives another solvable board.
	moves := []int{-1, -3, 1, 3}
	blank := 8
	for len(items) < n+seed {
		m := moves[(len(items)*7+len(items)/3)%4]
		nb := blank + m
		if nb < 0 || nb > 8 || (m == -1 && blank%3 == 0) || (m == 1 && blank%3 == 2) {
			m = -m
			nb = blank + m
			if nb < 0 || nb > 8 || (m == -1 && blank%3 == 0) || (m == 1 && blank%3 == 2) {
				continue
			}
		}
		perm[blank], perm[nb] = perm[nb], perm[blank]
		blank = nb
		items = append(items, fmt.Sprintf(`{"kind":"sliding","puzzle":{"board":[[%d,%d,%d],[%d,%d,%d],[%d,%d,%d]]}}`,
			perm[0], perm[1], perm[2], perm[3], perm[4], perm[5], perm[6], perm[7], perm[8]))
	}
	return []byte(`{"tasks":[` + strings.Join(items[seed:], ",") + `]}`)
}

func postBatch(t *testing.T, c *http.Client, addr string, body []byte) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := c.Post("http://"+addr+"/v1/batches", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST /v1/batches: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		t.Errorf("POST /v1/batches: %d %s", resp.StatusCode, b)
	}
	return resp.StatusCode, time.Since(start)
}

// Four uploads that send one byte per interval take no slot from anyone:
// batch submissions made while they trickle are answered while they are
// still being read, and then each slow one is cut off with a 408 at its
// deadline. Before admission by bytes, the four held the four decode
// slots and every other batch waited for them and failed.
func TestSlowUploadsDoNotBlockBatches(t *testing.T) {
	const bodyTimeout = 4 * time.Second
	a := admitAPI(t, map[string]string{"BODY_READ_TIMEOUT": bodyTimeout.String(), "REQUEST_TIMEOUT": "10s",
		"RATE_LIMIT_PER_SECOND": "1000", "RATE_LIMIT_BURST": "1000"})
	c := &http.Client{Timeout: 20 * time.Second}

	// The same submissions' time on the idle server, for the log.
	var quiet []time.Duration
	for i := range 3 {
		_, d := postBatch(t, c, a.Addr(), eightPuzzles(50, 100*i))
		quiet = append(quiet, d)
	}

	var slow []*slowUpload
	for range 4 {
		// 1 MB declared, 40 bytes sent at most: never complete.
		slow = append(slow, startSlowUpload(t, a.Addr(), "/v1/batches", 1<<20, 40, 250*time.Millisecond))
	}
	time.Sleep(500 * time.Millisecond) // the server is reading all four

	var busy []time.Duration
	for i := range 3 {
		_, d := postBatch(t, c, a.Addr(), eightPuzzles(50, 1000+100*i))
		busy = append(busy, d)
	}
	for i, u := range slow {
		if u.answered() {
			t.Fatalf("slow upload %d was answered before the normal batches were done; the test proves nothing", i)
		}
	}
	t.Logf("batch of 50: %v on the idle server, %v beside 4 slow uploads", quiet, busy)

	for i, u := range slow {
		select {
		case ans := <-u.answer:
			if ans.err != nil {
				t.Fatalf("slow upload %d: %v", i, ans.err)
			}
			if ans.status != http.StatusRequestTimeout {
				t.Fatalf("slow upload %d: status %d %s, want 408", i, ans.status, ans.body)
			}
			var eb apitype.ErrorBody
			if err := json.Unmarshal(ans.body, &eb); err != nil || eb.Error.Code != apitype.CodeRequestTimeout || eb.Error.Message == "" {
				t.Errorf("slow upload %d: body %s, want an error with code %s", i, ans.body, apitype.CodeRequestTimeout)
			}
			if ans.after < bodyTimeout-100*time.Millisecond || ans.after > bodyTimeout+3*time.Second {
				t.Errorf("slow upload %d cut off after %v, want about %v", i, ans.after, bodyTimeout)
			}
		case <-time.After(bodyTimeout + 10*time.Second):
			t.Fatalf("slow upload %d was not cut off", i)
		}
	}
}

// The body deadline is the connection's read deadline, and Go's server
// keeps reading a connection in the background while a handler runs, to
// notice a client that leaves: were the deadline to reach that read, it
// would cancel a long poll once it passed. Long polls longer than the body
// deadline, on the same kept-alive connection as a body that was read
// under it, run their whole wait.
func TestLongPollOutlivesBodyDeadline(t *testing.T) {
	const bodyTimeout, wait = time.Second, 3 * time.Second
	a := admitAPI(t, map[string]string{"BODY_READ_TIMEOUT": bodyTimeout.String()})
	tr := &http.Transport{MaxConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	base := "http://" + a.Addr()

	// Submit and wait: the body is read under the deadline, then the
	// handler waits 3 s for a task that no worker runs.
	start := time.Now()
	resp, err := c.Post(base+"/v1/tasks?wait="+wait.String(), "application/json",
		strings.NewReader(`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`))
	if err != nil {
		t.Fatalf("POST /v1/tasks?wait: %v", err)
	}
	var task apitype.Task
	json.NewDecoder(resp.Body).Decode(&task)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || task.State != apitype.TaskStatePending {
		t.Fatalf("POST /v1/tasks?wait=%v: %d %+v, want 202 pending", wait, resp.StatusCode, task)
	}
	if d := time.Since(start); d < wait {
		t.Errorf("POST /v1/tasks?wait=%v answered after %v", wait, d)
	}

	// Then a long poll on the same connection, which had the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start = time.Now()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/tasks/"+task.ID+"?wait="+wait.String(), nil)
	resp, err = c.Do(req)
	if err != nil {
		t.Fatalf("GET /v1/tasks/{id}?wait: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v1/tasks/{id}?wait=%v: %d, want 200", wait, resp.StatusCode)
	}
	if d := time.Since(start); d < wait {
		t.Errorf("GET /v1/tasks/{id}?wait=%v answered after %v", wait, d)
	}
}

// startStalledUpload sends, with an API key, the headers of a single-task
// POST declaring a body of declared bytes and sent bytes of it at once,
// then nothing more, holding what it sent in the API's memory until the
// body's deadline.
func startStalledUpload(t *testing.T, addr, key string, declared, sent int) *slowUpload {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	u := &slowUpload{conn: conn, started: time.Now(), answer: make(chan slowAnswer, 1)}
	fmt.Fprintf(conn, "POST /v1/tasks HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		addr, key, declared)
	if _, err := conn.Write([]byte(`{"kind":"sliding"` + strings.Repeat(" ", sent-len(`{"kind":"sliding"`)))); err != nil {
		t.Fatal(err)
	}
	go u.await()
	return u
}

// One key's uploads cannot take the memory that admits every other key's
// requests. On an API whose pool is 2 MiB, key a starts uploads that
// stall, and key b then submits a small batch. With a key's share at
// 1 MiB, a's three uploads of 700 KiB hold at most its share: b's batch
// is accepted at once while a's first upload holds its bytes, a's two
// newer uploads are answered 429 once they waited 1 s for room (their own
// key was in the way) and its first 408. With a key's share as large as
// the pool (the control, no share), a's two uploads of 1000 KiB fill the
// pool without waiting, and b's batch is refused 503 once it waited 1 s:
// so the share is what admitted b.
func TestKeyShareLeavesOtherKeysRoom(t *testing.T) {
	const keyA, keyB = "a-key-0123456789abcdef", "b-key-0123456789abcdef"
	const grace = 3 * time.Second
	for _, tc := range []struct {
		name       string
		keyShare   string
		uploads    int // a's, each declaring sent+10 KiB
		sent       int
		held       int64 // of the pool, by a's uploads when b comes
		wantB      int
		wantNewerA int    // 0: not checked past being answered with an error
		newerCode  string // of a's newer uploads
	}{
		// a's share less one read (32 KiB) that did not fit in it.
		{"share of half the pool", "1Mi", 3, 700 << 10, 1<<20 - 32<<10, http.StatusAccepted, http.StatusTooManyRequests, apitype.CodeRateLimited},
		// Here a's newer upload ends as its body's clock allows (408);
		// what matters is b's answer.
		{"share as large as the pool", "2Mi", 2, 1000 << 10, 2 * 1000 << 10, http.StatusServiceUnavailable, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := admitAPI(t, map[string]string{"API_KEYS": "a:" + keyA + ",b:" + keyB, "OPERATOR_KEYS": "ops:" + opsKey,
				"MAX_BYTES_IN_FLIGHT": "2Mi", "MAX_KEY_BYTES_IN_FLIGHT": tc.keyShare,
				// 700 KiB at 256 KiB/s buys a's first upload 2.7 s past
				// the grace, so it holds its bytes past b's answer.
				"BODY_READ_TIMEOUT": grace.String(), "BODY_MIN_RATE": "256Ki",
				"RATE_LIMIT_PER_SECOND": "1000", "RATE_LIMIT_BURST": "1000"})
			// The first is the oldest holder: the server holds its bytes
			// before the others come (a loaded machine has read a newer
			// one first when they were 200 ms apart). b comes once a's
			// uploads hold what they can.
			ups := []*slowUpload{startStalledUpload(t, a.Addr(), keyA, tc.sent+10<<10, tc.sent)}
			waitBytesInFlight(t, a.Addr(), int64(tc.sent))
			for range tc.uploads - 1 {
				ups = append(ups, startStalledUpload(t, a.Addr(), keyA, tc.sent+10<<10, tc.sent))
			}
			waitBytesInFlight(t, a.Addr(), tc.held)

			req, _ := http.NewRequest("POST", "http://"+a.Addr()+"/v1/batches", bytes.NewReader(eightPuzzles(20, 0)))
			req.Header.Set("Authorization", "Bearer "+keyB)
			req.Header.Set("Content-Type", "application/json")
			start := time.Now()
			resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
			if err != nil {
				t.Fatalf("b's batch: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took := time.Since(start)
			t.Logf("b's batch: %d after %v", resp.StatusCode, took)
			if resp.StatusCode != tc.wantB {
				t.Fatalf("b's batch: %d %s, want %d", resp.StatusCode, body, tc.wantB)
			}
			if tc.wantB == http.StatusAccepted && took > grace/2 {
				t.Errorf("b's batch took %v beside a's uploads, want well within the %v grace", took, grace)
			}
			if ups[0].answered() {
				t.Fatal("a's first upload was answered before b's batch; the test proves nothing")
			}

			for i, u := range ups {
				want, code := tc.wantNewerA, tc.newerCode
				if i == 0 {
					want, code = http.StatusRequestTimeout, apitype.CodeRequestTimeout
				}
				select {
				case ans := <-u.answer:
					if ans.err != nil {
						t.Fatalf("a's upload %d: %v", i, ans.err)
					}
					var eb apitype.ErrorBody
					_ = json.Unmarshal(ans.body, &eb)
					t.Logf("a's upload %d: %d %s after %v", i, ans.status, eb.Error.Code, ans.after)
					if want == 0 {
						if ans.status < 400 || eb.Error.Message == "" {
							t.Errorf("a's upload %d: %d %s, want an error", i, ans.status, ans.body)
						}
						continue
					}
					if ans.status != want || eb.Error.Code != code || eb.Error.Message == "" {
						t.Errorf("a's upload %d: %d %s, want %d with code %s", i, ans.status, ans.body, want, code)
					}
				case <-time.After(3 * grace):
					t.Fatalf("a's upload %d was not answered", i)
				}
			}
		})
	}
}

// A batch refused at the byte pool is answered as the pool's refusal,
// whatever the body's format: 503 with Retry-After while the client is
// still connected. Key a's two stalled uploads of 1000 KiB fill a 2 MiB
// pool (its share as large as the pool), and key b then sends 20-item batches as
// JSON and as NDJSON at once. An NDJSON body is read to its end before
// its items wait for room, so the connection's read deadline must not
// outlive the body: the server's background read would hit it and cancel
// the request, and b would get a 499 that no client is documented to see.
func TestPoolRefusalIs503ForEveryBatchFormat(t *testing.T) {
	t.Parallel()
	const keyA, keyB = "a-key-0123456789abcdef", "b-key-0123456789abcdef"
	const grace = 2 * time.Second
	a := admitAPI(t, map[string]string{"API_KEYS": "a:" + keyA + ",b:" + keyB, "OPERATOR_KEYS": "ops:" + opsKey,
		"MAX_BYTES_IN_FLIGHT": "2Mi", "MAX_KEY_BYTES_IN_FLIGHT": "2Mi",
		// 1000 KiB at 128 KiB/s holds a's uploads 7.8 s past the grace,
		// well past b's answers, which come once they waited 1 s.
		"BODY_READ_TIMEOUT": grace.String(), "BODY_MIN_RATE": "128Ki",
		"RATE_LIMIT_PER_SECOND": "1000", "RATE_LIMIT_BURST": "1000"})
	var ups []*slowUpload
	for range 2 {
		ups = append(ups, startStalledUpload(t, a.Addr(), keyA, 1010<<10, 1000<<10))
	}
	// b comes once the server has read both, which hold the pool for
	// 7.8 s past the grace: a loaded machine has taken over a second to.
	waitBytesInFlight(t, a.Addr(), 2*1000<<10)
	jsonBody := eightPuzzles(20, 0)
	var env struct {
		Tasks []json.RawMessage `json:"tasks"`
	}
	if err := json.Unmarshal(jsonBody, &env); err != nil {
		t.Fatal(err)
	}
	var nd bytes.Buffer
	for _, it := range env.Tasks {
		nd.Write(it)
		nd.WriteByte('\n')
	}
	formats := []struct {
		ct   string
		body []byte
	}{{"application/json", jsonBody}}
	for range 6 {
		formats = append(formats, struct {
			ct   string
			body []byte
		}{"application/x-ndjson", nd.Bytes()})
	}
	var wg sync.WaitGroup
	for _, f := range formats {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", "http://"+a.Addr()+"/v1/batches", bytes.NewReader(f.body))
			req.Header.Set("Authorization", "Bearer "+keyB)
			req.Header.Set("Content-Type", f.ct)
			start := time.Now()
			resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
			if err != nil {
				t.Errorf("b's %s batch: %v", f.ct, err)
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took := time.Since(start)
			t.Logf("b's %s batch: %d after %v", f.ct, resp.StatusCode, took)
			var eb apitype.ErrorBody
			_ = json.Unmarshal(body, &eb)
			if resp.StatusCode != http.StatusServiceUnavailable || eb.Error.Code != apitype.CodeUnavailable || resp.Header.Get("Retry-After") == "" {
				t.Errorf("b's %s batch: %d %s (Retry-After %q), want 503 unavailable with Retry-After",
					f.ct, resp.StatusCode, body, resp.Header.Get("Retry-After"))
			}
		}()
	}
	wg.Wait()
	// b was refused while a's uploads held the pool, not once they let
	// go of it: they are answered only when their bodies' clock cuts
	// them.
	for i, u := range ups {
		if u.answered() {
			t.Errorf("a's upload %d was answered before b's batches were; b's answers prove nothing", i)
		}
	}
}

// waitBytesInFlight polls the API's puzzleq_api_bytes_in_flight until it
// reaches at least want, so that a test goes on once the server holds the
// bodies it was sent, not after a guess of how long reading them takes.
// The API has opsKey among its OPERATOR_KEYS, which /metrics needs.
func waitBytesInFlight(t *testing.T, addr string, want int64) {
	t.Helper()
	var got int64
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+opsKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET /metrics: %v", err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics: %s", resp.Status)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "puzzleq_api_bytes_in_flight "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("puzzleq_api_bytes_in_flight %q: %v", v, err)
				}
				got = int64(f)
			}
		}
		resp.Body.Close()
		if got >= want {
			return
		}
	}
	t.Fatalf("the API held %d bytes after 15s, want at least %d", got, want)
}
