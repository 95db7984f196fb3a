package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/hibiken/asynq/x/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/tracing"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/tasks"
)

// Worker is a running cmd/worker: an asynq server with puzzleq's handler
// on the solver slots, another with the same handler on the cheap lane's
// slots, another that delivers webhooks on slots of their own, a listener for
// cancellations, and a health and metrics server.
type Worker struct {
	cfg   WorkerConfig
	log   *slog.Logger
	rdb   redis.UniversalClient
	store *store.Store
	srv   *asynq.Server
	mux   *asynq.ServeMux
	// whSrv and whMux deliver webhooks on slots of their own
	// (WEBHOOK_CONCURRENCY), so deliveries that wait on slow receivers
	// never hold a solver's slot.
	whSrv *asynq.Server
	whMux *asynq.ServeMux
	// cheapSrv runs the cheap lane (tasks.CheapQueues) on slots of its
	// own (CHEAP_CONCURRENCY) with the solvers' handler, so cheap work
	// never waits behind searches that hold every solver slot.
	cheapSrv *asynq.Server
	cancels  *worker.Cancels
	beat     *worker.Heartbeat
	history  *worker.History
	reg      *prometheus.Registry
	ln       net.Listener // nil when embedded in the API
	httpSrv  *http.Server
	ready    atomic.Bool

	// shutdownOnce starts the asynq servers' shutdown once; serversDown
	// closes when they have stopped, and shutdownBy is when the worker
	// stops waiting for them (shutdownServers).
	shutdownOnce sync.Once
	serversDown  chan struct{}
	shutdownBy   time.Time
	pdbReady     atomic.Bool
	// pdbNote says which 4x4 tables are in use and, after a fallback to
	// 6-6-3, why; /readyz shows it.
	pdbNote  atomic.Pointer[string]
	ownsConn bool
	// expCap is the hard ceiling of one key's expensive runs
	// (WorkerSettings.MaxExpensivePerKey, 0: none).
	expCap atomic.Int64
	// solverSlots is the cluster's solver slots as the last heartbeat
	// found them (Store.RegisterSlots), for the metric and as the
	// sharing's S while Redis has no worker's entry: the scripts that
	// decide read S from Redis itself.
	solverSlots atomic.Int64
	// tracing is the worker's tracing (the API's when embedded).
	tracing *tracing.Provider
}

// NewWorker connects to Redis and binds the health listener. Run starts
// processing.
func NewWorker(cfg WorkerConfig, log *slog.Logger) (*Worker, error) {
	routeRedisLogs(log)
	// The solver slots are fixed first (by default GOMAXPROCS), then the
	// process gets one P more than them (procsFor).
	cfg.Concurrency = cfg.concurrency()
	if n := procsFor(cfg.Concurrency, runtime.GOMAXPROCS(0)); n != runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(n)
		log.Info("GOMAXPROCS raised above the solver slots, so that searches leave a P for the cheap lane", "gomaxprocs", n, "solver_slots", cfg.Concurrency)
	}
	watch := &masterWatch{}
	opt, rdb, err := redisConn(cfg.RedisURL, watch.onConnect)
	if err != nil {
		return nil, err
	}
	rdb.AddHook(pauseOnRefusal(refusalPause))
	tp, err := tracing.New(context.Background(), cfg.Tracing)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	if tp.On() {
		rdb.AddHook(tracing.RedisHook(tp.Tracer, redisAddr(rdb)))
		log.Info("tracing: exporting over OTLP", "service", cfg.Tracing.ServiceName)
	}
	w, err := newWorker(cfg, log, opt, rdb, watch, prometheus.NewRegistry(), tp)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	w.ownsConn = true
	if cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("HTTP_ADDR: listen on %s: %w", cfg.HTTPAddr, err)
		}
		w.ln = ln
		w.httpSrv = &http.Server{Handler: w.opsHandler(), ReadHeaderTimeout: 5 * time.Second}
	}
	return w, nil
}

