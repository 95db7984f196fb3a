package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/hibiken/asynqmon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/recovery"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/tracing"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// API is a running cmd/api. Without REDIS_URL it is the whole system in
// one process: an in-memory Redis and an embedded worker.
type API struct {
	cfg        APIConfig
	log        *slog.Logger
	rdb        redis.UniversalClient
	client     *asynq.Client
	store      *store.Store
	hub        *store.Hub
	server     *api.Server
	reconciler *recovery.Reconciler
	watchdog   *recovery.Watchdog
	history    *worker.History // the cache hits the API answers
	id         string          // names this replica: its history flushes and its hold on historySampleLease
	reg        *prometheus.Registry
	ln         net.Listener
	metricsLn  net.Listener
	httpSrv    *http.Server
	openConns  atomic.Int64 // httpSrv's connections not yet closed or hijacked
	metricSrv  *http.Server
	tracing    *tracing.Provider     // off (Tracer nil) without an OTLP endpoint
	redisOpt   asynq.RedisConnOpt    // the connection asynq uses, for the dashboard
	monitor    *asynqmon.HTTPHandler // the /monitoring/ dashboard; nil until mounted

	embedded *embedded // nil when REDIS_URL is set
}

type embedded struct {
	mr     *miniredis.Miniredis
	worker *Worker
	stop   chan struct{}
}

// NewAPI connects (or, embedded, starts) Redis, builds the routes and binds
// the listeners. Run serves.
func NewAPI(cfg APIConfig, log *slog.Logger) (_ *API, err error) {
	routeRedisLogs(log)
	a := &API{cfg: cfg, log: log, reg: prometheus.NewRegistry(), hub: store.NewHub()}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	var opt asynq.RedisConnOpt
	if cfg.RedisURL == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return nil, fmt.Errorf("start the embedded redis: %w", err)
		}
		a.embedded = &embedded{mr: mr, stop: make(chan struct{})}
		opt = asynq.RedisClientOpt{Addr: mr.Addr(), DialTimeout: redisDialTimeout,
			ReadTimeout: redisIOTimeout, WriteTimeout: redisIOTimeout}
		a.rdb = opt.MakeRedisClient().(redis.UniversalClient)
		log.Warn("REDIS_URL is not set: running embedded, with an in-memory Redis and an in-process worker. " +
			"Data lives only in this process's memory and is lost when it exits. Set REDIS_URL for production.")
	} else {
		if opt, a.rdb, err = redisConn(cfg.RedisURL); err != nil {
			return nil, err
		}
		// Every Redis call of a request fails fast on a hung Redis,
		// asynq's enqueues included: they go through this client.
		a.rdb.AddHook(callDeadline(cfg.callTimeout()))
	}
	if a.tracing, err = tracing.New(context.Background(), cfg.Tracing); err != nil {
		return nil, err
	}
	if a.tracing.On() {
		a.rdb.AddHook(tracing.RedisHook(a.tracing.Tracer, redisAddr(a.rdb)))
		log.Info("tracing: exporting over OTLP", "service", cfg.Tracing.ServiceName)
	}
	a.redisOpt = opt
	a.client = asynq.NewClientFromRedisClient(a.rdb)
	a.store = store.New(a.rdb, cfg.storeOptions())
	loadScripts(a.store, log)
	setWeights(a.store, cfg.keys, log)
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		queueCollector(a.rdb), backlogCollector{a.store}, slotsCollector{a.store})

	if a.embedded != nil {
		wcfg := WorkerConfig{Common: cfg.Common, WorkerSettings: cfg.WorkerSettings, ShutdownTimeout: cfg.ShutdownTimeout}
		// The embedded worker shares the API's registry so one /metrics
		// covers the whole process. Its attributes go in a group of their
		// own, so none can repeat a key the caller put on log.
		if a.embedded.worker, err = newWorker(wcfg, log.WithGroup("worker"), opt, a.rdb, nil, a.reg, a.tracing); err != nil {
			return nil, err
		}
	}

	a.id = worker.NewWorkerID()
	a.history = worker.NewHistory(a.store, cfg.HistoryInterval, a.id, log)
	a.server = api.New(a.store, a.hub, a.reg, log, api.Options{History: a.history,
		MaxBodyBytes: cfg.MaxBodyBytes, MaxBatchBodyBytes: cfg.MaxBatchBodyBytes, MaxBatchItems: cfg.MaxBatchItems,
		MaxWait: cfg.MaxWait, ChunkSize: cfg.ChunkSize, FeedDepth: cfg.FeedDepth, RequestTimeout: cfg.RequestTimeout, Limits: cfg.Limits(),
		Keys: cfg.keys, RatePerSecond: cfg.RatePerSecond, RateBurst: cfg.RateBurst, MaxPendingPerKey: cfg.MaxPendingPerKey,
		BodyReadTimeout: cfg.BodyReadTimeout, BodyMinRate: cfg.BodyMinRate, MaxBytesInFlight: cfg.MaxBytesInFlight,
		MaxKeyBytesInFlight:  cfg.MaxKeyBytesInFlight,
		MaxConcurrentDecodes: cfg.decodes(),
		WebhookPolicy:        cfg.webhookPolicy(), WebhooksEnabled: cfg.WebhookSecret != "",
		OperatorRatePerSecond: cfg.OperatorRatePerSecond, OperatorBurst: cfg.OperatorBurst, AuthFailuresPerMinute: cfg.AuthFailuresPerMinute,
		MaxStreamsPerKey: cfg.MaxStreamsPerKey, HistoryReadMinutes: cfg.HistoryReadMinutes,
		SessionTTL: cfg.UISessionTTL, SessionsPerKey: cfg.SessionsPerKey,
		AccessLogEvery: cfg.AccessLogEvery, SignInsPerKeyPerMinute: cfg.SignInsPerKeyPerMinute, SignInsPerAddrPerMinute: cfg.SignInsPerAddrPerMinute,
		Mount: a.mount, Presence: asynq.NewInspectorFromRedisClient(a.rdb), Tracer: a.tracing.Tracer,
	})
	a.reconciler = recovery.NewReconciler(a.store, a.client, log, recovery.ReconcilerOptions{Interval: cfg.OutboxInterval, FeedDepth: cfg.FeedDepth,
		Webhooks: a.store, WebhookOptions: cfg.WebhookOptions()})
	a.watchdog = recovery.NewWatchdog(a.store, asynq.NewInspectorFromRedisClient(a.rdb), a.client, log,
		recovery.WatchdogOptions{DeadAfter: cfg.WorkerDeadAfter, Registerer: a.reg})
	if a.ln, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("HTTP_ADDR: listen on %s: %w", cfg.HTTPAddr, err)
	}
	handler := a.server.Handler()
	if a.tracing.On() {
		handler = tracing.Handler(handler, a.tracing.TP)
	}
	a.httpSrv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10, ConnState: a.countConn}
	if cfg.MetricsAddr != "" {
		if a.metricsLn, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			return nil, fmt.Errorf("METRICS_ADDR: listen on %s: %w", cfg.MetricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", a.metricsHandler())
		a.metricSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}
	return a, nil
}

