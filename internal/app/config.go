// Package app assembles puzzleq's processes: it loads each binary's
// Config, connects Redis, and runs the API or the worker until its context
// ends, then shuts down gracefully. cmd/api and cmd/worker call it, and
// so do the tests, which is why it is a package and not main.
package app

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/egress"
	"github.com/puzzleq/puzzleq/internal/envflag"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/tracing"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/tasks"
	"github.com/puzzleq/puzzleq/webhook"
)

// Common holds the settings both binaries share.
type Common struct {
	// RedisURL is redis://[user:pass@]host:port/db or rediss:// for TLS.
	// Default "": the API then runs embedded (in-memory Redis and an
	// in-process worker); the worker requires it.
	RedisURL string
	// RedisSentinels is "host:port,host:port,...", Redis Sentinels that
	// name the master of RedisMasterName; set instead of RedisURL, both
	// binaries then follow the master through failovers (go-redis's
	// failover client, the same for asynq). It is the same as REDIS_URL
	// redis-sentinel://host:port,...?master=NAME. Default "".
	RedisSentinels string
	// RedisMasterName is the master's name in the Sentinels' config
	// (sentinel monitor NAME ...); required with RedisSentinels. Default
	// "".
	RedisMasterName string
	// RedisAckReplicas is how many replicas must confirm (Redis WAIT)
	// every write that a 2xx or a task's ack promises before it is
	// given; when fewer do within RedisAckTimeout the API answers 503
	// and a worker leaves the task unacked (docs/guarantees.md). Needs
	// REDIS_URL or REDIS_SENTINELS. Default 0: no write waits.
	RedisAckReplicas int
	// RedisAckTimeout bounds that wait. Default 1s.
	RedisAckTimeout time.Duration
	// KeyPrefix prefixes puzzleq's own Redis keys. Default "pq:".
	KeyPrefix string
	// TaskTTL is how long task and batch records are kept. Default 24h.
	TaskTTL time.Duration
	// ResultTTL is how long cached results are kept. Default 24h.
	ResultTTL time.Duration
	// SlidingDeadline bounds one sliding solve. 3×3 boards take
	// microseconds; the 15-puzzle's hardest (80-move) boards take about
	// 100 s of CPU, so the bound is generous. Default 5m.
	SlidingDeadline time.Duration
	// SlidingMaxNodes caps a sliding search's nodes (boards over 9 cells);
	// an 80-move 4×4 board needs 1.1 G. Requests may lower it, never raise
	// it. Default 3000000000.
	SlidingMaxNodes int64
	// SweepDeadline bounds one sweep solve. Default 60s.
	SweepDeadline time.Duration
	// FillDeadline bounds one fill solve. Default 10s.
	FillDeadline time.Duration
	// SweepMaxNodes caps the sweep search's nodes; 0 keeps the solver's
	// default. Requests may lower it, never raise it. Default 0.
	SweepMaxNodes int64
	// DeadlineAttempts is how many deliveries of a task may overrun a
	// solve deadline before the item fails with timeout. Wall time is not
	// the solve's to decide: a frozen or throttled worker overruns a
	// deadline that the same solve meets elsewhere, so an overrun is
	// retried like an infrastructure fault (about a second later, on
	// whichever worker takes it). The node budgets are what fail a search
	// for good (budget_exceeded), the same on every machine. Deliveries
	// are asynq's: a retry for any reason counts. Default 3.
	DeadlineAttempts int
	// FeedDepth is how many batch units asynq's bulk queue holds waiting
	// at most: the API (after a commit), every worker (after a unit) and
	// the reconciler move units from the fair feed onto the queue only
	// while it is shorter (docs/batches.md). Shallow, a key's new batch
	// waits behind at most this many units of another key's big one;
	// deep enough that no idle worker finds the queue empty between two
	// feeds. Default 64.
	FeedDepth int
	// WebhookSecret signs completion webhooks, in the Standard Webhooks
	// form "whsec_<base64 of 24 to 64 bytes>"; the API and the workers
	// need the same one. Default "": no webhooks (a submission naming one
	// is answered 400).
	WebhookSecret string
	// WebhookAllowedHosts lists host names, addresses and CIDR prefixes
	// that webhooks may reach although they are not public (loopback,
	// private, link-local...), comma-separated (SECURITY.md). Default "":
	// public addresses only.
	WebhookAllowedHosts string
	// WebhookTimeout bounds one delivery attempt, connection to answer.
	// Default 10s.
	WebhookTimeout time.Duration
	// WebhookRetryBase is the wait before a failed delivery's first
	// retry, doubled for each next one up to WebhookRetryMax. Default 10s.
	WebhookRetryBase time.Duration
	// WebhookRetryMax caps the wait between retries. Default 10m.
	WebhookRetryMax time.Duration
	// WebhookMaxRetry is how many times a failed delivery is retried:
	// with the defaults, 20 retries span about 2.5 hours. Default 20.
	WebhookMaxRetry int
	// GCHeapFloor is the least heap, in bytes, at which the Go garbage
	// collector starts a cycle (SetGCHeapFloor): with a live heap of a
	// few MiB, GOGC=100 collects many times a second under load. Above
	// half of it the heap grows as GOGC=100 lets it, so the memory bounds
	// of large requests do not change. 0 turns it off, and so does
	// setting GOGC. Default 32Mi.
	GCHeapFloor int64
	// Tracing is where OpenTelemetry traces go (OTEL_EXPORTER_OTLP_*)
	// and the service they are of (OTEL_SERVICE_NAME, bound by each
	// binary's set with its own default). Without an endpoint tracing is
	// off and costs nothing. The SDK reads the other OTEL_* variables
	// (headers, timeout, OTEL_BSP_*, the sampler) from the environment.
	// Defaults: no endpoint, protocol http/protobuf.
	Tracing tracing.Config
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
	// LogFormat is json or text. Default json.
	LogFormat string
}