// procsFor is the GOMAXPROCS a worker of slots solver slots runs with,
// given procs: at least one more than the slots. A search holds its P for
// as long as it runs (Go preempts it every 10 ms), so with no more Ps
// than slots a full set of searches leaves none for the cheap lane,
// asynq's fetching and the Redis replies, which then wait for a P 10 ms
// at a time; with one more, the OS shares the cores between the threads
// at its own finer grain.
func procsFor(slots, procs int) int {
	if procs <= slots {
		return slots + 1
	}
	return procs
}

// newWorker builds a worker on rdb; tp is its tracing, the API's when
// the worker is embedded in it (the API then exports and shuts it down).
// watch, when not nil, is rdb's connection hook's masterWatch: the
// worker then runs again what a change of Redis master may have taken
// back (worker.Rerun). An embedded worker has none: its Redis is in its
// own process and never changes.
func newWorker(cfg WorkerConfig, log *slog.Logger, opt asynq.RedisConnOpt, rdb redis.UniversalClient, watch *masterWatch, reg *prometheus.Registry, tp *tracing.Provider) (*Worker, error) {
	// The worker's one name: every line it logs carries it, and so do
	// the store and GET /v1/status (worker.NewWorkerID). The heartbeat
	// adds it to its own lines.
	id := worker.NewWorkerID()
	beatLog := log
	log = log.With("worker_id", id)
	w := &Worker{cfg: cfg, log: log, rdb: rdb, reg: reg, cancels: worker.NewCancels(), tracing: tp}
	w.store = store.New(rdb, cfg.storeOptions())
	loadScripts(w.store, log)
	m := worker.NewMetrics(reg)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "puzzleq_expensive_cap", Help: "Hard ceiling of the expensive tasks one API key may run at once, cluster-wide, as this worker enforces it (MAX_EXPENSIVE_PER_KEY; 0: none).",
	}, func() float64 { return float64(w.expCap.Load()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "puzzleq_solver_slots", Help: "Solver slots of the cluster as this worker's last heartbeat found them recorded in Redis, which the API keys with expensive work share by weight.",
	}, func() float64 { return float64(w.solverSlots.Load()) }))
	h := worker.NewHandler(w.store, w.cancels, cfg.Limits(), m, log)
	// A worker that finishes a unit refills the bulk queue from the feed,
	// so it never runs dry while a batch waits.
	h.SetFeed(w.store, cfg.FeedDepth)
	h.SetWriteInterval(cfg.WriteInterval)
	h.SetTracer(tp.Tracer)
	w.expCap.Store(int64(cfg.MaxExpensivePerKey))
	w.solverSlots.Store(int64(cfg.concurrency()))
	h.SetGate(w.store, func() int { return int(w.expCap.Load()) })
	h.SetSlots(func() int { return int(w.solverSlots.Load()) })
	w.mux = asynq.NewServeMux()
	// The heartbeat records every task that runs for more than a few
	// milliseconds, written behind it, so the API's watchdog can re-drive
	// them if this process dies (worker.Heartbeat).
	w.beat = worker.NewHeartbeat(w.store, id, cfg.HeartbeatInterval, beatLog)
	w.history = worker.NewHistory(w.store, cfg.HistoryInterval, id, log)
	h.SetHistory(w.history)
	w.beat.StopAfter(cfg.CutOffAfter)
	// Each beat, the first before any task is fetched, records this
	// worker's solver slots, so the keys share the cluster's slots from
	// the moment a worker starts; the webhook and cheap lanes' slots are
	// not among them.
	w.beat.SetSlots(w.store, cfg.concurrency(), func(total int) {
		if c := int64(total); c != w.solverSlots.Swap(c) {
			log.Info("solver slots shared by the keys with expensive work", "solver_slots", c)
		}
	})
	w.mux.Use(w.beat.Middleware())
	if watch != nil {
		// A solve that ran as the Redis master changed runs again, and so
		// do those finished just before.
		rerun := worker.NewRerun(asynq.NewClientFromRedisClient(rdb), log.With("component", "rerun"), worker.RerunOptions{})
		w.mux.Use(rerun.Middleware())
		watch.notify(rerun.Changed)
	}
	if cfg.RedisAckReplicas > 0 {
		w.mux.Use(confirmMiddleware(w.store))
	}
	h.Register(w.mux)
	healthCheck := func(err error) {
		if err != nil {
			log.Warn("redis health check failed", "err", err)
		}
	}
	solverConfig := func(concurrency int, queues map[string]int, log *slog.Logger) asynq.Config {
		return asynq.Config{
			Concurrency:       concurrency,
			Queues:            queues,
			TaskCheckInterval: cfg.TaskCheckInterval,
			// Move retried tasks back to pending every second, not every
			// 5 s: crash and outage recovery goes through the retry set.
			DelayedTaskCheckInterval: time.Second,
			ShutdownTimeout:          cfg.ShutdownTimeout,
			ErrorHandler:             h.ErrorHandler(),
			// An expensive task over its key's cap waits: asynq runs it
			// again after the wait, and it counts as neither a retry nor a
			// failure. So does a task whose writes the replicas did not
			// confirm: it is done, and runs again only to confirm it; and
			// one that ran as the Redis master changed (worker.Rerun).
			IsFailure: func(err error) bool {
				_, wait := worker.IsWait(err)
				return !wait && !errors.Is(err, worker.ErrNotReplicated) && !errors.Is(err, worker.ErrRedisChanged)
			},
			RetryDelayFunc:  retryDelay,
			Logger:          asynqLogger{log},
			HealthCheckFunc: healthCheck,
		}
	}
	w.srv = asynq.NewServerFromRedisClient(rdb, solverConfig(cfg.concurrency(), cfg.weights(), log.With(libraryKey, "asynq")))
	// The cheap lane's server runs the same handler on the cheap queues:
	// its tasks never take a solver's slot, nor wait for one.
	w.cheapSrv = asynq.NewServerFromRedisClient(rdb, solverConfig(cfg.CheapConcurrency, cfg.cheapWeights(),
		log.With(libraryKey, "asynq", "component", "cheap")))
	// The deliveries' own server. The heartbeat records them too, so a
	// worker that dies mid-delivery has it re-driven as soon as a task.
	w.whMux = asynq.NewServeMux()
	w.whMux.Use(w.beat.Middleware())
	// The slots are shared between keys by a pool (worker.DeliveryPool);
	// asynq runs one goroutine more than there are slots, so another
	// key's delivery is taken off the queue while every slot waits on a
	// receiver.
	wh := worker.NewWebhookHandler(w.store, cfg.webhookPolicy(), cfg.webhookSigner(),
		cfg.WebhookOptions(), m, log.With("component", "webhooks"))
	wh.SetPool(worker.NewDeliveryPool(cfg.WebhookConcurrency))
	w.whMux.Handle(tasks.TypeWebhook, wh)
	w.whSrv = asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              worker.WebhookServerConcurrency(cfg.WebhookConcurrency),
		Queues:                   map[string]int{tasks.QueueWebhooks: 1},
		TaskCheckInterval:        cfg.TaskCheckInterval,
		DelayedTaskCheckInterval: time.Second,
		ShutdownTimeout:          cfg.ShutdownTimeout,
		// A delivery that waited for a slot, or whose slot another key's
		// took, is neither a retry nor a failure.
		IsFailure: func(err error) bool {
			_, wait := worker.IsWait(err)
			return !wait
		},
		RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration {
			if _, wait := worker.IsWait(err); wait || errors.Is(err, asynq.ErrLeaseExpired) {
				return retryDelay(n, err, t)
			}
			return tasks.WebhookRetryDelay(n, cfg.WebhookRetryBase, cfg.WebhookRetryMax, rand.N[time.Duration])
		},
		Logger:          asynqLogger{log.With(libraryKey, "asynq", "component", "webhooks")},
		HealthCheckFunc: healthCheck,
	})
	return w, nil
}

