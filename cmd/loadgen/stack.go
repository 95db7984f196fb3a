package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/app"
)

// redisProc is a redis-server child process on a loopback port.
type redisProc struct {
	addr string
	dir  string
	cmd  *exec.Cmd
}

// redisBinary is $REDIS_SERVER, else redis-server on PATH, else
// /usr/bin/redis-server.
func redisBinary() string {
	if b := os.Getenv("REDIS_SERVER"); b != "" {
		return b
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	return "/usr/bin/redis-server"
}

// startRedis starts a throwaway redis-server without persistence; it
// retries a few times in case another process takes the free port first.
func startRedis() (*redisProc, error) {
	dir, err := os.MkdirTemp("", "loadgen-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		r := &redisProc{addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir}
		r.cmd = exec.Command(redisBinary(), "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no",
			"--logfile", filepath.Join(dir, "redis.log"))
		if err := r.cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("start %s: %w", redisBinary(), err)
		}
		if lastErr = r.waitUp(); lastErr == nil {
			return r, nil
		}
		r.cmd.Process.Kill()
		r.cmd.Wait()
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redis-server did not come up: %w", lastErr)
}

func (r *redisProc) waitUp() error {
	c := redis.NewClient(&redis.Options{Addr: r.addr, DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err = c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
	}
	return err
}

func (r *redisProc) stop() {
	r.cmd.Process.Kill()
	r.cmd.Wait()
	os.RemoveAll(r.dir)
}

// url is the redis:// URL of database db.
func (r *redisProc) url(db int) string { return "redis://" + r.addr + "/" + strconv.Itoa(db) }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stack is puzzleq running inside this process: Redis, the API and the
// workers, which can be restarted with other settings (pickup does).
type stack struct {
	redis    *redisProc
	rdb      *redis.Client // db 0, for INFO and FLUSHDB
	api      *app.API
	apiStop  context.CancelFunc
	apiDone  chan error
	baseURL  string
	workers  []*runningWorker
	logLevel string
	logOut   io.Writer
}

type runningWorker struct {
	w    *app.Worker
	stop context.CancelFunc
	done chan error
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func startStack(o *options) (_ *stack, err error) {
	s := &stack{logLevel: o.logLevel, logOut: os.Stderr}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.redis, err = startRedis(); err != nil {
		return nil, err
	}
	s.rdb = redis.NewClient(&redis.Options{Addr: s.redis.addr})
	cfg, err := app.LoadAPIConfig(nil, env(map[string]string{
		"REDIS_URL": s.redis.url(0), "HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": o.logLevel, "LOG_FORMAT": "text",
		"SHUTDOWN_TIMEOUT": "5s",
	}), io.Discard)
	if err != nil {
		return nil, fmt.Errorf("api config: %w", err)
	}
	if s.api, err = app.NewAPI(cfg, cfg.Logger(s.logOut).With("component", "api")); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.apiStop, s.apiDone = cancel, make(chan error, 1)
	go func() { s.apiDone <- s.api.Run(ctx) }()
	s.baseURL = "http://" + s.api.Addr()
	if err := s.startWorkers(o.workers, o.concurrency, o.checkInterval); err != nil {
		return nil, err
	}
	return s, nil
}

// startWorkers starts n workers of the given concurrency (0: GOMAXPROCS)
// and task check interval.
func (s *stack) startWorkers(n, concurrency int, interval time.Duration) error {
	for range n {
		cfg, err := app.LoadWorkerConfig(nil, env(map[string]string{
			"REDIS_URL": s.redis.url(0), "HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": s.logLevel, "LOG_FORMAT": "text",
			"WORKER_CONCURRENCY": strconv.Itoa(concurrency), "TASK_CHECK_INTERVAL": interval.String(), "PDB_PRELOAD": "false",
			"SHUTDOWN_TIMEOUT": "5s",
		}), io.Discard)
		if err != nil {
			return fmt.Errorf("worker config: %w", err)
		}
		w, err := app.NewWorker(cfg, cfg.Logger(s.logOut).With("component", "worker"))
		if err != nil {
			return err
		}
		ctx, cancel := context.WithCancel(context.Background())
		rw := &runningWorker{w: w, stop: cancel, done: make(chan error, 1)}
		go func() { rw.done <- w.Run(ctx) }()
		s.workers = append(s.workers, rw)
	}
	return nil
}

// stopWorkers stops every worker and waits for it.
func (s *stack) stopWorkers() {
	for _, rw := range s.workers {
		rw.stop()
	}
	for _, rw := range s.workers {
		<-rw.done
		rw.w.Close()
	}
	s.workers = nil
}

func (s *stack) close() {
	s.stopWorkers()
	if s.apiStop != nil {
		s.apiStop()
		<-s.apiDone
	}
	if s.api != nil {
		s.api.Close()
	}
	if s.rdb != nil {
		s.rdb.Close()
	}
	if s.redis != nil {
		s.redis.stop()
	}
}
