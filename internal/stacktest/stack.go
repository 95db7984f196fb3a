// Package stacktest runs puzzleq in miniature for tests and tools: a real
// redis-server (internal/redistest), the API and workers built by
// internal/app exactly as cmd/api and cmd/worker build them, all in this
// process. Tests use Start; cmd/loadgen, which runs outside tests, uses
// Launch.
package stacktest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/app"
	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
)

// Options configure a stack.
type Options struct {
	// Workers is how many workers start with the stack.
	Workers int
	// Env holds settings of both binaries, over the defaults (loopback
	// listeners on free ports, TASK_CHECK_INTERVAL 5ms, PDB_PRELOAD false).
	Env map[string]string
	// APIEnv and WorkerEnv hold settings of one binary, over Env.
	// REDIS_URL set in Env or APIEnv, even to "" (the embedded mode),
	// means no redis-server is started and the stack has no RDB or Store:
	// the test chose its Redis, and Start does not wait for readiness.
	APIEnv, WorkerEnv map[string]string
	// LogOut, when set, receives the logs, each process's logger built
	// from its settings (LOG_LEVEL, LOG_FORMAT) as the binaries build it.
	// Unset, logs are discarded, or written to stderr at debug level when
	// $PUZZLEQ_TEST_LOG is set.
	LogOut io.Writer
}

// defaults are the settings a stack starts from: loopback listeners on
// free ports, a fast idle poll (tests wait on pickups), the pattern
// databases built on demand rather than at every worker start, and a
// short drain, since the tests' pooled connections stay idle to the end
// of it.
var defaults = map[string]string{
	"HTTP_ADDR": "127.0.0.1:0", "TASK_CHECK_INTERVAL": "5ms", "PDB_PRELOAD": "false", "DRAIN_TIME": "100ms",
}

// Stack is a running API and workers on one Redis.
type Stack struct {
	// URL is the API's base URL, "http://127.0.0.1:port".
	URL string
	// Redis is the redis-server; nil when the Options set REDIS_URL.
	Redis *redistest.Server
	// RDB is a client of the stack's Redis (database 0); nil when the
	// Options set REDIS_URL.
	RDB *redis.Client
	// Store reads and writes the records the API and workers keep; nil
	// when the Options set REDIS_URL.
	Store *store.Store
	// API is the running API.
	API *app.API
	// Workers are the running workers, in start order.
	Workers []*Worker

	t       testing.TB // nil from Launch
	o       Options
	env     map[string]string
	apiStop context.CancelFunc
	apiExit chan struct{} // closed when the API's Run returned apiErr
	apiErr  error
}

// Worker is a running worker.
type Worker struct {
	*app.Worker
	stop context.CancelFunc
	done chan error
}

