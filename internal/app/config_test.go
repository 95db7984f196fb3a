package app_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/internal/app"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	w, err := app.LoadWorkerConfig(nil, func(k string) string {
		return map[string]string{"REDIS_URL": "redis://localhost:6379/0"}[k]
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if w.HTTPAddr != ":8081" || w.TaskCheckInterval != 20*time.Millisecond || w.ShutdownTimeout != 25*time.Second ||
		w.TaskTTL != 24*time.Hour || w.KeyPrefix != "pq:" || w.QueueWeights != "interactive=6,bulk=1" || w.FeedDepth != 64 {
		t.Fatalf("worker defaults: %+v", w)
	}
	// The config table is the one home of the per-kind defaults, and tasks
	// has no fallback: a kind puzzle knows without a deadline would time
	// out at once.
	for _, k := range puzzle.Kinds {
		if d := w.Limits().Deadline[k]; d <= 0 {
			t.Errorf("no default deadline for %s: %v", k, d)
		}
	}
	// DefaultLimits, which the tests' local reference solves use, are the
	// limits a worker loads with no settings, node budgets included.
	def, loaded := app.DefaultLimits(), w.Limits()
	for _, k := range puzzle.Kinds {
		if def.MaxNodes[k] != loaded.MaxNodes[k] || def.Deadline[k] != loaded.Deadline[k] {
			t.Errorf("%s: DefaultLimits %d nodes %v, the loaded worker %d nodes %v",
				k, def.MaxNodes[k], def.Deadline[k], loaded.MaxNodes[k], loaded.Deadline[k])
		}
	}
	if def.MaxNodes[puzzle.KindSliding] != 3_000_000_000 {
		t.Errorf("SLIDING_MAX_NODES default %d, want 3000000000", def.MaxNodes[puzzle.KindSliding])
	}
	a, err := app.LoadAPIConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if a.HTTPAddr != ":8080" || a.MaxBodyBytes != 1<<20 || a.MaxBatchItems != 1000000 || a.MaxWait != time.Minute || a.RedisURL != "" ||
		a.MaxConcurrentDecodes != 0 || a.BodyReadTimeout != 30*time.Second || a.BodyMinRate != 64<<10 ||
		a.MaxBytesInFlight != 32<<20 || a.MaxKeyBytesInFlight != 16<<20 || a.DrainTime != 2*time.Second || a.ShutdownTimeout != 15*time.Second {
		t.Fatalf("api defaults: %+v", a)
	}
	// Flags override the environment.
	a, err = app.LoadAPIConfig([]string{"--max-batch-items", "7", "--http-addr", ":9"},
		func(k string) string { return map[string]string{"MAX_BATCH_ITEMS": "5"}[k] }, io.Discard)
	if err != nil || a.MaxBatchItems != 7 || a.HTTPAddr != ":9" {
		t.Fatalf("flags over env: %+v %v", a, err)
	}
}