func (a *API) metricsHandler() http.Handler {
	return promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{})
}

// Addr is the API's listen address.
func (a *API) Addr() string { return a.ln.Addr().String() }

// Embedded reports whether the API runs its own Redis and worker.
func (a *API) Embedded() bool { return a.embedded != nil }

// Routes lists the API's routes, "METHOD /path".
func (a *API) Routes() []string { return a.server.Routes() }

// Run serves until ctx ends, then fails readiness, drains in-flight
// requests within ShutdownTimeout, and stops the embedded worker.
func (a *API) Run(ctx context.Context) error {
	lctx, stopListen := context.WithCancel(context.WithoutCancel(ctx))
	defer stopListen()
	go a.store.ListenEvents(lctx, a.hub)
	go a.loadSessionKeys(lctx)
	go a.sampleHistory(lctx)
	// The history outlives the HTTP server, so the cache answers of the
	// requests drained last are counted.
	hctx, stopHistory := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHistory()
	historyDone := make(chan struct{})
	go func() { defer close(historyDone); a.history.Run(hctx) }()

	var wg sync.WaitGroup
	wctx, stopWorker := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWorker()
	if a.embedded != nil {
		wg.Add(2)
		go func() { defer wg.Done(); a.embedded.worker.Run(wctx) }()
		go func() { defer wg.Done(); a.advanceClock(wctx) }()
	}
	// The reconciler outlives the HTTP server: requests still being
	// drained may leave it work.
	rctx, stopReconciler := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReconciler()
	reconcilerDone := make(chan struct{})
	go func() { defer close(reconcilerDone); a.reconciler.Run(rctx) }()
	watchdogDone := make(chan struct{})
	go func() { defer close(watchdogDone); a.watchdog.Run(rctx) }()
	errc := make(chan error, 2)
	go func() { errc <- a.httpSrv.Serve(a.ln) }()
	if a.metricSrv != nil {
		go func() { errc <- a.metricSrv.Serve(a.metricsLn) }()
	}
	a.log.Info("api listening", "http_addr", a.Addr(), "embedded", a.embedded != nil)

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			runErr = fmt.Errorf("api: serve: %w", err)
		}
	}
	a.log.Info("api shutting down", "drain_time", a.cfg.DrainTime.String(), "shutdown_timeout", a.cfg.ShutdownTimeout.String())
	// Readiness fails first, and every answer from now on closes its
	// connection; the held long polls are answered at once, 202 with the
	// current state, instead of being cut at ShutdownTimeout. Clients
	// still on a kept-alive connection get their next answer here and
	// then connect elsewhere; Shutdown then closes the listener and the
	// connections left idle.
	a.server.Drain()
	a.server.EndWaits()
	a.drainConns(a.cfg.DrainTime)
	sctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	if err := a.httpSrv.Shutdown(sctx); err != nil {
		a.log.Warn("api: requests still running at shutdown timeout", "err", err)
	}
	if a.metricSrv != nil {
		a.metricSrv.Shutdown(sctx)
	}
	stopReconciler()
	stopHistory()
	<-reconcilerDone
	<-watchdogDone
	<-historyDone
	stopWorker()
	wg.Wait()
	tctx, cancelTraces := context.WithTimeout(context.Background(), tracing.ShutdownTimeout)
	defer cancelTraces()
	if err := a.tracing.Shutdown(tctx); err != nil {
		a.log.Warn("tracing: the last spans were not exported", "err", err)
	}
	a.log.Info("api stopped")
	return runErr
}

