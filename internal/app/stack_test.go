package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/app"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
)

// stack is a real deployment in miniature: a redis-server process, the
// API and zero or more workers, wired by the same code as the binaries.
type stack struct {
	t       *testing.T
	base    string
	redis   *redistest.Server
	rdb     *redis.Client
	store   *store.Store
	api     *app.API
	env     map[string]string
	workers []*runningWorker
}

type runningWorker struct {
	w    *app.Worker
	stop context.CancelFunc
	done chan struct{}
}

// testLogger keeps test output quiet unless PUZZLEQ_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("PUZZLEQ_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startStack starts redis, the API and n workers. env overrides settings
// of both binaries.
func startStack(t *testing.T, workers int, env map[string]string) *stack {
	t.Helper()
	r := redistest.Start(t)
	s := &stack{t: t, redis: r, rdb: r.Client(t), env: map[string]string{
		"REDIS_URL": r.URL(), "HTTP_ADDR": "127.0.0.1:0", "TASK_CHECK_INTERVAL": "5ms", "PDB_PRELOAD": "false",
	}}
	for k, v := range env {
		s.env[k] = v
	}
	s.store = store.New(s.rdb, store.Options{})
	cfg, err := app.LoadAPIConfig(nil, s.getenv, io.Discard)
	if err != nil {
		t.Fatalf("api config: %v", err)
	}
	a, err := app.NewAPI(cfg, testLogger())
	if err != nil {
		t.Fatalf("new api: %v", err)
	}
	s.api = a
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	t.Cleanup(func() {
		for _, w := range s.workers {
			w.stop()
			<-w.done
		}
		cancel()
		<-done
		a.Close()
	})
	s.base = "http://" + a.Addr()
	for range workers {
		s.addWorker()
	}
	s.waitReady()
	return s
}

func (s *stack) getenv(k string) string { return s.env[k] }

// addWorker starts one more worker on the stack's Redis.
func (s *stack) addWorker() *runningWorker {
	s.t.Helper()
	cfg, err := app.LoadWorkerConfig(nil, s.getenv, io.Discard)
	if err != nil {
		s.t.Fatalf("worker config: %v", err)
	}
	w, err := app.NewWorker(cfg, testLogger())
	if err != nil {
		s.t.Fatalf("new worker: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rw := &runningWorker{w: w, stop: cancel, done: make(chan struct{})}
	go func() { defer close(rw.done); w.Run(ctx); w.Close() }()
	s.workers = append(s.workers, rw)
	return rw
}

func (s *stack) waitReady() {
	s.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if code, _ := s.do("GET", "/readyz", nil); code == http.StatusOK {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.t.Fatal("api never became ready")
}

// do sends a request and returns the status and body.
func (s *stack) do(method, path string, body any) (int, []byte) {
	s.t.Helper()
	code, b, _ := s.doH(method, path, body)
	return code, b
}

func (s *stack) doH(method, path string, body any) (int, []byte, http.Header) {
	s.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			s.t.Fatal(err)
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, s.base+path, r)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out, resp.Header
}

// task is the JSON task resource.
type task struct {
	ID          string          `json:"id"`
	Kind        string          `json:"kind"`
	State       string          `json:"state"`
	Result      json.RawMessage `json:"result"`
	Error       *apiErr         `json:"error"`
	Cached      bool            `json:"cached"`
	BatchID     *string         `json:"batch_id"`
	CreatedAt   *time.Time      `json:"created_at"`
	StartedAt   *time.Time      `json:"started_at"`
	CompletedAt *time.Time      `json:"completed_at"`
	Attempts    int             `json:"attempts"`
}

type apiErr struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field"`
}

type errBody struct {
	Error apiErr `json:"error"`
}

type batch struct {
	ID         string         `json:"id"`
	Total      int            `json:"total"`
	Counts     map[string]int `json:"counts"`
	Done       bool           `json:"done"`
	Tasks      []task         `json:"tasks"`
	NextCursor *string        `json:"next_cursor"`
	TaskIDs    []string       `json:"task_ids"`
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %T from %s: %v", v, b, err)
	}
	return v
}

// submit posts one request and returns the task resource.
func (s *stack) submit(req string, wantStatus int) task {
	s.t.Helper()
	code, b := s.do("POST", "/v1/tasks", req)
	if code != wantStatus {
		s.t.Fatalf("POST /v1/tasks %s: status %d, want %d: %s", req, code, wantStatus, b)
	}
	return decode[task](s.t, b)
}

// wait long-polls a task until it ends (or the wait runs out).
func (s *stack) wait(id string, d time.Duration) task {
	s.t.Helper()
	code, b := s.do("GET", fmt.Sprintf("/v1/tasks/%s?wait=%s", id, d), nil)
	if code != http.StatusOK {
		s.t.Fatalf("GET task %s: %d %s", id, code, b)
	}
	return decode[task](s.t, b)
}

// queued returns how many tasks asynq holds in a queue, in any state.
func (s *stack) queued(queue string) int {
	s.t.Helper()
	info, err := asynq.NewInspectorFromRedisClient(s.rdb).GetQueueInfo(queue)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return 0
		}
		s.t.Fatalf("queue info: %v", err)
	}
	return info.Size + info.Processed
}

// keysWithPrefix counts Redis keys matching a pattern.
func (s *stack) keys(pattern string) int {
	s.t.Helper()
	ks, err := s.rdb.Keys(context.Background(), pattern).Result()
	if err != nil {
		s.t.Fatal(err)
	}
	return len(ks)
}

// io_ReadFull reads until EOF or the buffer is full.
func io_ReadFull(r io.Reader, b []byte) (int, error) {
	n, err := io.ReadFull(r, b)
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		err = nil
	}
	return n, err
}