func TestConfigErrorsNameTheSetting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		worker bool
		env    map[string]string
		args   []string
		want   string
	}{
		{true, map[string]string{}, nil, "REDIS_URL"},
		{true, map[string]string{"REDIS_URL": "http://x"}, nil, "REDIS_URL"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "WORKER_CONCURRENCY": "-1"}, nil, "WORKER_CONCURRENCY"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "MAX_EXPENSIVE_PER_KEY": "-1"}, nil, "MAX_EXPENSIVE_PER_KEY"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "TASK_CHECK_INTERVAL": "soon"}, nil, "TASK_CHECK_INTERVAL"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "TASK_CHECK_INTERVAL": "0s"}, nil, "TASK_CHECK_INTERVAL"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "QUEUE_WEIGHTS": "interactive=6"}, nil, "QUEUE_WEIGHTS"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "QUEUE_WEIGHTS": "interactive=x,bulk=1"}, nil, "QUEUE_WEIGHTS"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "QUEUE_WEIGHTS": "interactive=6,bulk=1,webhooks=1"}, nil, "WEBHOOK_CONCURRENCY"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "WEBHOOK_CONCURRENCY": "0"}, nil, "WEBHOOK_CONCURRENCY"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "WEBHOOK_CONCURRENCY": "257"}, nil, "WEBHOOK_CONCURRENCY"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "QUEUE_WEIGHTS": "interactive=6,bulk=1,cheap=1"}, nil, "CHEAP_CONCURRENCY"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "CHEAP_CONCURRENCY": "0"}, nil, "CHEAP_CONCURRENCY"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "CHEAP_CONCURRENCY": "257"}, nil, "CHEAP_CONCURRENCY"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "SHUTDOWN_TIMEOUT": "-1s"}, nil, "SHUTDOWN_TIMEOUT"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "SWEEP_DEADLINE": "0s"}, nil, "SWEEP_DEADLINE"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "LOG_LEVEL": "loud"}, nil, "LOG_LEVEL"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "KEY_PREFIX": "a{b}"}, nil, "KEY_PREFIX"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "FEED_DEPTH": "0"}, nil, "FEED_DEPTH"},
		{true, map[string]string{"REDIS_SENTINELS": "127.0.0.1:26379"}, nil, "REDIS_MASTER_NAME"},
		{true, map[string]string{"REDIS_MASTER_NAME": "pq"}, nil, "REDIS_SENTINELS"},
		{true, map[string]string{"REDIS_SENTINELS": "127.0.0.1", "REDIS_MASTER_NAME": "pq"}, nil, "REDIS_SENTINELS"},
		{true, map[string]string{"REDIS_SENTINELS": "a:1,b:2/x", "REDIS_MASTER_NAME": "pq"}, nil, "REDIS_SENTINELS"},
		{false, map[string]string{"REDIS_SENTINELS": "a:1", "REDIS_MASTER_NAME": "pq", "REDIS_URL": "redis://x:1"}, nil, "REDIS_SENTINELS"},
		{false, map[string]string{"API_KEYS": "alice:short"}, nil, "API_KEYS"},
		{false, map[string]string{"OPERATOR_RATE_LIMIT_BURST": "0"}, nil, "OPERATOR_RATE_LIMIT_BURST"},
		{false, map[string]string{"AUTH_FAILURES_PER_MINUTE": "0"}, nil, "AUTH_FAILURES_PER_MINUTE"},
		{false, map[string]string{"MAX_BODY_BYTES": "lots"}, nil, "MAX_BODY_BYTES"},
		{false, map[string]string{"MAX_BATCH_ITEMS": "0"}, nil, "MAX_BATCH_ITEMS"},
		{false, map[string]string{"CHUNK_SIZE": "4096"}, nil, "CHUNK_SIZE"},
		{false, map[string]string{"MAX_WAIT": "1h"}, nil, "MAX_WAIT"},
		{false, map[string]string{"DRAIN_TIME": "-1s"}, nil, "DRAIN_TIME"},
		{false, map[string]string{"OUTBOX_INTERVAL": "0s"}, nil, "OUTBOX_INTERVAL"},
		{false, map[string]string{"WORKER_DEAD_AFTER": "500ms"}, nil, "WORKER_DEAD_AFTER"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "HEARTBEAT_INTERVAL": "10ms"}, nil, "HEARTBEAT_INTERVAL"},
		{true, map[string]string{"REDIS_URL": "redis://x:1", "DEADLINE_ATTEMPTS": "0"}, nil, "DEADLINE_ATTEMPTS"},
		{false, map[string]string{"DEADLINE_ATTEMPTS": "12"}, nil, "DEADLINE_ATTEMPTS"},
		{false, map[string]string{"MAX_CONCURRENT_DECODES": "-1"}, nil, "MAX_CONCURRENT_DECODES"},
		{false, map[string]string{"BODY_MIN_RATE": "0"}, nil, "BODY_MIN_RATE"},
		{false, map[string]string{"MAX_KEY_BYTES_IN_FLIGHT": "512Ki"}, nil, "MAX_KEY_BYTES_IN_FLIGHT"},
		{false, map[string]string{"MAX_BYTES_IN_FLIGHT": "8Mi"}, nil, "MAX_KEY_BYTES_IN_FLIGHT"}, // the share's default, 16Mi, is past it
		{false, nil, []string{"--chunk-size", "x"}, "chunk-size"},
		{false, nil, []string{"--no-such-flag"}, "no-such-flag"},
	} {
		getenv := func(k string) string { return tc.env[k] }
		var err error
		if tc.worker {
			_, err = app.LoadWorkerConfig(tc.args, getenv, io.Discard)
		} else {
			_, err = app.LoadAPIConfig(tc.args, getenv, io.Discard)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("env %v args %v: error %v, want it to name %s", tc.env, tc.args, err, tc.want)
		}
	}
}

// TestSentinelSettings: REDIS_SENTINELS and REDIS_MASTER_NAME become the
// redis-sentinel:// URL asynq parses into its failover options.
func TestSentinelSettings(t *testing.T) {
	t.Parallel()
	env := map[string]string{"REDIS_SENTINELS": "10.0.0.1:26379, 10.0.0.2:26379,10.0.0.3:26380", "REDIS_MASTER_NAME": "pq-main"}
	w, err := app.LoadWorkerConfig(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	opt, err := asynq.ParseRedisURI(w.RedisURL)
	fo, ok := opt.(asynq.RedisFailoverClientOpt)
	if err != nil || !ok || fo.MasterName != "pq-main" || strings.Join(fo.SentinelAddrs, " ") != "10.0.0.1:26379 10.0.0.2:26379 10.0.0.3:26380" {
		t.Errorf("REDIS_URL %q parses to %#v, %v", w.RedisURL, opt, err)
	}
}

func TestEnvListsCoverSharedSettings(t *testing.T) {
	t.Parallel()
	api := strings.Join(app.APIEnv(), " ")
	worker := strings.Join(app.WorkerEnv(), " ")
	for _, v := range []string{"REDIS_URL", "HTTP_ADDR", "TASK_TTL", "RESULT_TTL", "KEY_PREFIX", "SHUTDOWN_TIMEOUT", "FEED_DEPTH"} {
		if !strings.Contains(api, v) || !strings.Contains(worker, v) {
			t.Errorf("%s missing from a binary's settings", v)
		}
	}
	if !strings.Contains(worker, "WORKER_CONCURRENCY") || !strings.Contains(api, "METRICS_ADDR") {
		t.Error("binary-specific settings missing")
	}
}

// With the default settings a failed webhook is retried for at least an
// hour, however the jitter falls, and a bad secret or allowed host stops
// the process naming the setting.
func TestWebhookDefaults(t *testing.T) {
	t.Parallel()
	a, err := app.LoadAPIConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o := a.WebhookOptions()
	var span time.Duration
	for n := range o.MaxRetry {
		span += tasks.WebhookRetryDelay(n, o.RetryBase, o.RetryMax, func(d time.Duration) time.Duration { return d })
	}
	if span < time.Hour {
		t.Errorf("the default retries span %v, want at least an hour", span)
	}
	for k, v := range map[string]string{"WEBHOOK_SECRET": "not-whsec", "WEBHOOK_ALLOWED_HOSTS": "a b", "WEBHOOK_RETRY_MAX": "1s"} {
		_, err := app.LoadAPIConfig(nil, func(key string) string {
			if key == k {
				return v
			}
			return ""
		}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%q: %v", k, v, err)
		}
	}
}
