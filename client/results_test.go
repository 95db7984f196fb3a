package client_test

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/client"
)

const ndjson = `{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}` + "\n" +
	`{"custom_id":"b","kind":"sweep","puzzle":{"board":["."]}}` + "\n"

// SubmitNDJSON sends the body as NDJSON with its length and the key, and
// a retry after a lost answer sends the same bytes again, for each kind
// of Body.
func TestSubmitNDJSONRetriesWithTheSameBody(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "batch.ndjson")
	if err := os.WriteFile(path, []byte(ndjson), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var opened atomic.Int64
	bodies := map[string]client.Body{
		"bytes":    client.BytesBody([]byte(ndjson)),
		"readerat": client.ReaderAtBody(f, int64(len(ndjson))),
		"func": client.FuncBody(int64(len(ndjson)), func() (io.Reader, error) {
			opened.Add(1)
			return strings.NewReader(ndjson), nil
		}),
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got, _ := io.ReadAll(r.Body)
				if r.Method != "POST" || r.URL.Path != "/v1/batches" || r.Header.Get("Content-Type") != "application/x-ndjson" ||
					r.Header.Get("Idempotency-Key") != "k-"+name || r.ContentLength != int64(len(ndjson)) || string(got) != ndjson {
					t.Errorf("request %s %s, Content-Type %q, key %q, length %d, body %q", r.Method, r.URL,
						r.Header.Get("Content-Type"), r.Header.Get("Idempotency-Key"), r.ContentLength, got)
				}
				if calls.Add(1) == 1 {
					// The server took the batch, the answer is lost.
					conn, _, _ := w.(http.Hijacker).Hijack()
					conn.Close()
					return
				}
				w.Header().Set("Idempotent-Replayed", "true")
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, `{"id":"0123456789abcdef0123456789abcdef","total":2,"task_ids":null}`)
			}))
			defer srv.Close()
			sub, err := client.New(srv.URL, fast()...).SubmitBatch(context.Background(), client.NDJSONBatch(body), client.WithIdempotencyKey("k-"+name))
			if err != nil || !sub.Replayed || sub.Total != 2 || calls.Load() != 2 {
				t.Fatalf("SubmitBatch(NDJSONBatch) = %+v, %v after %d calls", sub, err, calls.Load())
			}
			if got := sub.ItemID(1); got != "0123456789abcdef0123456789abcdef-1" {
				t.Errorf("ItemID(1) = %q", got)
			}
		})
	}
	if opened.Load() < 2 {
		t.Errorf("FuncBody opened %d times, want once per attempt", opened.Load())
	}
}