func (c *Common) bind(s *envflag.Set) {
	s.String(&c.RedisURL, "REDIS_URL", "", "Redis URL (redis://, rediss:// or redis-sentinel://)")
	s.String(&c.RedisSentinels, "REDIS_SENTINELS", "", "Redis Sentinel addresses host:port,... (instead of REDIS_URL)")
	s.String(&c.RedisMasterName, "REDIS_MASTER_NAME", "", "the master's name at the Sentinels (with REDIS_SENTINELS)")
	s.Int(&c.RedisAckReplicas, "REDIS_ACK_REPLICAS", "0", "replicas that must confirm a write before its 2xx or ack (0: none)")
	s.Duration(&c.RedisAckTimeout, "REDIS_ACK_TIMEOUT", "1s", "longest wait for those replicas' confirmation")
	s.String(&c.KeyPrefix, "KEY_PREFIX", "pq:", "prefix of puzzleq's Redis keys")
	s.Duration(&c.TaskTTL, "TASK_TTL", "24h", "how long task and batch records are kept")
	s.Duration(&c.ResultTTL, "RESULT_TTL", "24h", "how long cached results are kept")
	s.Duration(&c.SlidingDeadline, "SLIDING_DEADLINE", "5m", "deadline of one sliding solve")
	s.Int64(&c.SlidingMaxNodes, "SLIDING_MAX_NODES", "3000000000", "node budget of one sliding search")
	s.Duration(&c.SweepDeadline, "SWEEP_DEADLINE", "60s", "deadline of one sweep solve")
	s.Duration(&c.FillDeadline, "FILL_DEADLINE", "10s", "deadline of one fill solve")
	s.Int64(&c.SweepMaxNodes, "SWEEP_MAX_NODES", "0", "node budget of one sweep solve (0: solver default)")
	s.Int(&c.FeedDepth, "FEED_DEPTH", "64", "most batch units waiting on the bulk queue")
	s.Int(&c.DeadlineAttempts, "DEADLINE_ATTEMPTS", "3", "deliveries a solve may overrun its deadline before it fails with timeout")
	s.String(&c.WebhookSecret, "WEBHOOK_SECRET", "", "key signing webhooks, whsec_<base64> (empty: no webhooks)")
	s.String(&c.WebhookAllowedHosts, "WEBHOOK_ALLOWED_HOSTS", "", "non-public hosts, addresses and CIDRs webhooks may reach")
	s.Duration(&c.WebhookTimeout, "WEBHOOK_TIMEOUT", "10s", "deadline of one webhook delivery attempt")
	s.Duration(&c.WebhookRetryBase, "WEBHOOK_RETRY_BASE", "10s", "wait before a failed webhook's first retry, doubled per retry")
	s.Duration(&c.WebhookRetryMax, "WEBHOOK_RETRY_MAX", "10m", "longest wait between webhook retries")
	s.Int(&c.WebhookMaxRetry, "WEBHOOK_MAX_RETRY", "20", "retries of a failed webhook delivery")
	s.Int64(&c.GCHeapFloor, "GC_HEAP_FLOOR", "32Mi", "least heap at which the Go GC starts a cycle (0: GOGC alone)")
	s.String(&c.Tracing.Endpoint, "OTEL_EXPORTER_OTLP_ENDPOINT", "", "OTLP base URL traces are exported to (empty: tracing off)")
	s.String(&c.Tracing.TracesEndpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "", "OTLP URL of traces alone, used as it is (wins over the base URL)")
	s.String(&c.Tracing.Protocol, "OTEL_EXPORTER_OTLP_PROTOCOL", tracing.ProtocolHTTP, "OTLP protocol: http/protobuf or grpc")
	s.String(&c.Tracing.TracesProtocol, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "", "OTLP protocol of traces (empty: OTEL_EXPORTER_OTLP_PROTOCOL)")
	s.String(&c.LogLevel, "LOG_LEVEL", "info", "debug, info, warn or error")
	s.String(&c.LogFormat, "LOG_FORMAT", "json", "json or text")
}

// storeOptions are the store's options from these settings.
func (c *Common) storeOptions() store.Options {
	o := store.Options{Prefix: c.KeyPrefix, TaskTTL: c.TaskTTL, ResultTTL: c.ResultTTL}
	if c.RedisAckReplicas > 0 {
		o.AckReplicas, o.AckTimeout = c.RedisAckReplicas, c.RedisAckTimeout
	}
	return o
}

// callTimeout bounds one Redis call of the API (redisCallTimeout), plus
// the WAIT a confirmed write ends with.
func (c *Common) callTimeout() time.Duration {
	if c.RedisAckReplicas > 0 {
		return redisCallTimeout + c.RedisAckTimeout
	}
	return redisCallTimeout
}

func (c *Common) validate() error {
	if err := c.sentinels(); err != nil {
		return err
	}
	if c.RedisURL != "" {
		if _, err := asynq.ParseRedisURI(c.RedisURL); err != nil {
			return fmt.Errorf("REDIS_URL: %v", err)
		}
	}
	if c.RedisAckReplicas < 0 || c.RedisAckReplicas > 64 {
		return fmt.Errorf("REDIS_ACK_REPLICAS: must be 0..64, got %d", c.RedisAckReplicas)
	}
	if c.RedisAckReplicas > 0 && c.RedisURL == "" {
		return fmt.Errorf("REDIS_ACK_REPLICAS: needs REDIS_URL or REDIS_SENTINELS (the embedded Redis has no replicas)")
	}
	if c.RedisAckTimeout < time.Millisecond || c.RedisAckTimeout > time.Minute {
		return fmt.Errorf("REDIS_ACK_TIMEOUT: must be 1ms..1m, got %s", c.RedisAckTimeout)
	}
	if c.GCHeapFloor < 0 || c.GCHeapFloor > 64<<30 {
		return fmt.Errorf("GC_HEAP_FLOOR: must be 0..64Gi bytes, got %d", c.GCHeapFloor)
	}
	if c.KeyPrefix == "" || strings.ContainsAny(c.KeyPrefix, "{} ") {
		return fmt.Errorf("KEY_PREFIX: must be non-empty without braces or spaces, got %q", c.KeyPrefix)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"TASK_TTL", c.TaskTTL}, {"RESULT_TTL", c.ResultTTL}, {"SLIDING_DEADLINE", c.SlidingDeadline},
		{"SWEEP_DEADLINE", c.SweepDeadline}, {"FILL_DEADLINE", c.FillDeadline}} {
		if d.v <= 0 {
			return fmt.Errorf("%s: must be positive, got %s", d.name, d.v)
		}
	}
	if c.FeedDepth < 1 || c.FeedDepth > 100000 {
		return fmt.Errorf("FEED_DEPTH: must be between 1 and 100000, got %d", c.FeedDepth)
	}
	if c.DeadlineAttempts < 1 || c.DeadlineAttempts > tasks.MaxDeliveries {
		return fmt.Errorf("DEADLINE_ATTEMPTS: must be between 1 and %d, got %d", tasks.MaxDeliveries, c.DeadlineAttempts)
	}
	if c.SweepMaxNodes < 0 {
		return fmt.Errorf("SWEEP_MAX_NODES: must not be negative")
	}
	if c.SlidingMaxNodes < 0 {
		return fmt.Errorf("SLIDING_MAX_NODES: must not be negative")
	}
	if c.WebhookSecret != "" {
		if _, err := webhook.ParseSecret(c.WebhookSecret); err != nil {
			return fmt.Errorf("WEBHOOK_SECRET: %v", err)
		}
	}
	if _, err := egress.ParsePolicy(c.WebhookAllowedHosts); err != nil {
		return fmt.Errorf("WEBHOOK_ALLOWED_HOSTS: %v", err)
	}
	if c.WebhookTimeout <= 0 || c.WebhookTimeout > 5*time.Minute {
		return fmt.Errorf("WEBHOOK_TIMEOUT: must be between 1ns and 5m, got %s", c.WebhookTimeout)
	}
	if c.WebhookRetryBase <= 0 || c.WebhookRetryMax < c.WebhookRetryBase {
		return fmt.Errorf("WEBHOOK_RETRY_BASE and WEBHOOK_RETRY_MAX: must be positive, the max at least the base; got %s and %s",
			c.WebhookRetryBase, c.WebhookRetryMax)
	}
	if c.WebhookMaxRetry < 0 || c.WebhookMaxRetry > 1000 {
		return fmt.Errorf("WEBHOOK_MAX_RETRY: must be between 0 and 1000, got %d", c.WebhookMaxRetry)
	}
	if err := c.Tracing.Validate(); err != nil {
		return err
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return fmt.Errorf("LOG_LEVEL: %v", err)
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		return fmt.Errorf("LOG_FORMAT: must be json or text, got %q", c.LogFormat)
	}
	return nil
}

