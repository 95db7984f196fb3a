package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/solvers/fill"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/solvers/sweep"
)

func fast(opts ...client.Option) []client.Option {
	return append([]client.Option{client.WithBackoff(time.Millisecond, 5*time.Millisecond)}, opts...)
}

func TestRetriesTransientErrorsHonouringRetryAfter(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	var first, second time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1:
			first = time.Now()
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"code":"unavailable","message":"retry later"}}`)
		case 2:
			second = time.Now()
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"code":"rate_limited","message":"slow down"}}`)
		default:
			io.WriteString(w, `{"id":"abc","state":"completed","result":{"moves":3}}`)
		}
	}))
	defer srv.Close()
	c := client.New(srv.URL, fast()...)
	task, err := c.Get(context.Background(), "abc", 0)
	if err != nil {
		t.Fatal(err)
	}
	if task.State != "completed" || string(task.Result) != `{"moves":3}` || calls.Load() != 3 {
		t.Fatalf("task %+v after %d calls", task, calls.Load())
	}
	if d := second.Sub(first); d < time.Second {
		t.Errorf("retried after %s; Retry-After asked for 1s", d)
	}
}

func TestTypedErrors(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"code":"invalid_puzzle","message":"tile 3 appears twice","field":"puzzle.board[1][1]"}}`)
	}))
	defer srv.Close()
	_, err := client.New(srv.URL, fast()...).Submit(context.Background(), client.RawRequest([]byte(`{}`)))
	var e *client.Error
	if !errors.As(err, &e) || e.StatusCode != 400 || e.Code != "invalid_puzzle" || e.Field != "puzzle.board[1][1]" || e.Temporary() {
		t.Fatalf("err %#v", err)
	}
	if calls.Load() != 1 {
		t.Errorf("a 400 was retried: %d calls", calls.Load())
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	var retries atomic.Int64
	c := client.New("http://"+addr, fast(client.WithRetries(3),
		client.WithRetryHook(func(int, error, time.Duration) { retries.Add(1) }))...)
	_, err := c.Health(context.Background())
	if !errors.Is(err, client.ErrUnreachable) {
		t.Fatalf("err %v, want ErrUnreachable", err)
	}
	if retries.Load() != 3 {
		t.Errorf("%d retries, want 3", retries.Load())
	}
	// A context deadline bounds the retries.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = client.New("http://"+addr, client.WithRetries(100)).Get(ctx, "x", 0)
	if err == nil || time.Since(start) > 2*time.Second {
		t.Errorf("err %v after %s", err, time.Since(start))
	}
}

// A POST that creates work is not retried once the request may have
// reached the server, unless it carries an idempotency key.
func TestSubmitBatchRetriesOnlyWithIdempotencyKey(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if calls.Add(1)%2 == 1 {
			// Accept the request, then lose the answer.
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			conn.Close()
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"id":"b1","total":1,"task_ids":["t1"]}`)
	}))
	defer srv.Close()
	c := client.New(srv.URL, fast()...)
	reqs := client.BatchOf(client.RawRequest([]byte(`{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}`)))
	if _, err := c.SubmitBatch(context.Background(), reqs); err == nil || calls.Load() != 1 {
		t.Fatalf("without a key: err %v after %d calls; want an error and no retry", err, calls.Load())
	}
	calls.Store(0)
	sub, err := c.SubmitBatch(context.Background(), reqs, client.WithIdempotencyKey("run-1-batch-0"))
	if err != nil || sub.ID != "b1" || !sub.Replayed || calls.Load() != 2 || keys[1] != "run-1-batch-0" || keys[2] != "run-1-batch-0" {
		t.Fatalf("with a key: %+v, %v after %d calls, keys %q", sub, err, calls.Load(), keys)
	}
}