// Start starts a stack for t and stops it when t ends; it returns once the
// API is ready (on a Redis of its own). Every error fails t.
func Start(t testing.TB, o Options) *Stack {
	t.Helper()
	s, err := launch(t, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if s.Redis != nil {
		s.WaitReady()
	}
	return s
}

// StartWith is Start for what most tests need: n workers, and env over
// the settings of both binaries.
func StartWith(t testing.TB, n int, env map[string]string) *Stack {
	t.Helper()
	return Start(t, Options{Workers: n, Env: env})
}

// Launch starts a stack outside a test; Close stops it.
func Launch(o Options) (*Stack, error) { return launch(nil, o) }

func launch(t testing.TB, o Options) (_ *Stack, err error) {
	gin.SetMode(gin.ReleaseMode) // as cmd/api does
	s := &Stack{t: t, o: o, env: maps.Clone(defaults)}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	maps.Copy(s.env, o.Env)
	_, inEnv := o.Env["REDIS_URL"]
	_, inAPIEnv := o.APIEnv["REDIS_URL"]
	if !inEnv && !inAPIEnv {
		if s.Redis, err = redistest.Launch(); err != nil {
			return nil, err
		}
		s.RDB = redistest.NewClient(&redis.Options{Addr: s.Redis.Addr})
		s.env["REDIS_URL"] = s.Redis.URL()
	}
	cfg, err := app.LoadAPIConfig(nil, s.getenv(o.APIEnv), io.Discard)
	if err != nil {
		return nil, fmt.Errorf("stacktest: api config: %w", err)
	}
	if s.RDB != nil {
		s.Store = store.New(s.RDB, store.Options{Prefix: cfg.KeyPrefix, TaskTTL: cfg.TaskTTL, ResultTTL: cfg.ResultTTL})
	}
	if s.API, err = app.NewAPI(cfg, s.logger(&cfg.Common, "api")); err != nil {
		return nil, fmt.Errorf("stacktest: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.apiStop, s.apiExit = cancel, make(chan struct{})
	go func() { s.apiErr = s.API.Run(ctx); close(s.apiExit) }()
	s.URL = "http://" + s.API.Addr()
	for range o.Workers {
		if _, err := s.StartWorker(nil); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// getenv looks settings up in over, then in the stack's env.
func (s *Stack) getenv(over map[string]string) func(string) string {
	return func(k string) string {
		if v, ok := over[k]; ok {
			return v
		}
		return s.env[k]
	}
}

func (s *Stack) logger(c *app.Common, component string) *slog.Logger {
	if s.o.LogOut != nil {
		return c.Logger(s.o.LogOut).With("component", component)
	}
	if os.Getenv("PUZZLEQ_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("component", component)
	}
	return slog.New(slog.DiscardHandler)
}

// StartWorker starts one more worker; env overrides its settings.
func (s *Stack) StartWorker(env map[string]string) (*Worker, error) {
	over := maps.Clone(s.o.WorkerEnv)
	if over == nil {
		over = map[string]string{}
	}
	maps.Copy(over, env)
	cfg, err := app.LoadWorkerConfig(nil, s.getenv(over), io.Discard)
	if err != nil {
		return nil, fmt.Errorf("stacktest: worker config: %w", err)
	}
	w, err := app.NewWorker(cfg, s.logger(&cfg.Common, "worker"))
	if err != nil {
		return nil, fmt.Errorf("stacktest: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rw := &Worker{Worker: w, stop: cancel, done: make(chan error, 1)}
	go func() { rw.done <- w.Run(ctx) }()
	s.Workers = append(s.Workers, rw)
	return rw, nil
}

// AddWorker is StartWorker for tests: an error fails the test.
func (s *Stack) AddWorker(env map[string]string) *Worker {
	s.t.Helper()
	w, err := s.StartWorker(env)
	if err != nil {
		s.t.Fatal(err)
	}
	return w
}

// StopWorkers stops every worker, as SIGTERM would, and waits for them.
func (s *Stack) StopWorkers() error {
	for _, w := range s.Workers {
		w.stop()
	}
	var errs []error
	for _, w := range s.Workers {
		errs = append(errs, stopped(w.done, "a worker"), w.Close())
	}
	s.Workers = nil
	return errors.Join(errs...)
}

// Close stops the workers, then the API (the order of a deployment's
// shutdown), and the redis-server. A test's stack closes when the test
// ends; Close reports errors of the processes' Run to the test. Closing
// twice is harmless.
func (s *Stack) Close() {
	errs := []error{s.StopWorkers()}
	if s.apiStop != nil {
		s.apiStop()
		select {
		case <-s.apiExit:
			errs = append(errs, s.apiErr)
		case <-time.After(stopTimeout):
			errs = append(errs, fmt.Errorf("the API did not stop within %v", stopTimeout))
		}
		s.apiStop = nil
	}
	if s.API != nil {
		errs = append(errs, s.API.Close())
		s.API = nil
	}
	if s.RDB != nil {
		s.RDB.Close()
		s.RDB = nil
	}
	if s.Redis != nil {
		s.Redis.Stop()
	}
	if err := errors.Join(errs...); err != nil && s.t != nil {
		s.t.Errorf("stacktest: stop: %v", err)
	}
}

// TerminateAPI starts the API's shutdown, as SIGTERM does in the binary;
// APIExited tells when it is over. Close still waits for it.
func (s *Stack) TerminateAPI() { s.apiStop() }

// APIExited is closed once the API's Run has returned.
func (s *Stack) APIExited() <-chan struct{} { return s.apiExit }

// stopTimeout bounds how long Close waits for a process's Run to return:
// longer than any ShutdownTimeout a test sets, short enough that a hang
// is reported as such and not as the test binary's timeout.
const stopTimeout = 30 * time.Second

// stopped returns what Run sent on done, or an error if it sent nothing
// within stopTimeout.
func stopped(done <-chan error, what string) error {
	select {
	case err := <-done:
		return err
	case <-time.After(stopTimeout):
		return fmt.Errorf("%s did not stop within %v", what, stopTimeout)
	}
}

// WaitReady waits up to 10 s for the API's /readyz to answer 200.
func (s *Stack) WaitReady() {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if code, _ := s.Do("GET", "/readyz", nil); code == http.StatusOK {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.t.Fatal("stacktest: the API never became ready")
}

// Do sends a request to the API and returns the status and body. body is
// nil, a string, a []byte, or a value sent as JSON.
func (s *Stack) Do(method, path string, body any) (int, []byte) {
	s.t.Helper()
	code, b, _ := s.DoH(method, path, body)
	return code, b
}

// DoH is Do, also returning the response's header.
func (s *Stack) DoH(method, path string, body any, header ...string) (int, []byte, http.Header) {
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
	req, err := http.NewRequest(method, s.URL+path, r)
	if err != nil {
		s.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out, resp.Header
}

// DoAs is DoH with the API key key as a bearer token; "" sends none.
func (s *Stack) DoAs(key, method, path string, body any, header ...string) (int, []byte, http.Header) {
	s.t.Helper()
	if key != "" {
		header = append(header, "Authorization", "Bearer "+key)
	}
	return s.DoH(method, path, body, header...)
}

// Submit posts one request to /v1/tasks, fails the test unless the answer
// has status want, and returns the task resource.
func (s *Stack) Submit(req string, want int) apitype.Task {
	s.t.Helper()
	code, b := s.Do("POST", "/v1/tasks", req)
	if code != want {
		s.t.Fatalf("POST /v1/tasks %s: status %d, want %d: %s", req, code, want, b)
	}
	return Decode[apitype.Task](s.t, b)
}

// WaitTask long-polls a task for up to d and returns the task of the 200.
func (s *Stack) WaitTask(id string, d time.Duration) apitype.Task {
	s.t.Helper()
	code, b := s.Do("GET", fmt.Sprintf("/v1/tasks/%s?wait=%s", id, d), nil)
	if code != http.StatusOK {
		s.t.Fatalf("GET task %s: %d %s", id, code, b)
	}
	return Decode[apitype.Task](s.t, b)
}

// Decode unmarshals a JSON body into a T, failing the test if it cannot.
func Decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %T from %s: %v", v, b, err)
	}
	return v
}

// Keys counts the Redis keys matching a pattern.
func (s *Stack) Keys(pattern string) int {
	s.t.Helper()
	n := 0
	ctx := context.Background()
	iter := s.RDB.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	if err := iter.Err(); err != nil {
		s.t.Fatal(err)
	}
	return n
}

// Records counts the keys under "pq:" that hold data: every one except
// the short-lived key the readiness probe writes, the history's minutes
// and the leases of the replicas' background loops (the history sampler's
// among them), which every process writes whether or not work arrives.
func (s *Stack) Records() int {
	s.t.Helper()
	return s.Keys("pq:*") - s.Keys("pq:readyz") - s.Keys("pq:history:*") - s.Keys("pq:lease:*")
}

// Queued returns how many tasks asynq holds in a queue, in any state.
func (s *Stack) Queued(queue string) int {
	s.t.Helper()
	info, err := asynq.NewInspectorFromRedisClient(s.RDB).GetQueueInfo(queue)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return 0
		}
		s.t.Fatalf("queue info: %v", err)
	}
	return info.Size + info.Processed
}

// Running returns how many tasks of a queue are pending or active.
func (s *Stack) Running(queue string) int {
	s.t.Helper()
	ctx := context.Background()
	n, err := s.RDB.LLen(ctx, asynqdata.PendingKey(queue)).Result()
	if err != nil {
		s.t.Fatal(err)
	}
	a, err := s.RDB.LLen(ctx, asynqdata.ActiveKey(queue)).Result()
	if err != nil {
		s.t.Fatal(err)
	}
	return int(n + a)
}

// Logs collects the logs of a test's stack (Options.LogOut) and prints
// them if the test fails. Call it before Start: cleanups run last first,
// so the logs are printed after the stack has stopped.
func Logs(t testing.TB) *LogBuffer {
	t.Helper()
	b := &LogBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("stack logs:\n%s", b.String())
		}
	})
	return b
}

// LogBuffer is a buffer that the stack's goroutines may write at once.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