// sentinels checks REDIS_SENTINELS and REDIS_MASTER_NAME and, when they
// are set, writes them as the redis-sentinel:// REDIS_URL that asynq
// parses (into its RedisFailoverClientOpt, which newRedisClient opens as
// go-redis's failover client), so everything downstream has one form.
func (c *Common) sentinels() error {
	if c.RedisSentinels == "" {
		if c.RedisMasterName != "" {
			return fmt.Errorf("REDIS_MASTER_NAME: needs REDIS_SENTINELS")
		}
		return nil
	}
	if c.RedisURL != "" {
		return fmt.Errorf("REDIS_SENTINELS: set either it or REDIS_URL, not both")
	}
	if !keyName.MatchString(c.RedisMasterName) {
		return fmt.Errorf("REDIS_MASTER_NAME: required with REDIS_SENTINELS, 1-64 of A-Z a-z 0-9 _ . -, got %q", c.RedisMasterName)
	}
	var addrs []string
	for _, a := range strings.Split(c.RedisSentinels, ",") {
		a = strings.TrimSpace(a)
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" || strings.ContainsAny(a, "/?#@") {
			return fmt.Errorf("REDIS_SENTINELS: %q is not host:port", a)
		}
		addrs = append(addrs, a)
	}
	c.RedisURL = "redis-sentinel://" + strings.Join(addrs, ",") + "?master=" + c.RedisMasterName
	return nil
}

// Limits returns the per-kind limits put on tasks.
func (c *Common) Limits() tasks.Limits {
	return tasks.Limits{
		Deadline: map[puzzle.Kind]time.Duration{
			puzzle.KindSliding: c.SlidingDeadline, puzzle.KindSweep: c.SweepDeadline, puzzle.KindFill: c.FillDeadline,
		},
		MaxNodes:         map[puzzle.Kind]int64{puzzle.KindSweep: c.SweepMaxNodes, puzzle.KindSliding: c.SlidingMaxNodes},
		DeadlineAttempts: c.DeadlineAttempts,
	}
}

// DefaultLimits returns the limits a worker runs with when no setting
// overrides them. Tests that check the service's answers against a local
// solve use it, so that the reference search has the worker's node budget
// (SLIDING_MAX_NODES is 15 times the solver's own default): a board that
// a worker solves must not fail locally for a smaller budget.
func DefaultLimits() tasks.Limits {
	var c WorkerConfig
	if err := c.set().Load("worker", nil, func(string) string { return "" }, io.Discard); err != nil {
		panic("app: the worker's defaults do not load: " + err.Error())
	}
	return c.Limits()
}

// webhookPolicy is the parsed WEBHOOK_ALLOWED_HOSTS (validated).
func (c *Common) webhookPolicy() *egress.Policy {
	p, err := egress.ParsePolicy(c.WebhookAllowedHosts)
	if err != nil {
		p, _ = egress.ParsePolicy("")
	}
	return p
}

// webhookSigner is the parsed WEBHOOK_SECRET; nil when unset.
func (c *Common) webhookSigner() *webhook.Signer {
	s, err := webhook.ParseSecret(c.WebhookSecret)
	if err != nil {
		return nil
	}
	return s
}

// WebhookOptions are the delivery settings.
func (c *Common) WebhookOptions() tasks.WebhookOptions {
	return tasks.WebhookOptions{Timeout: c.WebhookTimeout, MaxRetry: c.WebhookMaxRetry,
		RetryBase: c.WebhookRetryBase, RetryMax: c.WebhookRetryMax}
}

