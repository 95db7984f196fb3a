// Package api is puzzleq's HTTP API: it validates requests with the same
// code the solvers use, records them, enqueues asynq tasks, and serves
// task and batch status with long polls woken by Redis pub/sub.
package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/admission"
	"github.com/puzzleq/puzzleq/internal/egress"
	"github.com/puzzleq/puzzleq/internal/ingest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/tracing"
	"github.com/puzzleq/puzzleq/tasks"
)

// Enqueuer puts a task on its queue; *asynq.Client satisfies it. The
// reconciler enqueues webhook deliveries and the watchdog re-drives with
// it. The Server needs none: single tasks are queued by the store's
// submit script with their record (store.SubmitTask), and batch units by
// its bulk enqueue (Store.EnqueueFed).
type Enqueuer interface {
	EnqueueContext(ctx context.Context, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error)
}

// Store is what the API needs of the record store.
type Store interface {
	CheckWrites(ctx context.Context) error
	// Confirm returns once REDIS_ACK_REPLICAS replicas hold every write
	// so far (store.ErrNotReplicated when they do not in time); nil at
	// once when acks are off. A 2xx that promises a write follows it.
	Confirm(ctx context.Context) error
	// AckReplicas and ConnectedReplicas are REDIS_ACK_REPLICAS and how
	// many replicas could confirm a write now, for /readyz.
	AckReplicas() int
	ConnectedReplicas(ctx context.Context) (int, error)
	SubmitTask(ctx context.Context, t store.NewTask, quota int) (json.RawMessage, time.Time, error)
	SubmitCached(ctx context.Context, t store.NewTask) (json.RawMessage, time.Time, error)
	batchStore
	DeleteTasks(ctx context.Context, ids []string) error
	Get(ctx context.Context, id string) (*store.Task, error)
	GetBatch(ctx context.Context, id string) (*store.Batch, error)
	Cancel(ctx context.Context, id, owner string) (apitype.TaskState, error)
	CancelBatch(ctx context.Context, batchID, owner string) (int, error)
	// DeleteBatch deletes owner's ended batch and its results.
	DeleteBatch(ctx context.Context, id, owner string) error
	// DeleteTask deletes owner's ended single task.
	DeleteTask(ctx context.Context, id, owner string) error
	CachedResults(ctx context.Context, cacheKeys []string) ([]json.RawMessage, error)
	Allow(ctx context.Context, owner string, perSecond, burst int) (bool, time.Duration, error)
	AllowOperator(ctx context.Context, who string, perSecond, burst int) (bool, time.Duration, error)
	AllowAuthFailure(ctx context.Context, addr string, perMinute int) (bool, time.Duration, error)
	ReleasePending(ctx context.Context, owner, unit string) error
	ClaimIdempotency(ctx context.Context, owner, key, batchID, bodyHash string) (bool, string, string, error)
	ReleaseIdempotency(ctx context.Context, owner, key, batchID, bodyHash string) error
	// SetBatchTrace records on a batch the trace context of the request
	// that submitted it, which its units' spans link to.
	SetBatchTrace(ctx context.Context, id, traceparent, tracestate string) error
	ItemStore
	SessionStore
	WebhookStore
	ListStore
	HistoryStore
}

// Waiter lets a long poll sleep until a task or batch event arrives;
// *store.Hub satisfies it.
type Waiter interface {
	Wait(key string) (fired <-chan struct{}, release func())
	// Subscribe is Wait with what the event carried: a single task's
	// event carries its ended record (store.DecodeEventTask).
	Subscribe(key string) (w *store.Wake, release func())
}