// A line the server rejects is a 400 *Error naming it, not retried; a
// body that cannot be read is a local error, neither retried nor
// "unreachable".
func TestSubmitNDJSONErrors(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"code":"invalid_puzzle","message":"line 2: puzzle.board: not square","field":"puzzle.board"}}`)
	}))
	defer srv.Close()
	c := client.New(srv.URL, fast()...)
	_, err := c.SubmitBatch(context.Background(), client.NDJSONBatch(client.BytesBody([]byte(ndjson))), client.WithIdempotencyKey("k"))
	var e *client.Error
	if !errors.As(err, &e) || e.StatusCode != 400 || !strings.Contains(e.Message, "line 2") || calls.Load() != 1 {
		t.Fatalf("err %v after %d calls", err, calls.Load())
	}
	broken := client.FuncBody(100, func() (io.Reader, error) { return io.MultiReader(strings.NewReader("{"), errReader{}), nil })
	_, err = c.SubmitBatch(context.Background(), client.NDJSONBatch(broken), client.WithIdempotencyKey("k"))
	if err == nil || errors.Is(err, client.ErrUnreachable) || !strings.Contains(err.Error(), "disk on fire") || calls.Load() > 2 {
		t.Fatalf("unreadable body: err %v after %d calls", err, calls.Load())
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

// resultsServer serves /results of a batch of n items, items below ended
// completed and the rest pending, gzipped when asked. Before writing
// cutAfter lines of the first answer it breaks the connection mid-line.
type resultsServer struct {
	*httptest.Server
	mu        sync.Mutex
	queries   []string
	encodings []string
	calls     int
}

func startResults(t *testing.T, n, ended, cutAfter int) *resultsServer {
	t.Helper()
	rs := &resultsServer{}
	rs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/batches/0123456789abcdef0123456789abcdef/results" {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"code":"not_found","message":"no such batch"}}`)
			return
		}
		rs.mu.Lock()
		rs.calls++
		call := rs.calls
		rs.queries = append(rs.queries, r.URL.RawQuery)
		rs.encodings = append(rs.encodings, r.Header.Get("Accept-Encoding"))
		rs.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		var out io.Writer = w
		var zw *gzip.Writer
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw = gzip.NewWriter(w)
			out = zw
		}
		state := r.URL.Query().Get("state")
		from, _ := strconv.Atoi(r.URL.Query().Get("from"))
		for i := from; i < n; i++ {
			if call == 1 && i == cutAfter {
				io.WriteString(out, `{"index":`)
				if zw != nil {
					zw.Flush()
				}
				w.(http.Flusher).Flush()
				conn, _, _ := w.(http.Hijacker).Hijack()
				conn.Close()
				return
			}
			st, res := "completed", fmt.Sprintf(`,"result":{"moves":%d}`, i)
			if i%3 == 2 {
				st, res = "failed", `,"error":{"code":"budget_exceeded","message":"too many nodes"}`
			}
			if i >= ended {
				st, res = "pending", ""
			}
			if state != "" && st != state {
				continue
			}
			fmt.Fprintf(out, `{"index":%d,"id":"0123456789abcdef0123456789abcdef-%d","custom_id":"c%d","state":%q%s}`+"\n", i, i, i, st, res)
		}
		if zw != nil {
			zw.Close()
		}
	}))
	t.Cleanup(rs.Close)
	return rs
}

