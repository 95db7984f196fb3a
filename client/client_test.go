package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/client"
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
	_, err := client.New(srv.URL, fast()...).Submit(context.Background(), []byte(`{}`))
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
	reqs := []json.RawMessage{json.RawMessage(`{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}`)}
	if _, err := c.SubmitBatch(context.Background(), reqs, ""); err == nil || calls.Load() != 1 {
		t.Fatalf("without a key: err %v after %d calls; want an error and no retry", err, calls.Load())
	}
	calls.Store(0)
	sub, err := c.SubmitBatch(context.Background(), reqs, "run-1-batch-0")
	if err != nil || sub.ID != "b1" || !sub.Replayed || calls.Load() != 2 || keys[1] != "run-1-batch-0" || keys[2] != "run-1-batch-0" {
		t.Fatalf("with a key: %+v, %v after %d calls, keys %q", sub, err, calls.Load(), keys)
	}
}

func TestBatchBody(t *testing.T) {
	t.Parallel()
	got := string(client.BatchBody([]json.RawMessage{json.RawMessage(`{"a":1}`), json.RawMessage(`{"b":2}`)}))
	if got != `{"tasks":[{"a":1},{"b":2}]}` {
		t.Fatal(got)
	}
}