// confirmMiddleware holds a delivery's ack until REDIS_ACK_REPLICAS
// replicas hold every write it made: store.Confirm, one round trip after
// the handler's last write, unless that write was a Finish, which
// carries the confirmation in its own round trip (a single task's
// delivery). A delivery they do not confirm in time
// returns worker.ErrNotReplicated instead of nil: asynq runs the task
// again, its items are found ended, and that delivery confirms them. The
// confirmation runs on a context of its own, so that a shutdown that
// ended the delivery's does not skip it.
func confirmMiddleware(st *store.Store) asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			ctx, confirmedByFinish := worker.TrackFinalWrite(ctx)
			if err := next.ProcessTask(ctx, t); err != nil {
				return err
			}
			if confirmedByFinish() {
				return nil // a single task's Finish confirmed in its own round trip
			}
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisCallTimeout+st.AckTimeout())
			defer cancel()
			if err := st.Confirm(cctx); err != nil {
				if !errors.Is(err, store.ErrNotReplicated) {
					err = fmt.Errorf("%w: %w", worker.ErrNotReplicated, err)
				}
				return err
			}
			return nil
		})
	}
}

// leaseRecoveryDelay is how long a task whose worker died (its lease
// expired) waits in the retry set before it runs again. Nothing was wrong
// with the task, so the wait is short; but not zero, because every worker
// runs asynq's recoverer, all of them about once a minute, and a
// recoverer that listed the task as lease-expired before another one
// retried it still retries it afterwards: asynq's retry script only
// checks that the task is in the active list, not that its lease is still
// expired (hibiken/asynq#717, open in v0.26). With no delay the task can
// be fetched again (forwarder every second, idle workers every 20 ms)
// before that late retry, which then takes it out of the active list
// while it runs and queues it once more: a third run of a task whose
// worker died once, seen in the worker-crash fault test as 3 attempts.
// The wait keeps the task out of the active list for at least this long
// less a second (asynq scores the retry set in whole seconds), so a late
// retry finds it gone and does nothing, unless that recoverer stalled
// for over 4 s between its list and its retry. Crash recovery takes
// 60-125 s anyway; this adds 5 s.
const leaseRecoveryDelay = 5 * time.Second