// Options are the API's limits and tunables. The limits come from the
// binary's Config (internal/app), where each default is stated once; New
// adds none of its own and panics, naming the option, when one is not
// positive, since that is a wiring bug and not a state to run in.
type Options struct {
	// History counts the single tasks the API answers from the cache
	// into the per-minute history; nil: they are not counted.
	History HistoryRecorder
	// MaxBodyBytes bounds a single-task request body.
	MaxBodyBytes int64
	// MaxBatchBodyBytes bounds a batch request body.
	MaxBatchBodyBytes int64
	// MaxBatchItems bounds the items of one batch.
	MaxBatchItems int
	// MaxWait bounds ?wait= on GETs.
	MaxWait time.Duration
	// ChunkSize is how many cheap items go into one chunk task.
	ChunkSize int
	// FeedDepth is how many batch units the bulk queue may hold waiting;
	// the rest wait in the store's fair feed (docs/batches.md).
	FeedDepth int
	// MaxConcurrentDecodes bounds batch bodies decoded at once, which
	// bounds the memory that decoding takes beyond the bodies themselves.
	// A slot is taken once the body has arrived, so slow uploads hold
	// none. Its default is MAX_CONCURRENT_DECODES's.
	MaxConcurrentDecodes int
	// MaxBytesInFlight bounds the request bodies (and streamed results)
	// held in memory at once, taken as the bytes arrive; the oldest
	// request may exceed it by its own limit so that one always
	// progresses. Its default is MAX_BYTES_IN_FLIGHT's.
	MaxBytesInFlight int64
	// MaxKeyBytesInFlight is the most of MaxBytesInFlight that one API
	// key's requests may hold at once (its oldest request may go past it,
	// as the pool's oldest may go past the pool), so that one tenant's
	// uploads cannot fill the pool for the others. Requests without a key
	// (auth off) are bound by MaxBytesInFlight alone. Its default is
	// MAX_KEY_BYTES_IN_FLIGHT's.
	MaxKeyBytesInFlight int64
	// BodyReadTimeout is the time a request body may take to arrive
	// beyond what BodyMinRate allows for its bytes; a slower one is
	// answered 408. It does not apply to long polls, which have no body.
	// Its default is BODY_READ_TIMEOUT's.
	BodyReadTimeout time.Duration
	// BodyMinRate, in bytes a second, is the slowest a body may keep
	// arriving: each byte that arrives moves the body's deadline on by
	// 1/BodyMinRate s, up to maxBodyTime in all. Its default is
	// BODY_MIN_RATE's.
	BodyMinRate int64
	// RequestTimeout bounds every request except the wait of a long poll.
	RequestTimeout time.Duration
	// Limits are the per-kind deadlines and budgets put on tasks.
	Limits tasks.Limits
	// Keys are the API keys; with none, auth is off and every caller is
	// the anonymous owner.
	Keys []APIKey
	// RatePerSecond and RateBurst are each key's token bucket unless the
	// key sets its own.
	RatePerSecond, RateBurst int
	// MaxPendingPerKey caps a key's unfinished tasks unless the key sets
	// its own cap.
	MaxPendingPerKey int
	// SessionTTL is how long a dashboard session lasts after sign-in.
	SessionTTL time.Duration
	// SessionsPerKey caps one key's live dashboard sessions; a sign-in
	// past it ends the key's oldest.
	SessionsPerKey int
	// SignInsPerKeyPerMinute and SignInsPerAddrPerMinute bound the
	// dashboard sign-ins of one key and of one client address a minute
	// (each its burst as well), counted in Redis across replicas.
	SignInsPerKeyPerMinute, SignInsPerAddrPerMinute int
	// WebhookPolicy says where completion webhooks may point
	// (WEBHOOK_ALLOWED_HOSTS); nil allows public addresses only.
	WebhookPolicy *egress.Policy
	// WebhooksEnabled is true when WEBHOOK_SECRET is set: without it no
	// webhook could be signed, so a submission naming one is refused.
	WebhooksEnabled bool
	// Resolver looks webhook hosts up; nil is net.DefaultResolver.
	Resolver egress.Resolver
	// Presence reports the live workers and the queues for
	// GET /v1/status; without it the route answers 503.
	Presence Presence
	// OperatorRatePerSecond and OperatorBurst are each operator's token
	// bucket on the operator routes (the dashboard, /metrics).
	OperatorRatePerSecond, OperatorBurst int
	// AuthFailuresPerMinute bounds the failed authentications of one
	// client address a minute, after which it is answered 429.
	AuthFailuresPerMinute int
	// AccessLogEvery samples the access log: one request in
	// AccessLogEvery gets its line (1: every request; 0: none), and
	// every server error (5xx) gets one whatever it is. Its default is
	// ACCESS_LOG_EVERY's.
	AccessLogEvery int
	// MaxStreamsPerKey bounds the event streams (GET
	// /v1/batches/{id}/events) one key holds open on this replica at
	// once; one more is answered 429.
	MaxStreamsPerKey int
	// HistoryReadMinutes bounds the minutes of history one key (and the
	// operators together) reads from this replica per 10 s; past it, 429.
	HistoryReadMinutes int
	// Mount, optional, adds routes that are not the API's own (metrics,
	// the queue dashboard) to the engine; operator checks the operator
	// credential and rate, and signs operators in from a browser.
	Mount func(e *gin.Engine, operator OperatorAuth)
	// Tracer, optional, starts the spans of a request's steps (admission,
	// the enqueue, the long poll's wait); nil: no spans, at no cost.
	Tracer trace.Tracer
}