// countConn keeps openConns: the HTTP server's connections that are
// neither closed nor hijacked.
func (a *API) countConn(_ net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		a.openConns.Add(1)
	case http.StateClosed, http.StateHijacked:
		a.openConns.Add(-1)
	}
}

// drainConns waits until every connection has closed or d has passed.
func (a *API) drainConns(d time.Duration) {
	deadline := time.Now().Add(d)
	for a.openConns.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(min(20*time.Millisecond, time.Until(deadline)))
	}
	if n := a.openConns.Load(); n > 0 {
		a.log.Info("api: connections still open after the drain time", "open_conns", n)
	}
}

// advanceClock moves miniredis's clock with the wall clock: miniredis
// only expires keys when told time has passed, and records must expire.
func (a *API) advanceClock(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			a.embedded.mr.FastForward(now.Sub(last))
			last = now
		}
	}
}

// Close releases connections and, embedded, the in-memory Redis.
func (a *API) Close() error {
	if a.ln != nil {
		a.ln.Close()
	}
	if a.metricsLn != nil {
		a.metricsLn.Close()
	}
	if a.client != nil {
		a.client.Close()
	}
	if a.monitor != nil {
		a.monitor.Close()
	}
	if a.rdb != nil {
		a.rdb.Close()
	}
	if a.embedded != nil {
		a.embedded.mr.Close()
	}
	if a.tracing != nil {
		ctx, cancel := context.WithTimeout(context.Background(), tracing.ShutdownTimeout)
		defer cancel()
		a.tracing.Shutdown(ctx)
	}
	return nil
}

// loadSessionKeys records the configured keys as the ones that may hold
// dashboard sessions as soon as Redis answers, so that a key removed from
// the configuration has its sessions ended at start, whether or not a
// request comes to need them (see api.Server.LoadSessionKeys).
func (a *API) loadSessionKeys(ctx context.Context) {
	for {
		err := a.server.LoadSessionKeys(ctx)
		if err == nil {
			return
		}
		a.log.Warn("could not load the API keys' session epochs; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// historySampleLease is the lease of the replica that samples the
// pending counts for the history: one replica's sample is the whole of it.
const historySampleLease = "history-sample"

// sampleHistory records, every HISTORY_INTERVAL, how many tasks of each
// tenant key (of the anonymous owner, with keys off) have not ended, in
// the history's current minute. One replica at a time does, under
// historySampleLease; it lasts three intervals, so another takes over
// soon after the holder dies.
func (a *API) sampleHistory(ctx context.Context) {
	var owners []string
	for _, k := range a.cfg.keys {
		if !k.IsOperator() {
			owners = append(owners, k.Name)
		}
	}
	if len(owners) == 0 {
		owners = []string{""}
	}
	t := time.NewTicker(a.cfg.HistoryInterval)
	defer t.Stop()
	for {
		held, err := a.store.AcquireLease(ctx, historySampleLease, a.id, 3*a.cfg.HistoryInterval)
		if err == nil && held {
			err = a.store.SampleHistoryPending(ctx, time.Now(), owners)
		}
		if err != nil && ctx.Err() == nil {
			a.log.Debug("history: pending not sampled", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