// Logger builds the process logger to the settings.
func (c *Common) Logger(w io.Writer) *slog.Logger {
	lvl, _ := parseLevel(c.LogLevel)
	opts := &slog.HandlerOptions{Level: lvl}
	if c.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// WorkerSettings are the settings of a worker, also used by the API's
// embedded worker.
type WorkerSettings struct {
	// Concurrency is how many tasks run at once. Default 0: GOMAXPROCS.
	Concurrency int
	// TaskCheckInterval is how often an idle worker polls for tasks.
	// Asynq's 1s default makes an idle worker take ~500ms to notice a
	// task. Measured (cmd/loadgen -scenario pickup): 20ms gives an idle
	// pickup p50 of 12-13ms for ~280 Redis commands/s (~1% of a Redis
	// core) per idle worker process; 5ms buys 6ms more for 3x the load.
	// Default 20ms.
	TaskCheckInterval time.Duration
	// QueueWeights are asynq's queue priorities. Default
	// "interactive=6,bulk=1": singles are picked 6 times as often as bulk.
	// Webhook deliveries are not among them: they have slots of their own
	// (WebhookConcurrency), and so has the cheap lane (CheapConcurrency),
	// whose two queues take the interactive and bulk weights.
	QueueWeights string
	// WebhookConcurrency is how many webhook deliveries a worker runs at
	// once, on slots of their own apart from Concurrency's: a delivery
	// waits on a receiver for up to WEBHOOK_TIMEOUT, so deliveries to a
	// receiver that never answers must not hold the solvers' slots.
	// Default 4.
	WebhookConcurrency int
	// CheapConcurrency is how many cheap tasks (single sliding boards of
	// up to 9 cells and fills, and batch units of such items) a worker
	// runs at once, on slots of their own apart from Concurrency's, so
	// that cheap work never waits behind searches that hold every solver
	// slot. A cheap item takes microseconds, so a few slots carry a
	// worker's share of them (docs/operations.md gives the measurement).
	// Default 2.
	CheapConcurrency int
	// PDBDir holds the 15-puzzle's pattern databases: the 7-8 files
	// built by puzzlectl pdb build, mapped read-only (shared through the
	// page cache by every worker of the node), and the 6-6-3 ones (7.6
	// MiB), cached there between restarts and verified by SHA-256 when
	// loaded. Default "": 6-6-3 built in memory at start (about 9 s of
	// CPU).
	PDBDir string
	// PDBSet is the 4x4 table set: "78" maps the 7-8 files from PDBDir
	// and falls back to 6-6-3 (logged, and shown by /readyz) when they are
	// missing; "663" is the small-memory choice. Default "78".
	PDBSet string
	// PDBPreload builds or loads the pattern databases when the worker
	// starts, and readiness waits for them. Off, the first large sliding
	// board builds them on demand. Default true.
	PDBPreload bool
	// WriteInterval is how long a running batch unit keeps finished items
	// before it writes them: a unit of CHUNK_SIZE items is written in
	// pieces, so its batch shows progress and a worker that dies loses
	// at most this much of it. Default 100ms.
	WriteInterval time.Duration
	// HeartbeatInterval is how often the worker writes its heartbeat and
	// the tasks it runs to Redis, where the API's watchdog notices a
	// worker that stopped (WORKER_DEAD_AFTER) and re-drives its tasks.
	// Each beat is one pipelined round trip, and one script that records
	// the worker's solver slots (worker.Heartbeat.SetSlots). Default 500ms.
	HeartbeatInterval time.Duration
	// HistoryInterval is how often the worker adds what it ended to the
	// per-minute history (GET /v1/history, the dashboard's charts): one
	// pipelined round trip per interval, whatever the rate of tasks. A
	// worker that dies loses at most this much of the history, never a
	// task. Default 5s.
	HistoryInterval time.Duration
	// CutOffAfter is how long the worker's heartbeats may fail before it
	// stops the tasks it runs. The API's watchdog re-drives the tasks of
	// a worker it has not heard from for WORKER_DEAD_AFTER (2s), so a
	// worker cut off from Redis longer than that is solving work whose
	// copies already run elsewhere: finishing it changes no result (the
	// store ends each item once) but wastes the slot and the CPU. A
	// stopped task is left to asynq, like one stopped at shutdown. Keep
	// it above WORKER_DEAD_AFTER, so that a Redis stall every replica
	// sees (which the watchdog does not take for a death) costs at most
	// a restart of what ran. Default 5s; 0 never stops.
	CutOffAfter time.Duration
	// MaxExpensivePerKey is a hard ceiling on the expensive tasks
	// (puzzle.Cheap false: sweeps, sliding boards over 9 cells) of one
	// API key that run at once, cluster-wide, for operators who want one.
	// Without it (0, the default) a key's share follows the competition:
	// the keys with expensive work share the slots of the workers
	// registered with asynq by weight, and a key alone may use them all
	// (README, "Expensive work"). A task over its share or the ceiling is
	// not failed: it waits and is promoted when a slot frees.
	MaxExpensivePerKey int
}

func (w *WorkerSettings) bind(s *envflag.Set) {
	s.Int(&w.Concurrency, "WORKER_CONCURRENCY", "0", "tasks run at once (0: GOMAXPROCS)")
	s.Duration(&w.TaskCheckInterval, "TASK_CHECK_INTERVAL", "20ms", "poll interval of an idle worker")
	s.String(&w.QueueWeights, "QUEUE_WEIGHTS", "interactive=6,bulk=1", "queue priorities, queue=weight pairs")
	s.Int(&w.WebhookConcurrency, "WEBHOOK_CONCURRENCY", "4", "webhook deliveries run at once, on slots of their own")
	s.Int(&w.CheapConcurrency, "CHEAP_CONCURRENCY", "2", "cheap tasks (boards of up to 9 cells, fills) run at once, on slots of their own")
	s.String(&w.PDBDir, "PDB_DIR", "", "directory caching the 15-puzzle pattern databases (empty: memory only)")
	s.String(&w.PDBSet, "PDB_SET", "78", "15-puzzle table set: 78 (mapped from PDB_DIR, else 663) or 663")
	s.Bool(&w.PDBPreload, "PDB_PRELOAD", "true", "load the pattern databases at start; readiness waits for them")
	s.Duration(&w.WriteInterval, "UNIT_WRITE_INTERVAL", "100ms", "longest a running batch unit keeps finished items unwritten")
	s.Duration(&w.HeartbeatInterval, "HEARTBEAT_INTERVAL", "500ms", "how often the worker writes its heartbeat and running tasks")
	s.Duration(&w.HistoryInterval, "HISTORY_INTERVAL", "5s", "how often the worker adds what it ended to the per-minute history")
	s.Duration(&w.CutOffAfter, "WORKER_CUTOFF_AFTER", "5s", "how long heartbeats may fail before the worker stops its running tasks (0: never)")
	s.Int(&w.MaxExpensivePerKey, "MAX_EXPENSIVE_PER_KEY", "0", "hard ceiling of one key's expensive tasks running at once (0: none; the keys share the slots by weight)")
}

func (w *WorkerSettings) validate() error {
	if w.Concurrency < 0 {
		return fmt.Errorf("WORKER_CONCURRENCY: must not be negative, got %d", w.Concurrency)
	}
	if w.MaxExpensivePerKey < 0 {
		return fmt.Errorf("MAX_EXPENSIVE_PER_KEY: must not be negative, got %d", w.MaxExpensivePerKey)
	}
	if w.WriteInterval < time.Millisecond || w.WriteInterval > time.Minute {
		return fmt.Errorf("UNIT_WRITE_INTERVAL: must be between 1ms and 1m, got %s", w.WriteInterval)
	}
	if w.HistoryInterval < 100*time.Millisecond || w.HistoryInterval > time.Minute {
		return fmt.Errorf("HISTORY_INTERVAL: must be between 100ms and 1m, got %s", w.HistoryInterval)
	}
	if w.HeartbeatInterval < 100*time.Millisecond || w.HeartbeatInterval > time.Minute {
		return fmt.Errorf("HEARTBEAT_INTERVAL: must be between 100ms and 1m, got %s", w.HeartbeatInterval)
	}
	if w.CutOffAfter != 0 && (w.CutOffAfter < 2*w.HeartbeatInterval || w.CutOffAfter > 10*time.Minute) {
		return fmt.Errorf("WORKER_CUTOFF_AFTER: must be 0 or between 2 HEARTBEAT_INTERVALs (%s) and 10m, got %s", 2*w.HeartbeatInterval, w.CutOffAfter)
	}
	if w.TaskCheckInterval < time.Millisecond || w.TaskCheckInterval > time.Minute {
		return fmt.Errorf("TASK_CHECK_INTERVAL: must be between 1ms and 1m, got %s", w.TaskCheckInterval)
	}
	qw, err := envflag.ParseWeights(w.QueueWeights)
	if err != nil {
		return fmt.Errorf("QUEUE_WEIGHTS: %v", err)
	}
	for _, q := range tasks.Queues {
		if qw[q] == 0 {
			return fmt.Errorf("QUEUE_WEIGHTS: queue %q needs a weight", q)
		}
	}
	for q := range qw {
		if strings.ContainsAny(q, "{}") {
			return fmt.Errorf("QUEUE_WEIGHTS: queue name %q must not contain braces", q)
		}
		if q == tasks.QueueWebhooks {
			return fmt.Errorf("QUEUE_WEIGHTS: queue %q has slots of its own; set WEBHOOK_CONCURRENCY instead", q)
		}
		if slices.Contains(tasks.CheapQueues, q) {
			return fmt.Errorf("QUEUE_WEIGHTS: queue %q has slots of its own; set CHEAP_CONCURRENCY instead", q)
		}
	}
	if w.CheapConcurrency < 1 || w.CheapConcurrency > 256 {
		return fmt.Errorf("CHEAP_CONCURRENCY: must be between 1 and 256, got %d", w.CheapConcurrency)
	}
	if w.WebhookConcurrency < 1 || w.WebhookConcurrency > 256 {
		return fmt.Errorf("WEBHOOK_CONCURRENCY: must be between 1 and 256, got %d", w.WebhookConcurrency)
	}
	if _, err := sliding.ParseTableSet(w.PDBSet); err != nil {
		return fmt.Errorf("PDB_SET: must be 78 or 663, got %q", w.PDBSet)
	}
	if w.PDBDir != "" && !filepath.IsAbs(w.PDBDir) {
		return fmt.Errorf("PDB_DIR: must be an absolute path, got %q", w.PDBDir)
	}
	return nil
}

func (w *WorkerSettings) concurrency() int {
	if w.Concurrency > 0 {
		return w.Concurrency
	}
	return runtime.GOMAXPROCS(0)
}

func (w *WorkerSettings) weights() map[string]int {
	qw, _ := envflag.ParseWeights(w.QueueWeights)
	return qw
}

// cheapWeights are the cheap lane's queue priorities: its singles and
// its batch units weigh what the interactive and bulk queues do in
// QUEUE_WEIGHTS.
func (w *WorkerSettings) cheapWeights() map[string]int {
	qw := w.weights()
	return map[string]int{tasks.QueueCheap: qw[tasks.QueueInteractive], tasks.QueueCheapBulk: qw[tasks.QueueBulk]}
}

// WorkerConfig configures cmd/worker.
type WorkerConfig struct {
	Common
	WorkerSettings
	// HTTPAddr is where /healthz, /readyz and /metrics are served.
	// Default ":8081", so a worker can share a host with the API.
	HTTPAddr string
	// ShutdownTimeout is how long running tasks may finish after SIGTERM
	// before they are requeued. Keep it below the pod's
	// terminationGracePeriodSeconds. Default 25s.
	ShutdownTimeout time.Duration
}

func (c *WorkerConfig) set() *envflag.Set {
	s := &envflag.Set{}
	c.Common.bind(s)
	c.WorkerSettings.bind(s)
	s.String(&c.HTTPAddr, "HTTP_ADDR", ":8081", "address of the health and metrics server")
	s.String(&c.Tracing.ServiceName, "OTEL_SERVICE_NAME", "puzzleq-worker", "service name of the worker's traces")
	s.Duration(&c.ShutdownTimeout, "SHUTDOWN_TIMEOUT", "25s", "time running tasks get to finish on shutdown")
	return s
}

// WorkerEnv lists every environment variable the worker reads.
func WorkerEnv() []string { var c WorkerConfig; return c.set().EnvNames() }

// LoadWorkerConfig reads the worker's settings from getenv and args.
func LoadWorkerConfig(args []string, getenv func(string) string, usage io.Writer) (WorkerConfig, error) {
	var c WorkerConfig
	if err := c.set().Load("worker", args, getenv, usage); err != nil {
		return c, err
	}
	return c, c.validate()
}

func (c *WorkerConfig) validate() error {
	if err := c.Common.validate(); err != nil {
		return err
	}
	if c.RedisURL == "" {
		return fmt.Errorf("REDIS_URL: required for the worker (or REDIS_SENTINELS)")
	}
	if err := c.WorkerSettings.validate(); err != nil {
		return err
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("SHUTDOWN_TIMEOUT: must be positive, got %s", c.ShutdownTimeout)
	}
	return nil
}

// APIConfig configures cmd/api.
type APIConfig struct {
	Common
	// WorkerSettings apply to the embedded worker only (no REDIS_URL).
	WorkerSettings
	// HTTPAddr is the API's listen address. Default ":8080".
	HTTPAddr string
	// MetricsAddr, when set, serves /metrics on its own listener instead
	// of HTTPAddr, so it need not be public. Default "".
	MetricsAddr string
	// MaxBodyBytes bounds a single-task body. Default 1Mi.
	MaxBodyBytes int64
	// MaxBatchBodyBytes bounds a batch body. It is read as a stream, so
	// the bound is on the upload, not on the API's memory. Default 256Mi.
	MaxBatchBodyBytes int64
	// MaxBatchItems bounds the items of one batch. Default 1000000.
	MaxBatchItems int
	// MaxWait bounds ?wait= of long polls. Default 60s.
	MaxWait time.Duration
	// ChunkSize is how many cheap batch items share one queued task (and
	// one chunk of a batch's storage). Larger chunks cost Redis and the
	// worker less per item: 100,000 8-puzzles took 2.65 s at 64 and
	// 1.5 s at 512 (docs/performance.md); a cheap item over 4 MiB / ChunkSize
	// runs alone, so a unit's requests stay within 4 MiB. At most 2048.
	// Default 512.
	ChunkSize int
	// RequestTimeout bounds a request, not counting a long poll's wait.
	// Default 10s.
	RequestTimeout time.Duration
	// DrainTime is how long after SIGTERM the API keeps its open
	// connections, answering each request on them with Connection: close
	// so that the client's next request goes to another replica, before
	// it closes the ones still idle. It ends early once every connection
	// has closed. Default 2s.
	DrainTime time.Duration
	// ShutdownTimeout is how long in-flight requests get to finish after
	// DrainTime. Default 15s.
	ShutdownTimeout time.Duration
	// BodyReadTimeout is the time a request body may take to arrive
	// beyond what BodyMinRate allows for its bytes; a slower upload is
	// answered 408. Long polls have no body and are not cut by it.
	// Default 30s.
	BodyReadTimeout time.Duration
	// BodyMinRate is the slowest average rate, in bytes a second, at
	// which a body may keep arriving: a body of n bytes may take
	// BODY_READ_TIMEOUT + n/BODY_MIN_RATE, and at most 12 minutes (its
	// staged items live 15). So a steady upload of the largest batch is
	// never cut for its size, while a trickle of a byte every few
	// seconds is cut after BODY_READ_TIMEOUT. 64Ki is a 0.5 Mbit/s link;
	// the 12-minute bound asks 120 KB/s of a 1,000,000-item batch
	// (about 83 MiB). Default 64Ki.
	BodyMinRate int64
	// MaxBytesInFlight bounds the request bodies and streamed results the
	// API holds in memory at once, counted as the bytes arrive; a request
	// waits (reading nothing more) while it is full. Measured, 32Mi keeps
	// the API under 256 MiB with eight 12 MB fill batches uploaded at once
	// (docs/guarantees.md). Default 32Mi.
	MaxBytesInFlight int64
	// MaxKeyBytesInFlight is the most of MAX_BYTES_IN_FLIGHT that one API
	// key's requests may hold at once, so that one tenant's uploads and
	// downloads, however many, leave the rest to the others; a key's
	// request that finds its share full waits, and a body still waiting
	// at its deadline is answered 429. The key's oldest request may go
	// past it, so a key's requests never wait only on each other. Without
	// API keys it does not apply. At most MAX_BYTES_IN_FLIGHT. Default
	// 16Mi: one 12 MB fill upload at a time per key, beside the other
	// tenants' half.
	MaxKeyBytesInFlight int64
	// APIKeys is "name:key,name:key", the tenants' keys, each at least
	// 16 bytes. With any configured every /v1 route needs
	// "Authorization: Bearer <key>". Default "": auth off.
	APIKeys string
	// APIKeysFile is a JSON file of keys with optional per-key limits and
	// role: [{"name","key","rate_per_second","burst","max_pending","role"}],
	// role "tenant" (the default) or "operator". Default "".
	APIKeysFile string
	// OperatorKeys is "name:key,name:key", the keys of the operator
	// routes: the /monitoring/ dashboard and /metrics on HTTP_ADDR. With
	// any key configured those routes need one of these, and refuse
	// tenant keys; operator keys in turn are refused on /v1. Default "":
	// with API_KEYS set, the operator routes are closed to everyone.
	OperatorKeys string
	// Monitoring serves the asynqmon dashboard at /monitoring/. Default
	// true.
	Monitoring bool
	// OperatorRatePerSecond is each operator's request rate on the
	// operator routes (per client address when auth is off); the
	// dashboard polls a few requests every 8 s. Default 10.
	OperatorRatePerSecond int
	// OperatorBurst is each operator's burst there; a dashboard page
	// load makes about ten requests. Default 30.
	OperatorBurst int
	// AuthFailuresPerMinute is how many failed authentications (no key,
	// or an unknown one) one client address may make a minute, as a
	// burst and refilling over the minute; past it the address is
	// answered 429 for everything, a valid key too, until it refills.
	// Default 30.
	AuthFailuresPerMinute int
	// MaxStreamsPerKey is how many event streams (GET
	// /v1/batches/{id}/events) one key may hold open on one API replica
	// at once; one more is answered 429. Each open stream re-reads its
	// batch from Redis about twice a second until it ends (at most
	// MAX_WAIT), so without a bound one key could open thousands within
	// its request rate. Default 16.
	MaxStreamsPerKey int
	// HistoryReadMinutes is how many minutes of history (GET
	// /v1/history, and the operators' GET /history together) one key may
	// read from one API replica per 10 s; past it a read is answered 429.
	// A day's read costs Redis milliseconds of CPU (BenchmarkHistoryRead), so
	// without a bound one key could take most of Redis within its request
	// rate. The dashboard reads an hour every 5 s. Default 2880: two
	// days' reads per 10 s.
	HistoryReadMinutes int
	// RatePerSecond is each key's default request rate. Default 20.
	RatePerSecond int
	// RateBurst is each key's default burst. Default 40.
	RateBurst int
	// MaxPendingPerKey caps a key's unfinished tasks. Default 100000.
	MaxPendingPerKey int
	// MaxConcurrentDecodes bounds the batch bodies decoded at once. A
	// decode holds about 4× its body for its duration (docs/capacity.md),
	// so this bounds the memory decoding takes beyond the bodies
	// themselves; a slot is taken once the body has arrived, so slow
	// uploads hold none. Decoding is CPU work, so more slots than cores
	// buy nothing. Default 0: GOMAXPROCS.
	MaxConcurrentDecodes int
	// OutboxInterval is how often each API replica looks for batches whose
	// enqueue a crash interrupted (one replica at a time, under a Redis
	// lease, finishes them). An interrupted batch is fully queued within
	// about 1s + this interval of its API dying, while any replica runs;
	// each look costs a few Redis commands. Default 1s.
	OutboxInterval time.Duration
	// WorkerDeadAfter is how long a worker's heartbeat must stay
	// unchanged before the API's watchdog takes the worker for dead and
	// re-drives its tasks elsewhere (asynq alone would take 60-130 s).
	// Keep it at 3 HEARTBEAT_INTERVALs or more: a worker only slow to
	// beat gets its tasks run twice (harmless to results and counts, but
	// wasted work). With the defaults, a killed worker's tasks are queued
	// again 2-3 s after it died. Default 2s.
	WorkerDeadAfter time.Duration
	// UISessionTTL is how long a dashboard sign-in lasts: the session
	// cookie's Max-Age and its record's TTL in Redis. A working day, so a
	// user signs in once a day and a forgotten browser is not signed in
	// for long. Default 12h.
	UISessionTTL time.Duration
	// SessionsPerKey caps one key's live dashboard sessions; a sign-in
	// past it ends the key's oldest. A person signs in from a few
	// browsers; a script signing in in a loop holds this many sessions
	// (about 300 B of Redis each) and no more. Default 10.
	SessionsPerKey int
	// SignInsPerKeyPerMinute and SignInsPerAddrPerMinute bound dashboard
	// sign-ins per key and per client address, as a burst refilling over
	// the minute, counted in Redis across replicas; past either the
	// sign-in is answered 429. An address's budget is larger, since an
	// office behind one NAT shares it. Defaults 10 and 30.
	SignInsPerKeyPerMinute  int
	SignInsPerAddrPerMinute int
	// AccessLogEvery samples the API's access log (one line per request:
	// route, method, status, bytes, duration_ms, key_id, request_id,
	// never a credential): one request in AccessLogEvery is logged at
	// info, and every 5xx at warn whatever it is. 1 logs every request;
	// 0 logs only the 5xx. Default 1.
	AccessLogEvery int

	keys []api.APIKey
}

func (c *APIConfig) set() *envflag.Set {
	s := &envflag.Set{}
	c.Common.bind(s)
	c.WorkerSettings.bind(s)
	s.String(&c.HTTPAddr, "HTTP_ADDR", ":8080", "listen address of the API")
	s.String(&c.Tracing.ServiceName, "OTEL_SERVICE_NAME", "puzzleq-api", "service name of the API's traces")
	s.String(&c.MetricsAddr, "METRICS_ADDR", "", "separate listen address for /metrics (default: on HTTP_ADDR)")
	s.Int64(&c.MaxBodyBytes, "MAX_BODY_BYTES", "1Mi", "largest single-task request body")
	s.Int64(&c.MaxBatchBodyBytes, "MAX_BATCH_BODY_BYTES", "256Mi", "largest batch request body")
	s.Int(&c.MaxBatchItems, "MAX_BATCH_ITEMS", "1000000", "most items in one batch")
	s.Duration(&c.MaxWait, "MAX_WAIT", "60s", "longest ?wait= of a long poll")
	s.Int(&c.ChunkSize, "CHUNK_SIZE", "512", "cheap batch items per queued task")
	s.Duration(&c.RequestTimeout, "REQUEST_TIMEOUT", "10s", "deadline of a request, not counting a long poll's wait")
	s.Duration(&c.DrainTime, "DRAIN_TIME", "2s", "time after SIGTERM open connections get, each answer closing its connection, before idle ones are closed")
	s.Duration(&c.ShutdownTimeout, "SHUTDOWN_TIMEOUT", "15s", "time in-flight requests get on shutdown, after DRAIN_TIME")
	s.Duration(&c.BodyReadTimeout, "BODY_READ_TIMEOUT", "30s", "time a request body may take to arrive beyond its bytes at BODY_MIN_RATE (slower: 408)")
	s.Int64(&c.BodyMinRate, "BODY_MIN_RATE", "64Ki", "slowest rate in bytes/s at which a body may keep arriving (at most 12m in all)")
	s.Int64(&c.MaxBytesInFlight, "MAX_BYTES_IN_FLIGHT", "32Mi", "request bodies and streamed results held in memory at once")
	s.Int64(&c.MaxKeyBytesInFlight, "MAX_KEY_BYTES_IN_FLIGHT", "16Mi", "most of MAX_BYTES_IN_FLIGHT one API key's requests may hold at once")
	s.String(&c.APIKeys, "API_KEYS", "", "API keys as name:key,name:key (empty: auth off)")
	s.String(&c.APIKeysFile, "API_KEYS_FILE", "", "JSON file of API keys with per-key limits and roles")
	s.String(&c.OperatorKeys, "OPERATOR_KEYS", "", "operator keys for /monitoring/ and /metrics, name:key,name:key")
	s.Bool(&c.Monitoring, "MONITORING", "true", "serve the asynqmon dashboard at /monitoring/")
	s.Int(&c.OperatorRatePerSecond, "OPERATOR_RATE_LIMIT_PER_SECOND", "10", "requests per second per operator on /monitoring/ and /metrics")
	s.Int(&c.OperatorBurst, "OPERATOR_RATE_LIMIT_BURST", "30", "burst of requests per operator on /monitoring/ and /metrics")
	s.Int(&c.AuthFailuresPerMinute, "AUTH_FAILURES_PER_MINUTE", "30", "failed authentications allowed per client address a minute")
	s.Int(&c.MaxStreamsPerKey, "MAX_STREAMS_PER_KEY", "16", "event streams one key may hold open at once on a replica")
	s.Int(&c.HistoryReadMinutes, "HISTORY_READ_MINUTES", "2880", "minutes of history one key may read from a replica per 10 s")
	s.Int(&c.RatePerSecond, "RATE_LIMIT_PER_SECOND", "20", "requests per second per key")
	s.Int(&c.RateBurst, "RATE_LIMIT_BURST", "40", "burst of requests per key")
	s.Int(&c.MaxPendingPerKey, "MAX_PENDING_PER_KEY", "100000", "unfinished tasks allowed per key")
	s.Int(&c.MaxConcurrentDecodes, "MAX_CONCURRENT_DECODES", "0", "batch bodies decoded at once (0: GOMAXPROCS)")
	s.Duration(&c.OutboxInterval, "OUTBOX_INTERVAL", "1s", "how often interrupted batch enqueues are looked for")
	s.Duration(&c.WorkerDeadAfter, "WORKER_DEAD_AFTER", "2s", "how long a worker's heartbeat may stay unchanged before its tasks are re-driven")
	s.Duration(&c.UISessionTTL, "UI_SESSION_TTL", "12h", "how long a dashboard sign-in lasts")
	s.Int(&c.AccessLogEvery, "ACCESS_LOG_EVERY", "1", "log one request in N (1: every one; 0: only server errors)")
	s.Int(&c.SessionsPerKey, "SESSIONS_PER_KEY", "10", "live dashboard sessions per key; past it the oldest ends")
	s.Int(&c.SignInsPerKeyPerMinute, "SIGN_INS_PER_KEY_PER_MINUTE", "10", "dashboard sign-ins per key a minute")
	s.Int(&c.SignInsPerAddrPerMinute, "SIGN_INS_PER_ADDR_PER_MINUTE", "30", "dashboard sign-ins per client address a minute")
	return s
}

// APIEnv lists every environment variable the API reads.
func APIEnv() []string { var c APIConfig; return c.set().EnvNames() }

// LoadAPIConfig reads the API's settings from getenv and args.
func LoadAPIConfig(args []string, getenv func(string) string, usage io.Writer) (APIConfig, error) {
	var c APIConfig
	if err := c.set().Load("api", args, getenv, usage); err != nil {
		return c, err
	}
	return c, c.validate()
}

// decodes is the number of batch decode slots: MAX_CONCURRENT_DECODES, or
// GOMAXPROCS when it is 0.
func (c *APIConfig) decodes() int {
	if c.MaxConcurrentDecodes > 0 {
		return c.MaxConcurrentDecodes
	}
	return runtime.GOMAXPROCS(0)
}

func (c *APIConfig) validate() error {
	if err := c.Common.validate(); err != nil {
		return err
	}
	if err := c.WorkerSettings.validate(); err != nil {
		return err
	}
	for _, v := range []struct {
		name string
		n    int64
	}{{"MAX_BODY_BYTES", c.MaxBodyBytes}, {"MAX_BATCH_BODY_BYTES", c.MaxBatchBodyBytes},
		{"MAX_BATCH_ITEMS", int64(c.MaxBatchItems)}, {"CHUNK_SIZE", int64(c.ChunkSize)}} {
		if v.n <= 0 {
			return fmt.Errorf("%s: must be positive, got %d", v.name, v.n)
		}
	}
	if c.ChunkSize > 2048 {
		// The store's scripts pass a chunk's fields to Lua's unpack.
		return fmt.Errorf("CHUNK_SIZE: must be at most 2048, got %d", c.ChunkSize)
	}
	if c.MaxWait <= 0 || c.MaxWait > 10*time.Minute {
		return fmt.Errorf("MAX_WAIT: must be between 1ns and 10m, got %s", c.MaxWait)
	}
	if c.RequestTimeout <= 0 || c.ShutdownTimeout <= 0 {
		return fmt.Errorf("REQUEST_TIMEOUT and SHUTDOWN_TIMEOUT: must be positive")
	}
	if c.DrainTime < 0 || c.DrainTime > time.Minute {
		return fmt.Errorf("DRAIN_TIME: must be between 0 and 1m, got %s", c.DrainTime)
	}
	if c.OutboxInterval < 10*time.Millisecond || c.OutboxInterval > time.Minute {
		return fmt.Errorf("OUTBOX_INTERVAL: must be between 10ms and 1m, got %s", c.OutboxInterval)
	}
	if c.WorkerDeadAfter < time.Second || c.WorkerDeadAfter > 10*time.Minute {
		return fmt.Errorf("WORKER_DEAD_AFTER: must be between 1s and 10m, got %s", c.WorkerDeadAfter)
	}
	if c.MaxConcurrentDecodes < 0 {
		return fmt.Errorf("MAX_CONCURRENT_DECODES: must not be negative, got %d", c.MaxConcurrentDecodes)
	}
	if c.UISessionTTL < time.Minute || c.UISessionTTL > 30*24*time.Hour {
		return fmt.Errorf("UI_SESSION_TTL: must be between 1m and 720h, got %s", c.UISessionTTL)
	}
	if c.BodyReadTimeout <= 0 {
		return fmt.Errorf("BODY_READ_TIMEOUT: must be positive, got %s", c.BodyReadTimeout)
	}
	if c.BodyMinRate < 1 {
		return fmt.Errorf("BODY_MIN_RATE: must be positive, got %d", c.BodyMinRate)
	}
	if c.MaxBytesInFlight < 1<<20 {
		return fmt.Errorf("MAX_BYTES_IN_FLIGHT: must be at least 1Mi, got %d", c.MaxBytesInFlight)
	}
	if c.MaxKeyBytesInFlight < 1<<20 || c.MaxKeyBytesInFlight > c.MaxBytesInFlight {
		return fmt.Errorf("MAX_KEY_BYTES_IN_FLIGHT: must be at least 1Mi and at most MAX_BYTES_IN_FLIGHT (%d), got %d", c.MaxBytesInFlight, c.MaxKeyBytesInFlight)
	}
	if c.HTTPAddr == "" {
		return fmt.Errorf("HTTP_ADDR: required")
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"RATE_LIMIT_PER_SECOND", c.RatePerSecond}, {"RATE_LIMIT_BURST", c.RateBurst}, {"MAX_PENDING_PER_KEY", c.MaxPendingPerKey},
		{"OPERATOR_RATE_LIMIT_PER_SECOND", c.OperatorRatePerSecond}, {"OPERATOR_RATE_LIMIT_BURST", c.OperatorBurst},
		{"AUTH_FAILURES_PER_MINUTE", c.AuthFailuresPerMinute}, {"MAX_STREAMS_PER_KEY", c.MaxStreamsPerKey},
		{"HISTORY_READ_MINUTES", c.HistoryReadMinutes},
		{"SESSIONS_PER_KEY", c.SessionsPerKey}, {"SIGN_INS_PER_KEY_PER_MINUTE", c.SignInsPerKeyPerMinute},
		{"SIGN_INS_PER_ADDR_PER_MINUTE", c.SignInsPerAddrPerMinute}} {
		if v.n <= 0 {
			return fmt.Errorf("%s: must be positive, got %d", v.name, v.n)
		}
	}
	if c.AccessLogEvery < 0 {
		return fmt.Errorf("ACCESS_LOG_EVERY: must not be negative, got %d", c.AccessLogEvery)
	}
	keys, err := c.loadKeys()
	if err != nil {
		return err
	}
	c.keys = keys
	return nil
}