func (o Options) check() {
	for _, v := range []struct {
		name string
		n    int64
	}{
		{"MaxBodyBytes", o.MaxBodyBytes}, {"MaxBatchBodyBytes", o.MaxBatchBodyBytes},
		{"MaxBatchItems", int64(o.MaxBatchItems)}, {"MaxWait", int64(o.MaxWait)}, {"ChunkSize", int64(o.ChunkSize)}, {"FeedDepth", int64(o.FeedDepth)},
		{"RequestTimeout", int64(o.RequestTimeout)}, {"RatePerSecond", int64(o.RatePerSecond)},
		{"RateBurst", int64(o.RateBurst)}, {"MaxPendingPerKey", int64(o.MaxPendingPerKey)},
		{"MaxBytesInFlight", o.MaxBytesInFlight}, {"MaxKeyBytesInFlight", o.MaxKeyBytesInFlight}, {"BodyReadTimeout", int64(o.BodyReadTimeout)}, {"BodyMinRate", o.BodyMinRate},
		{"SessionTTL", int64(o.SessionTTL)}, {"FeedDepth", int64(o.FeedDepth)},
		{"SessionsPerKey", int64(o.SessionsPerKey)}, {"SignInsPerKeyPerMinute", int64(o.SignInsPerKeyPerMinute)},
		{"SignInsPerAddrPerMinute", int64(o.SignInsPerAddrPerMinute)},
		{"FeedDepth", int64(o.FeedDepth)}, {"OperatorRatePerSecond", int64(o.OperatorRatePerSecond)},
		{"OperatorBurst", int64(o.OperatorBurst)}, {"AuthFailuresPerMinute", int64(o.AuthFailuresPerMinute)},
		{"MaxStreamsPerKey", int64(o.MaxStreamsPerKey)}, {"HistoryReadMinutes", int64(o.HistoryReadMinutes)},
		{"MaxConcurrentDecodes", int64(o.MaxConcurrentDecodes)},
	} {
		if v.n <= 0 {
			panic(fmt.Sprintf("api: Options.%s must be positive, got %d", v.name, v.n))
		}
	}
}

// Server holds the API's dependencies. Create it with New.
type Server struct {
	store   Store
	waiter  Waiter
	opts    Options
	log     *slog.Logger
	metrics *metrics
	batches *ingest.Decoder // reads and stages batch bodies
	admit   *admission.Pool // bytes of bodies and results held at once
	keys    []keyEntry      // tenant and operator keys
	// tenantAuth is whether /v1 needs a key: some tenant key is
	// configured. Operator keys alone leave /v1 open, as no keys do.
	tenantAuth bool
	failures   blocklist // addresses over their failed-authentication limit
	draining   atomic.Bool
	// historyReads bounds the minutes of history each key reads.
	historyReads historyLimiter
	// notReady is whether the last readiness probe failed on Redis, so
	// that only a change is logged.
	notReady   atomic.Bool
	engine     *gin.Engine
	ending     chan struct{} // closed by EndWaits
	endOnce    sync.Once
	streams    streamCounts // the open event streams of each key
	sessEpochs sessionEpochs
	idPrefix   string        // this process's random prefix of request IDs
	requests   atomic.Uint64 // requests numbered, for their IDs
	logged     atomic.Uint64 // requests counted for the access log's sampling
	hits       hitHints      // cache keys seen cached, for SubmitCached
}

// New builds the API and its routes. reg receives the HTTP metrics. It
// panics if opts lacks a limit (see Options).
func New(st Store, w Waiter, reg prometheus.Registerer, log *slog.Logger, opts Options) *Server {
	opts.check()
	if opts.WebhookPolicy == nil {
		opts.WebhookPolicy, _ = egress.ParsePolicy("")
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{store: st, waiter: w, opts: opts, log: log, historyReads: historyLimiter{budget: opts.HistoryReadMinutes},
		metrics: newMetrics(reg),
		batches: ingest.New(ingest.Config{MaxItems: opts.MaxBatchItems, ChunkSize: opts.ChunkSize,
			Deadline: opts.Limits.Deadline, Decodes: opts.MaxConcurrentDecodes}),
		admit: admission.New(opts.MaxBytesInFlight, opts.MaxKeyBytesInFlight), ending: make(chan struct{})}
	for _, k := range opts.Keys {
		s.keys = append(s.keys, keyEntry{APIKey: k, digest: sha256.Sum256([]byte(k.Key))})
		s.tenantAuth = s.tenantAuth || !k.IsOperator()
	}
	var p [6]byte
	if _, err := rand.Read(p[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	s.idPrefix = hex.EncodeToString(p[:]) + "-"
	s.engine = s.routes()
	if reg != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "puzzleq_api_bytes_in_flight",
			Help: "Bytes of request bodies and streamed results the API holds now, of MAX_BYTES_IN_FLIGHT.",
		}, func() float64 { return float64(s.admit.InUse()) }))
	}
	return s
}