// Results decodes the stream as it comes, gzipped (asked for and
// decoded by the client itself), resumes a broken stream from the line
// after the last one it yielded (from=), and passes wait and state
// through.
func TestResultsStreamsGzipAndResumes(t *testing.T) {
	t.Parallel()
	const n = 5000
	rs := startResults(t, n, n, 1234)
	c := client.New(rs.URL, fast()...)
	next := 0
	for l, err := range c.Results(context.Background(), "0123456789abcdef0123456789abcdef", client.ResultsOptions{Wait: 30 * time.Second}) {
		if err != nil {
			t.Fatal(err)
		}
		if l.Index != next || l.ID != client.ItemID("0123456789abcdef0123456789abcdef", next) || l.CustomID == nil || *l.CustomID != fmt.Sprintf("c%d", next) {
			t.Fatalf("line %d: %+v", next, l)
		}
		switch l.State {
		case client.StateCompleted:
			if string(l.Result) != fmt.Sprintf(`{"moves":%d}`, next) || l.Error != nil {
				t.Fatalf("line %d: %+v", next, l)
			}
		case client.StateFailed:
			if l.Error == nil || l.Error.Code != "budget_exceeded" || l.Result != nil {
				t.Fatalf("line %d: %+v", next, l)
			}
		default:
			t.Fatalf("line %d: %+v", next, l)
		}
		next++
	}
	if next != n {
		t.Fatalf("%d lines, want %d", next, n)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.calls != 2 {
		t.Errorf("%d requests, want 2 (one broken, one resumed)", rs.calls)
	}
	for i, want := range []string{"wait=30s", "from=1234&wait=30s"} {
		if rs.encodings[i] != "gzip" || rs.queries[i] != want {
			t.Errorf("request %d: Accept-Encoding %q, query %q, want %q", i, rs.encodings[i], rs.queries[i], want)
		}
	}
}

// WithoutResultsGzip asks for the stream as it is, and says so: the
// transport would ask for gzip on its own.
func TestResultsWithoutGzip(t *testing.T) {
	t.Parallel()
	const n = 300
	rs := startResults(t, n, n, -1)
	c := client.New(rs.URL, append(fast(), client.WithoutResultsGzip())...)
	next := 0
	for l, err := range c.Results(context.Background(), "0123456789abcdef0123456789abcdef", client.ResultsOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		if l.Index != next {
			t.Fatalf("line %d: %+v", next, l)
		}
		next++
	}
	if next != n {
		t.Fatalf("%d lines, want %d", next, n)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.calls != 1 || rs.encodings[0] != "identity" {
		t.Errorf("%d requests, Accept-Encoding %q; want one, identity", rs.calls, rs.encodings)
	}
}

// A filtered stream, an early break, a server that does not gzip, and a
// batch that does not exist.
func TestResultsFilterBreakAndErrors(t *testing.T) {
	t.Parallel()
	rs := startResults(t, 30, 20, -1)
	c := client.New(rs.URL, fast()...)
	ctx := context.Background()
	var got []int
	for l, err := range c.Results(ctx, "0123456789abcdef0123456789abcdef", client.ResultsOptions{State: client.StateFailed}) {
		if err != nil {
			t.Fatal(err)
		}
		if l.State != client.StateFailed {
			t.Fatalf("%+v", l)
		}
		got = append(got, l.Index)
	}
	if fmt.Sprint(got) != "[2 5 8 11 14 17]" {
		t.Errorf("failed items %v", got)
	}
	// Pending items come with their state and no result.
	n := 0
	for l, err := range c.Results(ctx, "0123456789abcdef0123456789abcdef", client.ResultsOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		if l.Index >= 20 {
			if l.State != client.StatePending || l.Result != nil || l.Error != nil {
				t.Fatalf("%+v", l)
			}
			break
		}
		n++
	}
	if n != 20 {
		t.Errorf("%d lines before the first pending one, want 20", n)
	}
	// Without gzip: a transport of the caller's that sends no
	// Accept-Encoding of its own still gets plain NDJSON decoded.
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Del("Accept-Encoding")
		tr := &http.Transport{DisableCompression: true}
		defer tr.CloseIdleConnections()
		return tr.RoundTrip(r)
	})}
	n = 0
	for l, err := range client.New(rs.URL, client.WithHTTPClient(hc)).Results(ctx, "0123456789abcdef0123456789abcdef", client.ResultsOptions{}) {
		if err != nil || l.Index != n {
			t.Fatalf("plain: %+v, %v", l, err)
		}
		n++
	}
	if n != 30 {
		t.Errorf("plain: %d lines", n)
	}
	for l, err := range c.Results(ctx, "ffffffffffffffffffffffffffffffff", client.ResultsOptions{}) {
		if l != nil || !client.IsNotFound(err) {
			t.Fatalf("missing batch: %+v, %v", l, err)
		}
	}
}

// A stream that goes silent for longer than the timeout is cut, and its
// error says so, after the retries.
func TestResultsStallIsCut(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"index":0,"id":"x-0","custom_id":null,"state":"pending"}`+"\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := client.New(srv.URL, fast(client.WithTimeout(200*time.Millisecond), client.WithRetries(1))...)
	start := time.Now()
	var lines int
	var last error
	for l, err := range c.Results(context.Background(), "0123456789abcdef0123456789abcdef", client.ResultsOptions{}) {
		if err != nil {
			last = err
			continue
		}
		lines++
		_ = l
	}
	if lines != 1 || last == nil || !strings.Contains(last.Error(), "sent nothing") || !errors.Is(last, client.ErrUnreachable) {
		t.Fatalf("%d lines, err %v", lines, last)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s", d)
	}
}