// retryDelay retries a task whose worker died (lease expired) after
// leaseRecoveryDelay. A Redis connection error (an outage or a failover)
// or a Redis that refuses writes (at maxmemory, a read-only replica)
// retries after about a second, since Redis is usually back by then, and
// a batch is then done seconds after it is; asynq's default backoff
// would wait 15-45 s, more on later attempts. Other errors back off as
// asynq does.
func retryDelay(n int, err error, t *asynq.Task) time.Duration {
	var netErr net.Error
	if d, ok := worker.IsWait(err); ok {
		return d
	}
	switch {
	case errors.Is(err, asynq.ErrLeaseExpired):
		return leaseRecoveryDelay
	case errors.Is(err, worker.ErrDeadlineOverrun), errors.Is(err, worker.ErrCutOff), errors.Is(err, worker.ErrNotReplicated),
		errors.Is(err, worker.ErrRedisChanged):
		// ErrCutOff: the worker stopped the task while cut off from
		// Redis, and returns it once Redis is back; its copy has run
		// elsewhere meanwhile, so this run finds its items ended.
		// Overrun: the machine was slow or frozen, not the task wrong:
		// try again soon, wherever a slot is free.
		return time.Second + rand.N(time.Second)
	case errors.As(err, &netErr), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, io.EOF), errors.Is(err, redis.ErrClosed), store.RefusesWrites(err):
		return time.Second + rand.N(time.Second)
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}

// Addr is the health server's address ("" when embedded).
func (w *Worker) Addr() string {
	if w.ln == nil {
		return ""
	}
	return w.ln.Addr().String()
}

// ID is the worker's name (worker.NewWorkerID): in its logs, in Redis
// and on GET /v1/status.
func (w *Worker) ID() string { return w.beat.ID() }

// Cancels returns the registry of running solves, for tests.
func (w *Worker) Cancels() *worker.Cancels { return w.cancels }