// Handler returns the http.Handler serving the API.
func (s *Server) Handler() http.Handler { return s.engine }

// Drain makes /readyz fail, so load balancers stop sending traffic before
// the listener closes, and makes every answer from then on close its
// connection (Connection: close). A client's kept-alive connection still
// leads to this replica after it left the load balancer; closing it
// after an answer, which the client reads, sends the client's next
// request to another replica. Closing it while idle instead races the
// client's next request, which then meets a reset the client cannot
// tell from a request the server took.
func (s *Server) Drain() { s.draining.Store(true) }

// closeWhileDraining asks the server to close the connection after the
// answer once Drain was called.
func (s *Server) closeWhileDraining() gin.HandlerFunc {
	return func(c *gin.Context) {
		s.closeIfDraining(c)
		c.Next()
	}
}

// closeIfDraining marks c's answer Connection: close once Drain was
// called; net/http then closes the connection after writing it.
func (s *Server) closeIfDraining(c *gin.Context) {
	if s.draining.Load() {
		c.Header("Connection", "close")
	}
}

// EndWaits answers every long poll held now (GET a task, an item or a
// batch with ?wait=, /results with ?wait=, a submit with ?wait=), and
// every one that comes after, at once with the current state: 202 and
// the resource, so that the client polls again, on another replica.
// The binary calls it on shutdown once its listener is closed; without
// it the polls were held to the end of SHUTDOWN_TIMEOUT and then cut,
// and 20 of 20 clients got EOF on every rolling restart.
func (s *Server) EndWaits() { s.endOnce.Do(func() { close(s.ending) }) }

// waitsEnded reports whether EndWaits was called.
func (s *Server) waitsEnded() bool {
	select {
	case <-s.ending:
		return true
	default:
		return false
	}
}

// polledStatus is the status of a read's answer: 200, or 202 for a
// long poll (wait > 0) on work that has not ended once EndWaits cut the
// wait short. An answer given while draining closes its connection, as
// closeWhileDraining does for the requests that arrive after Drain: a
// poll held since before it would otherwise leave its connection idle.
func (s *Server) polledStatus(c *gin.Context, wait time.Duration, ended bool) int {
	s.closeIfDraining(c)
	if wait > 0 && !ended && s.waitsEnded() {
		return http.StatusAccepted
	}
	return http.StatusOK
}

// endingKey is the context key under which a request carries the
// server's ending channel (see EndWaits), for waitFor.
type endingKey struct{}

// withEnding returns ctx carrying the server's ending channel.
func (s *Server) withEnding(ctx context.Context) context.Context {
	return context.WithValue(ctx, endingKey{}, s.ending)
}

// endingOf is the ending channel ctx carries; nil (never ready) if none.
func endingOf(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(endingKey{}).(chan struct{})
	return ch
}

// Routes lists every route the API serves, as "METHOD /path"; the
// deployment tests check probe paths against it.
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.engine.Routes() {
		out = append(out, r.Method+" "+r.Path)
	}
	return out
}

func (s *Server) routes() *gin.Engine {
	e := gin.New()
	e.HandleMethodNotAllowed = true
	e.ContextWithFallback = true
	if s.opts.Tracer != nil {
		e.Use(tracing.Route())
	}
	e.Use(s.recoverer(), s.observe(), s.closeWhileDraining(), strictQuery())
	e.NoRoute(func(c *gin.Context) {
		fail(c, newError(http.StatusNotFound, apitype.CodeNotFound, "", "no such route"))
	})
	e.NoMethod(func(c *gin.Context) {
		fail(c, newError(http.StatusMethodNotAllowed, apitype.CodeMethodNotAllowed, "", "method not allowed"))
	})

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/openapi.yaml", s.openapi)

	v1 := e.Group("/v1", s.admitted(), s.timeout(), s.Authenticate(), s.rateLimit())
	v1.GET("/tasks", s.listTasks)
	v1.POST("/tasks", s.createTask)
	v1.GET("/tasks/:id", s.getTask)
	v1.GET("/tasks/:id/puzzle", s.getTaskPuzzle)
	v1.DELETE("/tasks/:id", s.cancelTask)
	v1.POST("/tasks/:id/retry", s.retryTask)
	v1.GET("/batches", s.listBatches)
	v1.POST("/batches", s.createBatch)
	v1.GET("/batches/:id", s.getBatch)
	v1.DELETE("/batches/:id", s.cancelBatch)
	v1.GET("/batches/:id/output", s.batchOutput)
	v1.GET("/batches/:id/results", s.batchResults)
	v1.GET("/batches/:id/events", s.batchEvents)
	v1.GET("/batches/:id/items", s.listItems)
	v1.POST("/batches/:id/retry", s.retryBatch)
	v1.GET("/status", s.status)
	v1.GET("/history", s.history)
	e.GET("/history", s.Operator(), s.operatorHistory)
	s.mountUI(e)
	if s.opts.Mount != nil {
		s.opts.Mount(e, OperatorAuth{Check: s.Operator(), Login: s.OperatorLogin})
	}
	return e
}