// BatchOf sends {"tasks":[...]}, each request with its custom_id first
// when it has one, and Sliding, Sweep and Fill encode the solvers' types
// as the server reads them, leaving default options out.
func TestBatchOfBody(t *testing.T) {
	t.Parallel()
	var body atomic.Pointer[string]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s := string(b)
		body.Store(&s)
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"id":"b1","total":5,"task_ids":null}`)
	}))
	defer srv.Close()
	in := client.BatchOf(
		client.RawRequest([]byte(`{"a":1}`)),
		client.RawRequest([]byte(` { "b" : 2 }`)).WithCustomID("x\"y"),
		client.Sliding(sliding.Puzzle{Board: [][]int{{1, 0}, {3, 2}}}, sliding.Options{}).WithCustomID("s"),
		client.Sweep(sweep.Puzzle{Board: []string{".*"}}, sweep.Options{MaxNodes: 5}),
		client.Fill(fill.Puzzle{GameBoard: [][]int{{0}}, Table: [][]int{{1}}}, fill.Options{AllowFlip: true}),
	)
	if _, err := client.New(srv.URL, fast()...).SubmitBatch(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	want := `{"tasks":[{"a":1},{"custom_id":"x\"y","b" : 2 },` +
		`{"custom_id":"s","kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}},` +
		`{"kind":"sweep","puzzle":{"board":[".*"]},"options":{"max_nodes":5}},` +
		`{"kind":"fill","puzzle":{"game_board":[[0]],"table":[[1]]},"options":{"allow_flip":true}}]}`
	if got := *body.Load(); got != want {
		t.Fatalf("body\n%s\nwant\n%s", got, want)
	}
}

// Options a submission cannot use, and requests that are not JSON, are
// errors of the call, before anything is sent.
func TestSubmitRefusesWhatItCannotSend(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer srv.Close()
	c := client.New(srv.URL, fast()...)
	ctx := context.Background()
	ok := client.RawRequest([]byte(`{"kind":"sweep","puzzle":{"board":[".."]}}`))
	for name, err := range map[string]error{
		"Submit with a key": func() error { _, err := c.Submit(ctx, ok, client.WithIdempotencyKey("k")); return err }(),
		"Solve with a key":  func() error { _, err := c.Solve(ctx, ok, client.WithIdempotencyKey("k")); return err }(),
		"SubmitBatch with a wait": func() error {
			_, err := c.SubmitBatch(ctx, client.BatchOf(ok), client.WithWait(time.Second))
			return err
		}(),
		"not JSON":            func() error { _, err := c.Submit(ctx, client.RawRequest([]byte(`{"kind":`))); return err }(),
		"the zero Request":    func() error { _, err := c.Submit(ctx, client.Request{}); return err }(),
		"a bad batch item":    func() error { _, err := c.SubmitBatch(ctx, client.BatchOf(ok, client.Request{})); return err }(),
		"the zero BatchInput": func() error { _, err := c.SubmitBatch(ctx, client.BatchInput{}); return err }(),
	} {
		var apiErr *client.Error
		if err == nil || errors.As(err, &apiErr) || errors.Is(err, client.ErrUnreachable) {
			t.Errorf("%s: err %v, want a local error", name, err)
		}
	}
	if calls.Load() != 0 {
		t.Errorf("%d requests reached the server", calls.Load())
	}
}

// A judge-format batch is sent as text with its format in the query, and
// a key makes it retryable like a JSON batch.
func TestSubmitJudgeBatch(t *testing.T) {
	t.Parallel()
	const text = "1 1\n.\n"
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != "POST" || r.URL.Path != "/v1/batches" || r.URL.Query().Get("format") != "boj9944" ||
			r.Header.Get("Content-Type") != "text/plain; charset=utf-8" || string(body) != text || r.Header.Get("Idempotency-Key") != "k1" {
			t.Errorf("request %s %s, Content-Type %q, key %q, body %q", r.Method, r.URL, r.Header.Get("Content-Type"), r.Header.Get("Idempotency-Key"), body)
		}
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusBadGateway) // retried: the key makes it safe
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"id":"b9","total":1,"task_ids":["t9"]}`)
	}))
	defer srv.Close()
	sub, err := client.New(srv.URL, fast()...).SubmitBatch(context.Background(), client.JudgeBatch("boj9944", client.BytesBody([]byte(text))), client.WithIdempotencyKey("k1"))
	if err != nil || sub.ID != "b9" || sub.Total != 1 || len(sub.TaskIDs) != 1 || !sub.Replayed || calls.Load() != 2 {
		t.Fatalf("SubmitBatch(JudgeBatch) = %+v, %v after %d calls", sub, err, calls.Load())
	}
}

// IsNotFound is true of a 404 answer only.
func TestIsNotFound(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/tasks/gone" {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"code":"not_found","message":"no such task or batch"}}`)
			return
		}
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"error":{"code":"conflict","message":"task has already ended"}}`)
	}))
	defer srv.Close()
	c := client.New(srv.URL, fast()...)
	_, err := c.Get(context.Background(), "gone", 0)
	if !client.IsNotFound(err) {
		t.Errorf("404: IsNotFound(%v) = false", err)
	}
	_, err = c.Cancel(context.Background(), "ended")
	if err == nil || client.IsNotFound(err) {
		t.Errorf("409: IsNotFound(%v) = true", err)
	}
	if client.IsNotFound(nil) || client.IsNotFound(errors.New("not found")) {
		t.Error("IsNotFound is true of an error that is not an answer")
	}
}

// roundTripFunc is an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// WithHTTPClient's client carries every request (e.g. for TLS settings or
// a proxy), and the options' headers still reach the server.
func TestWithHTTPClient(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" || r.Header.Get("User-Agent") != "ua/1" || r.Header.Get("X-Via") != "mine" {
			t.Errorf("headers %v", r.Header)
		}
		io.WriteString(w, `{"id":"abc","state":"pending"}`)
	}))
	defer srv.Close()
	var through atomic.Int64
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		through.Add(1)
		r = r.Clone(r.Context())
		r.Header.Set("X-Via", "mine")
		return http.DefaultTransport.RoundTrip(r)
	})}
	c := client.New(srv.URL, client.WithHTTPClient(hc), client.WithAPIKey("k"), client.WithUserAgent("ua/1"))
	if tk, err := c.Get(context.Background(), "abc", 0); err != nil || tk.State != client.StatePending {
		t.Fatalf("Get = %+v, %v", tk, err)
	}
	if through.Load() != 1 {
		t.Errorf("%d requests went through the given client, want 1", through.Load())
	}
}

// Solve submits with ?wait= and, when the wait runs out first, long polls
// the task until it ends; it never submits twice.
func TestSolveSubmitsWithWaitThenPolls(t *testing.T) {
	t.Parallel()
	var calls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls = append(calls, r.Method+" "+r.URL.RequestURI())
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost:
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprint(w, `{"id":"0123456789abcdef0123456789abcdef","kind":"sliding","state":"active"}`)
		case len(calls) < 3:
			fmt.Fprint(w, `{"id":"0123456789abcdef0123456789abcdef","kind":"sliding","state":"active"}`)
		default:
			fmt.Fprint(w, `{"id":"0123456789abcdef0123456789abcdef","kind":"sliding","state":"completed","result":{"moves":3}}`)
		}
	}))
	defer srv.Close()
	c := client.New(srv.URL, fast()...)
	task, err := c.Solve(context.Background(), client.RawRequest([]byte(`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`)), client.WithWait(2*time.Second))
	if err != nil || task.State != client.StateCompleted || string(task.Result) != `{"moves":3}` {
		t.Fatalf("Solve = %+v, %v", task, err)
	}
	want := []string{"POST /v1/tasks?wait=2s", "GET /v1/tasks/0123456789abcdef0123456789abcdef?wait=2s", "GET /v1/tasks/0123456789abcdef0123456789abcdef?wait=2s"}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("requests %q, want %q", calls, want)
	}
}

// WithWebhook goes as ?webhook= on every kind of submission, beside the
// query the submission has of its own; an empty URL sends none.
func TestWithWebhookQuery(t *testing.T) {
	t.Parallel()
	var got atomic.Pointer[http.Request]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r)
		w.WriteHeader(http.StatusAccepted)
		if r.URL.Path == "/v1/tasks" {
			io.WriteString(w, `{"id":"t1","kind":"sliding","state":"completed"}`)
			return
		}
		io.WriteString(w, `{"id":"b1","total":1}`)
	}))
	defer srv.Close()
	c := client.New(srv.URL, fast()...)
	ctx := context.Background()
	req := client.RawRequest([]byte(`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`))
	const hook = "https://hooks.example.com/p?x=1&y=2"
	for _, tc := range []struct {
		name   string
		submit func(...client.SubmitOption) error
		path   string
		query  string // of the submission's own, beside webhook
	}{
		{"Submit", func(o ...client.SubmitOption) error { _, err := c.Submit(ctx, req, o...); return err }, "/v1/tasks", ""},
		{"Submit WithWait", func(o ...client.SubmitOption) error {
			_, err := c.Submit(ctx, req, append(o, client.WithWait(time.Second))...)
			return err
		}, "/v1/tasks", "wait=1s"},
		{"Solve", func(o ...client.SubmitOption) error {
			_, err := c.Solve(ctx, req, append(o, client.WithWait(time.Second))...)
			return err
		}, "/v1/tasks", "wait=1s"},
		{"SubmitBatch BatchOf", func(o ...client.SubmitOption) error {
			_, err := c.SubmitBatch(ctx, client.BatchOf(req), append(o, client.WithIdempotencyKey("k"))...)
			return err
		}, "/v1/batches", ""},
		{"SubmitBatch JudgeBatch", func(o ...client.SubmitOption) error {
			_, err := c.SubmitBatch(ctx, client.JudgeBatch("boj1525", client.BytesBody([]byte("1 0 3\n4 2 5\n7 8 6\n"))), o...)
			return err
		}, "/v1/batches", "format=boj1525"},
		{"SubmitBatch NDJSONBatch", func(o ...client.SubmitOption) error {
			_, err := c.SubmitBatch(ctx, client.NDJSONBatch(client.BytesBody([]byte(`{"kind":"sweep","puzzle":{"board":[".."]}}`+"\n"))), o...)
			return err
		}, "/v1/batches", ""},
	} {
		for _, with := range []string{hook, ""} {
			if err := tc.submit(client.WithWebhook(with)); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			r := got.Load()
			q := r.URL.Query()
			if r.URL.Path != tc.path || q.Get("webhook") != with || (with == "" && q.Has("webhook")) {
				t.Errorf("%s with webhook %q: sent %s", tc.name, with, r.URL)
			}
			q.Del("webhook")
			if q.Encode() != tc.query {
				t.Errorf("%s with webhook %q: query %q, want %q beside the webhook", tc.name, with, q.Encode(), tc.query)
			}
		}
	}
}

// A retry the server cut short (complete false) is sent again until it
// completes, and the counts add up; one that never completes ends with an
// error that says so, after a bounded number of rounds.
func TestRetryBatchCutShortIsSentAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		answers []string
		want    int
		calls   int64
		wantErr bool
	}{
		{"completes", []string{`{"id":"b","retried":3,"complete":false}`, `{"id":"b","retried":2,"complete":true}`}, 5, 2, false},
		{"never", []string{`{"id":"b","retried":1,"complete":false}`}, 5, 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := calls.Add(1)
				if r.Method != http.MethodPost || r.URL.Path != "/v1/batches/b/retry" {
					t.Errorf("%s %s", r.Method, r.URL.Path)
				}
				io.WriteString(w, tc.answers[min(int(n), len(tc.answers))-1])
			}))
			defer srv.Close()
			n, err := client.New(srv.URL, fast()...).RetryBatch(context.Background(), "b")
			if n != tc.want || calls.Load() != tc.calls || (err != nil) != tc.wantErr {
				t.Fatalf("RetryBatch: %d, %v after %d calls; want %d after %d calls, error %v", n, err, calls.Load(), tc.want, tc.calls, tc.wantErr)
			}
		})
	}
}

// A submission that meets a kept-alive connection the server closed while
// it was idle (an API pod shutting down closes its idle connections) was
// not read by the server, so it is sent again; a submission cut off after
// it went out (a reset while waiting for the answer) may have been
// accepted, and is not. The transport stands in for net/http's, which
// returns its unexported errServerClosedIdle, matched by its text.
func TestSubmitRetriedOnlyWhenTheServerClosedAnIdleConnection(t *testing.T) {
	t.Parallel()
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"id":"abc","state":"pending"}`)
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name      string
		err       error
		wantRetry bool
	}{
		{"server closed idle connection", errors.New("http: server closed idle connection"), true},
		{"reset after the request went out", errors.New("read tcp 127.0.0.1:1->127.0.0.1:2: read: connection reset by peer"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			served.Store(0)
			var tries atomic.Int64
			hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if tries.Add(1) == 1 {
					return nil, tc.err
				}
				return http.DefaultTransport.RoundTrip(r)
			})}
			c := client.New(srv.URL, fast(client.WithHTTPClient(hc))...)
			task, err := c.Submit(context.Background(), client.RawRequest([]byte(`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`)))
			if tc.wantRetry {
				if err != nil || task.ID != "abc" || tries.Load() != 2 || served.Load() != 1 {
					t.Fatalf("Submit: %+v, %v after %d tries, %d served; want it sent again once", task, err, tries.Load(), served.Load())
				}
				return
			}
			if err == nil || tries.Load() != 1 || served.Load() != 0 {
				t.Fatalf("Submit: %v after %d tries; want the error and no second try", err, tries.Load())
			}
		})
	}
}