func (w *Worker) opsHandler() http.Handler {
	w.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), queueCollector(w.rdb),
		backlogCollector{w.store})
	mux := http.NewServeMux()
	// The probes answer in the API's wire forms.
	reply := func(rw http.ResponseWriter, status int, body any) {
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(status)
		json.NewEncoder(rw).Encode(body)
	}
	unavailable := func(rw http.ResponseWriter, msg string) {
		reply(rw, http.StatusServiceUnavailable, apitype.ErrorBody{Error: apitype.Error{Code: apitype.CodeUnavailable, Message: msg}})
	}
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		reply(rw, http.StatusOK, apitype.Status{Status: "ok"})
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if !w.ready.Load() {
			unavailable(rw, "not processing")
			return
		}
		if w.cfg.PDBPreload && !w.pdbReady.Load() {
			unavailable(rw, "loading the pattern databases")
			return
		}
		// A write, not a PING: a Redis at maxmemory answers PING and
		// refuses every task's result.
		if err := w.store.CheckWrites(ctx); err != nil {
			if errors.Is(err, store.ErrRefusesWrites) {
				unavailable(rw, "redis refuses writes (at maxmemory, read-only or failing to persist)")
				return
			}
			unavailable(rw, "redis is not answering")
			return
		}
		body := readyBody{Status: "ready", PDBSet: string(sliding.ActiveTables())}
		if n := w.pdbNote.Load(); n != nil {
			body.PDBNote = *n
		}
		reply(rw, http.StatusOK, body)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(w.reg, promhttp.HandlerOpts{}))
	return mux
}

// Run processes tasks until ctx ends or the health server fails, then
// stops fetching, lets running tasks finish within ShutdownTimeout (asynq
// requeues the rest) and returns the health server's error, if any.
func (w *Worker) Run(ctx context.Context) error {
	lctx, stopListen := context.WithCancel(context.WithoutCancel(ctx))
	defer stopListen()
	go w.store.ListenCancels(lctx, w.cancels.Cancel)

	w.useTables()
	if w.cfg.PDBPreload {
		// In the background: the other kinds are served meanwhile, and a
		// large sliding board that arrives first builds what it needs.
		go w.preload(lctx)
	}
	// The first beat goes out before any task is fetched; the beats
	// outlive asynq's shutdown, which may run tasks for ShutdownTimeout.
	bctx, stopBeat := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBeat()
	_ = w.beat.Beat(bctx)
	beatDone, historyDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(beatDone); w.beat.Run(bctx) }()
	// The history too outlives asynq's shutdown, so the tasks it ends
	// are counted.
	go func() { defer close(historyDone); w.history.Run(bctx) }()
	if err := w.srv.Start(w.mux); err != nil {
		return fmt.Errorf("worker: start asynq server: %w", err)
	}
	if err := w.whSrv.Start(w.whMux); err != nil {
		w.srv.Shutdown()
		return fmt.Errorf("worker: start the webhook server: %w", err)
	}
	if err := w.cheapSrv.Start(w.mux); err != nil {
		w.srv.Shutdown()
		w.whSrv.Shutdown()
		return fmt.Errorf("worker: start the cheap lane's server: %w", err)
	}
	w.ready.Store(true)
	httpErr := make(chan error, 1)
	if w.httpSrv != nil {
		go func() { httpErr <- w.httpSrv.Serve(w.ln) }()
	}
	// Host and pid are logged once, here, beside the worker's name: they
	// are how asynqmon (/monitoring/) lists its servers.
	host, _ := os.Hostname()
	w.log.Info("worker started", "host", host, "pid", os.Getpid(), "concurrency", w.cfg.concurrency(), "queues", w.cfg.weights(),
		"webhook_concurrency", w.cfg.WebhookConcurrency, "cheap_concurrency", w.cfg.CheapConcurrency, "task_check_interval", w.cfg.TaskCheckInterval.String(), "http_addr", w.Addr())

	// A health server that stops takes the worker down with an error, so
	// the process exits non-zero and is restarted: without it the kubelet
	// cannot probe the worker, and would kill it anyway.
	var runErr error
	select {
	case <-ctx.Done():
	case err := <-httpErr:
		runErr = fmt.Errorf("worker: health server: %w", err)
		w.log.Error("health server stopped", "err", err)
	}
	w.log.Info("worker shutting down", "shutdown_timeout", w.cfg.ShutdownTimeout.String())
	w.ready.Store(false)
	w.beat.Drain() // GET /v1/status shows it draining from a beat made now
	// Stop fetching, wait up to ShutdownTimeout, requeue the rest.
	stopped, deadline := w.shutdownServers()
	stopBeat()
	if !stopped || !waitUntil(beatDone, deadline) || !waitUntil(historyDone, deadline) {
		// Redis is frozen or cut off: asynq could not give back what
		// it ran, and the heartbeat cannot leave. The worker exits
		// anyway, before the pod's grace period ends, and its tasks come
		// back by their leases, as a killed worker's do.
		w.log.Error("shutdown: Redis did not answer in time; exiting with tasks left to their leases",
			"shutdown_timeout", w.cfg.ShutdownTimeout.String(), "grace", shutdownGrace.String())
		return errors.Join(runErr, errShutdownCut)
	}
	// asynq gave back what did not finish, so nothing is left to re-drive.
	leaveBy := time.Now().Add(2 * time.Second)
	if deadline.Before(leaveBy) {
		leaveBy = deadline
	}
	leaveCtx, cancelLeave := context.WithDeadline(context.Background(), leaveBy)
	if err := w.beat.Leave(leaveCtx); err != nil {
		w.log.Warn("heartbeat: leave", "err", err)
	}
	cancelLeave()
	if w.httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		w.httpSrv.Shutdown(sctx)
	}
	if w.ownsConn {
		// The spans of the last tasks are exported before the process
		// exits; an embedded worker's go with the API's.
		tctx, cancel := context.WithTimeout(context.Background(), tracing.ShutdownTimeout)
		defer cancel()
		if err := w.tracing.Shutdown(tctx); err != nil {
			w.log.Warn("tracing: the last spans were not exported", "err", err)
		}
	}
	w.log.Info("worker stopped")
	return runErr
}