func (s *Server) healthz(c *gin.Context) { c.JSON(http.StatusOK, apitype.Status{Status: "ok"}) }

// readyz answers 200 only while Redis takes writes: a Redis at maxmemory
// answers PING and refuses every submission, and also every read, since
// each request writes its key's rate-limit bucket. Failing then takes
// the replica out of its load balancer (and tells the operator where to
// look, docs/operations.md) instead of answering 503 to all its traffic
// while it looks ready.
func (s *Server) readyz(c *gin.Context) {
	if s.draining.Load() {
		c.JSON(http.StatusServiceUnavailable, apitype.ErrorBody{Error: apitype.Error{Code: apitype.CodeUnavailable, Message: "shutting down"}})
		return
	}
	ctx, cancel := context.WithTimeout(c, 2*time.Second)
	defer cancel()
	if err := s.store.CheckWrites(ctx); err != nil {
		msg := "redis is not answering"
		if errors.Is(err, store.ErrRefusesWrites) {
			msg = "redis refuses writes (at maxmemory, read-only or failing to persist)"
		}
		if !s.notReady.Swap(true) {
			s.log.WarnContext(c, "not ready: redis does not take writes", "err", err)
		}
		c.JSON(http.StatusServiceUnavailable, apitype.ErrorBody{Error: apitype.Error{Code: apitype.CodeUnavailable, Message: msg}})
		return
	}
	if want := s.store.AckReplicas(); want > 0 {
		// Work the replicas cannot confirm would be answered 503: a load
		// balancer had better send it elsewhere.
		n, err := s.store.ConnectedReplicas(ctx)
		if err != nil || n < want {
			c.JSON(http.StatusServiceUnavailable, apitype.ErrorBody{Error: apitype.Error{Code: apitype.CodeUnavailable,
				Message: fmt.Sprintf("%d of the %d replicas REDIS_ACK_REPLICAS asks for can confirm writes", n, want)}})
			return
		}
	}
	if s.notReady.Swap(false) {
		s.log.InfoContext(c, "ready again: redis takes writes")
	}
	c.JSON(http.StatusOK, apitype.Status{Status: "ready"})
}

// confirm runs Store.Confirm before a 2xx that promises the request's
// writes; when it fails it answers the error (503) and returns false.
func (s *Server) confirm(c *gin.Context) bool {
	if err := s.store.Confirm(c.Request.Context()); err != nil {
		fail(c, err)
		return false
	}
	return true
}

// newID returns 128 random bits in hex: IDs must not be guessable.
func newID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// validID rejects path IDs of single tasks and batches that could not
// have come from newID, before they reach Redis. Item IDs are told apart
// (apitype.ParseItemID) before it is asked.
func validID(id string) bool { return apitype.IsID(id) }

// parseWait reads ?wait= as a Go duration ("30s") or whole seconds ("30").
func (s *Server) parseWait(c *gin.Context) (time.Duration, error) {
	v := c.Query("wait")
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.Atoi(v)
		if nerr != nil {
			return 0, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "wait", "wait must be a duration such as 30s, got %q", truncate(v, 20))
		}
		// Compare before converting: a large n would overflow Duration
		// and could wrap around to an allowed wait.
		if n > int(s.opts.MaxWait/time.Second) {
			return 0, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "wait", "wait is at most %s", s.opts.MaxWait)
		}
		d = time.Duration(n) * time.Second
	}
	if d < 0 {
		return 0, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "wait", "wait must not be negative")
	}
	if d > s.opts.MaxWait {
		return 0, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "wait", "wait is at most %s", s.opts.MaxWait)
	}
	return d, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