// shutdownGrace is what a worker's shutdown may take past
// ShutdownTimeout: asynq's wind-down after its handlers (the requeue of
// what did not finish, the heartbeat's and syncer's last writes), the
// last beat's leave and the health server's close. The pod's grace
// period covers ShutdownTimeout and this (deploy/k8s/base/worker.yaml).
const shutdownGrace = 5 * time.Second

// errShutdownCut is Run's error when it stopped waiting on Redis: the
// process exits non-zero, since what it ran was not given back.
var errShutdownCut = errors.New("worker: shutdown cut short: Redis did not answer within SHUTDOWN_TIMEOUT and the grace after it")

// waitUntil waits for done until deadline, and says whether it came.
func waitUntil(done <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// readyBody is /readyz's answer when ready: apitype.Status plus the
// 4x4 table set in use, so that a fallback to 6-6-3 is visible.
type readyBody struct {
	Status  string `json:"status"`
	PDBSet  string `json:"pdb_set"`
	PDBNote string `json:"pdb_note,omitempty"`
}

// useTables maps the 7-8 tables from PDB_DIR when PDB_SET asks for them.
// Missing files are not fatal: 4x4 boards fall back to 6-6-3, which
// costs nodes, not answers, and the fallback is logged and shown by
// /readyz.
func (w *Worker) useTables() {
	set, _ := sliding.ParseTableSet(w.cfg.PDBSet) // validated
	if set == "" {
		set = sliding.Set663
	}
	err := sliding.UseTables(w.cfg.PDBDir, set)
	switch {
	case set == sliding.Set78 && w.cfg.PDBDir == "":
		note := "6-6-3: PDB_DIR is not set, so there are no 7-8 files to map"
		w.pdbNote.Store(&note)
		w.log.Warn("pattern databases: falling back to 6-6-3", "reason", note)
	case err != nil:
		note := "6-6-3: " + err.Error()
		w.pdbNote.Store(&note)
		w.log.Warn("pattern databases: falling back to 6-6-3", "pdb_dir", w.cfg.PDBDir, "err", err)
	default:
		w.log.Info("pattern databases: 4x4 table set", "pdb_set", string(sliding.ActiveTables()),
			"pdb_dir", w.cfg.PDBDir, "mapped_bytes", sliding.MappedBytes())
	}
}

// preload builds or loads the 15-puzzle's pattern databases; readiness
// waits for it, so a rolling deploy does not retire the old pods before
// the new ones can solve every board at full speed.
func (w *Worker) preload(ctx context.Context) {
	start := time.Now()
	dir := w.cfg.PDBDir
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			w.log.Warn("pattern databases: cannot create PDB_DIR, keeping them in memory only", "pdb_dir", dir, "err", err)
			dir = ""
		}
	}
	if err := sliding.Preload(ctx, dir); err != nil {
		// The databases are still usable in memory; only the file cache
		// failed (or ctx ended).
		w.log.Warn("pattern databases: preload incomplete", "pdb_dir", w.cfg.PDBDir, "err", err)
	}
	w.pdbReady.Store(true)
	w.log.Info("pattern databases ready", "pdb_dir", w.cfg.PDBDir,
		"duration_ms", time.Since(start).Milliseconds(), "memory_bytes", sliding.PDBMemory())
}

// shutdownServers shuts the asynq servers down at once, so that the
// worker's shutdown takes one ShutdownTimeout, which the pod's grace
// period is sized for, and waits for them until the first call's
// ShutdownTimeout and shutdownGrace have passed, the deadline it
// returns. It says whether they stopped: asynq's last writes wait on
// Redis for as long as Redis does not answer, and a worker left waiting
// on them would be killed mid-shutdown.
func (w *Worker) shutdownServers() (bool, time.Time) {
	w.shutdownOnce.Do(func() {
		w.shutdownBy = time.Now().Add(w.cfg.ShutdownTimeout + shutdownGrace)
		w.serversDown = make(chan struct{})
		go func() {
			defer close(w.serversDown)
			var wg sync.WaitGroup
			wg.Go(w.srv.Shutdown)
			wg.Go(w.whSrv.Shutdown)
			wg.Go(w.cheapSrv.Shutdown)
			wg.Wait()
		}()
	})
	return waitUntil(w.serversDown, w.shutdownBy), w.shutdownBy
}

// Close stops the asynq server if Run did not, then releases the Redis
// connection. The order matters: closing the client under a running asynq
// server closes its pub/sub channel, and asynq v0.26's subscriber then
// dereferences a nil message and panics.
func (w *Worker) Close() error {
	// At once when never started or already stopped; when Run gave up
	// on asynq, the connection stays open for it until the process ends.
	stopped, _ := w.shutdownServers()
	if w.ln != nil {
		w.ln.Close()
	}
	if !stopped {
		return errors.New("worker: asynq did not stop before the shutdown's deadline")
	}
	if w.ownsConn {
		ctx, cancel := context.WithTimeout(context.Background(), tracing.ShutdownTimeout)
		defer cancel()
		w.tracing.Shutdown(ctx)
		return w.rdb.Close()
	}
	return nil
}

// queueCollector reports asynq's queue sizes; both binaries expose it.
func queueCollector(rdb redis.UniversalClient) prometheus.Collector {
	return metrics.NewQueueMetricsCollector(asynq.NewInspectorFromRedisClient(rdb))
}

// backlogCollector reports each API key's webhook delivery backlog
// (store.WebhookBacklog) as puzzleq_webhook_backlog{key}, the key's name
// (never its secret); both binaries expose it, read from Redis at each
// scrape.
type backlogCollector struct{ st *store.Store }

var webhookBacklogDesc = prometheus.NewDesc("puzzleq_webhook_backlog",
	"Webhook deliveries of an API key enqueued and neither delivered nor given up (cluster-wide, from Redis).", []string{"key"}, nil)

func (c backlogCollector) Describe(ch chan<- *prometheus.Desc) { ch <- webhookBacklogDesc }

func (c backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), redisIOTimeout)
	defer cancel()
	m, err := c.st.WebhookBacklog(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(webhookBacklogDesc, err)
		return
	}
	for k, n := range m {
		ch <- prometheus.MustNewConstMetric(webhookBacklogDesc, prometheus.GaugeValue, float64(n), k)
	}
}

// libraryKey names the third-party library a log line comes from. It is
// not "component", which names the part of puzzleq (the embedded worker):
// a library logging inside a component would otherwise repeat that key in
// one line, which JSON readers resolve differently (the first or the last
// wins).
const libraryKey = "library"

// asynqLogger routes asynq's logs through slog.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...)) }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...)) }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...)) }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...)) }
func (a asynqLogger) Fatal(args ...any) { a.l.Error(fmt.Sprint(args...)) }
