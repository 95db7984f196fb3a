// Package worker runs puzzleq's tasks (package tasks states them): the
// handler that solves single tasks and batch units, the gate that admits
// expensive work, the heartbeat that records what a worker runs, webhook
// delivery and the worker's metrics. cmd/worker wires it up through
// internal/app.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/tracing"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
	"github.com/puzzleq/puzzleq/tasks"
)

// Store is what the handler needs of the record store. It is declared
// here, by its consumer, in terms of this package and apitype only, so
// that any store can implement it (internal/store's does) and tests can
// fake it.
type Store interface {
	// Start marks tasks active and looks their answers up in the cache
	// (cacheKeys[i] is task i's key, "" when unknown). It returns each
	// task's state before the call ("" for a record that is gone)
	// and its cached result (nil on a miss). Only the tasks that were
	// pending or active may run.
	Start(ctx context.Context, ts []Transition, cacheKeys []string) ([]apitype.TaskState, []json.RawMessage, error)
	// Finish moves tasks to the terminal states of ts, caching the result
	// of a completed task under cacheKeys[i] when it is not "". It returns
	// each task's state before the call: pending or active means this call
	// ended it, anything else that it had ended already.
	Finish(ctx context.Context, ts []Transition, cacheKeys []string) ([]apitype.TaskState, error)
	// SetProgress records a long search's progress on a task, or on a
	// batch item (id from apitype.ItemID), while it is active.
	SetProgress(ctx context.Context, id string, p apitype.Progress) error

	// StartUnit marks a unit of a batch active (its items' counts move
	// from pending to active once, however often it is delivered), counts
	// an attempt, and returns the unit's items that have not ended.
	StartUnit(ctx context.Context, ref tasks.UnitRef) (*UnitWork, error)
	// FinishUnit writes the outcomes of a unit's items. Only an item
	// without an ended entry gets one, so a redelivered unit, or one whose
	// item was canceled meanwhile, changes and counts nothing twice. It
	// returns how many items it ended. mark is the UnitWork.Mark of the
	// StartUnit that began this delivery.
	FinishUnit(ctx context.Context, ref tasks.UnitRef, mark string, outs []ItemOutcome) (int, error)
	// Cached returns the cached result for key, nil on a miss.
	Cached(ctx context.Context, key string) (json.RawMessage, error)
}

// Transition is one move of a single task's record to a new state, for
// Store.Start and Store.Finish. (Batch items move by StartUnit and
// FinishUnit.)
type Transition struct {
	ID     string
	Owner  string            // the API key that made the task; "" when auth is off
	State  apitype.TaskState // for Finish: completed, failed or canceled
	Result json.RawMessage   // completed
	Code   string            // failed, canceled: an apitype task error code
	Msg    string
	Cached bool // completed from the cache
	// Unstarted, for Finish, marks a task that ran without Start (an
	// instant solve of a single task): Finish counts its attempt and
	// sets its start time.
	Unstarted bool
}

// Handler runs solve, chunk and unit tasks.
type Handler struct {
	store   Store
	cancels *Cancels
	limits  tasks.Limits
	metrics *Metrics
	log     *slog.Logger
	// flushEvery bounds how long finished items of a chunk wait before
	// their results are written, so long chunks still show progress
	// (100 ms until SetWriteInterval; the binaries set it from
	// UNIT_WRITE_INTERVAL).
	flushEvery time.Duration
	// solveFn runs one solve; tests replace it to provoke panics.
	solveFn func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error)
	// feed refills the bulk queue after a unit; nil: no feeding (see
	// SetFeed).
	feed *feedConfig
	// solveObs holds metrics.SolveSeconds of each kind (nil without
	// metrics).
	solveObs map[puzzle.Kind]prometheus.Observer
	// instant says whether a request is a table lookup (the function
	// instant); tests that replace solveFn make it always false.
	instant func(*puzzle.Parsed) bool
	// gate admits expensive single tasks (see SetGate); nil: none.
	gate Gate
	// capOf returns the per-key cap of expensive runs (0: none).
	capOf func() int
	// slotsOf returns the cluster's solver slots, shared by the keys
	// with expensive work (0: no sharing).
	slotsOf func() int
	// lease is the expensive runs' lease (0: SolveLease).
	lease time.Duration
	// history adds up what ended for the history (SetHistory); nil:
	// none kept.
	history *History
	// tracer starts the spans of the tasks (SetTracer); nil: none.
	tracer trace.Tracer
}

// SetTracer makes h span each task it runs: a single task's spans join
// the trace its payload carries, a batch unit's start a trace linked to
// its batch's. nil (the default) records none, at no cost.
func (h *Handler) SetTracer(tr trace.Tracer) { h.tracer = tr }

// SetHistory makes h count what it ends in r.
func (h *Handler) SetHistory(r *History) { h.history = r }

// NewHandler returns a Handler. cancels receives the IDs of tasks canceled
// while running (see store.ListenCancels); metrics may be nil.
func NewHandler(st Store, cancels *Cancels, l tasks.Limits, m *Metrics, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cancels == nil {
		cancels = NewCancels()
	}
	h := &Handler{store: st, cancels: cancels, limits: l, metrics: m, log: log, flushEvery: 100 * time.Millisecond,
		solveFn: func(ctx context.Context, p *puzzle.Parsed) (json.RawMessage, error) { return p.Solve(ctx) },
		instant: instant}
	if m != nil {
		h.solveObs = make(map[puzzle.Kind]prometheus.Observer, len(puzzle.Kinds))
		for _, k := range puzzle.Kinds {
			h.solveObs[k] = m.SolveSeconds.WithLabelValues(string(k))
		}
	}
	return h
}

// Register installs the handler for every task type on mux.
func (h *Handler) Register(mux *asynq.ServeMux) {
	for _, t := range []string{tasks.TypeSliding, tasks.TypeSweep, tasks.TypeFill, tasks.TypeUnit} {
		mux.Handle(t, h)
	}
}

// ProcessTask implements asynq.Handler. Each delivery runs in a span when
// h traces: "task.process", a child of the API's enqueue when the payload
// carries its trace context, or "unit.process", the root of a trace of
// its own linked to its batch's (the request that submitted the batch
// ended long before).
func (h *Handler) ProcessTask(ctx context.Context, t *asynq.Task) (err error) {
	switch t.Type() {
	case tasks.TypeSliding, tasks.TypeSweep, tasks.TypeFill:
		var p tasks.SolvePayload
		if err := tasks.DecodePayload(t.Payload(), &p); err != nil || p.ID == "" {
			// Without an ID there is no record to fail: drop it for good.
			return fmt.Errorf("tasks: undecodable %s payload: %v: %w", t.Type(), err, asynq.SkipRetry)
		}
		if h.tracer != nil {
			var span trace.Span
			ctx, span = h.startDelivery(tracing.Extract(ctx, p.TraceParent, p.TraceState), t, "task.process", nil,
				attribute.String("puzzleq.task.id", p.ID))
			defer func() { tracing.Fail(span, err); span.End() }()
		}
		return h.processSolve(ctx, t, &p)
	case tasks.TypeUnit:
		ref, err := decodeUnitRef(t.Payload())
		if err != nil {
			return fmt.Errorf("tasks: undecodable unit payload: %v: %w", err, asynq.SkipRetry)
		}
		if h.tracer != nil {
			var span trace.Span
			ctx, span = h.startDelivery(ctx, t, "unit.process", h.batchLinks(ctx, ref.BatchID),
				attribute.String("puzzleq.batch.id", ref.BatchID), attribute.String("puzzleq.unit", ref.Unit))
			defer func() { tracing.Fail(span, err); span.End() }()
		}
		return h.processUnit(ctx, ref)
	default:
		return fmt.Errorf("tasks: unknown task type %q: %w", t.Type(), asynq.SkipRetry)
	}
}

// startDelivery starts the consumer span name of delivery t, with
// attributes of its own beside asynq's queue, task ID and retry count; a
// unit's (links set) is a new root, linked to its batch's trace.
func (h *Handler) startDelivery(ctx context.Context, t *asynq.Task, name string, links []trace.Link, own ...attribute.KeyValue) (context.Context, trace.Span) {
	attrs := append(own, attribute.String("messaging.system", "asynq"), attribute.String("puzzleq.task.type", t.Type()))
	if q, ok := asynq.GetQueueName(ctx); ok {
		attrs = append(attrs, attribute.String("messaging.destination.name", q))
	}
	if id, ok := asynq.GetTaskID(ctx); ok {
		attrs = append(attrs, attribute.String("messaging.message.id", id))
	}
	if n, ok := asynq.GetRetryCount(ctx); ok {
		attrs = append(attrs, attribute.Int("puzzleq.retried", n))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	if t.Type() == tasks.TypeUnit {
		opts = append(opts, trace.WithNewRoot(), trace.WithLinks(links...))
	}
	return h.tracer.Start(ctx, name, opts...)
}

// batchLinks is the link to the trace of the request that submitted
// batch batchID, read from its record (BatchTracer); none when the store
// keeps none or the batch has none.
func (h *Handler) batchLinks(ctx context.Context, batchID string) []trace.Link {
	bt, ok := h.store.(BatchTracer)
	if !ok {
		return nil
	}
	tp, ts, err := bt.BatchTrace(ctx, batchID)
	if err != nil {
		return nil
	}
	sc := tracing.SpanContext(tp, ts)
	if !sc.IsValid() {
		return nil
	}
	return []trace.Link{{SpanContext: sc}}
}

// BatchTracer is what a Store may offer for the spans of batch units:
// the trace context recorded on a batch when it was submitted
// (*store.Store's BatchTrace); "" when none was.
type BatchTracer interface {
	BatchTrace(ctx context.Context, batchID string) (traceparent, tracestate string, err error)
}

// processSolve runs a single task, or a batch item in a unit of its own,
// from its decoded payload.
func (h *Handler) processSolve(ctx context.Context, t *asynq.Task, p *tasks.SolvePayload) error {
	ctx = withAcceptedAt(ctx, p.At)
	if h.gate != nil && t.Type() != tasks.TypeFill {
		// Fills are all cheap; a sliding board is expensive over 9
		// cells, which only decoding tells.
		if pz, err := puzzle.Decode(p.Request); err == nil && !pz.Cheap() {
			return h.processExpensive(ctx, p.Owner, p.Item, pz)
		}
	}
	return h.processItems(ctx, p.Owner, []tasks.Item{p.Item})
}

// outcome is what became of one item.
type outcome struct {
	result json.RawMessage
	cached bool
	code   string
	msg    string
	skip   bool // canceled while running: the record already says so
	// overrun: the solve passed its wall-clock deadline (code timeout),
	// final only on the last of Limits.DeadlineAttempts deliveries.
	overrun bool
}

// ErrDeadlineOverrun is returned for a task whose solve passed its
// deadline on a delivery before the last of Limits.DeadlineAttempts: wall
// time depends on the machine (a frozen or throttled worker overruns
// what the same solve meets elsewhere), so asynq retries the task, and
// the items it had finished are written first.
var ErrDeadlineOverrun = errors.New("solve deadline overrun; retried")

// ErrNotReplicated is returned by a store write that fewer replicas than
// REDIS_ACK_REPLICAS confirmed in time (store.ErrNotReplicated). A
// delivery that meets it returns it, unacked: asynq runs the task again
// after about a second, counting neither a retry nor a failure (the
// binaries' IsFailure), and the next delivery finds its items ended and
// confirms them before it acks.
var ErrNotReplicated = errors.New("write not confirmed by enough replicas")

// finalNote records that a delivery's last write was a Store.Finish that
// returned nil: with REDIS_ACK_REPLICAS set, Finish confirms its own
// writes in its round trip, and nothing is left to confirm.
type finalNote struct{ finished atomic.Bool }

type finalNoteKey struct{}

// TrackFinalWrite returns ctx for a delivery and a func that reports,
// once the delivery returned nil, whether its last write was a Finish
// that succeeded (see finalNote): the binary's confirmation of the
// delivery is then done already.
func TrackFinalWrite(ctx context.Context) (context.Context, func() bool) {
	n := &finalNote{}
	return context.WithValue(ctx, finalNoteKey{}, n), n.finished.Load
}

// noteFinalWrite marks ctx's delivery as ended by a successful Finish.
func noteFinalWrite(ctx context.Context) {
	if n, ok := ctx.Value(finalNoteKey{}).(*finalNote); ok {
		n.finished.Store(true)
	}
}

// lastDeadlineAttempt reports whether a deadline overrun in this delivery
// is final: it is the last of Limits.DeadlineAttempts (or of asynq's
// deliveries), or ctx is not an asynq task's and no retry would come.
func (h *Handler) lastDeadlineAttempt(ctx context.Context) bool {
	maxR, ok := asynq.GetMaxRetry(ctx)
	if h.limits.DeadlineAttempts <= 1 || !ok {
		return true
	}
	retried, _ := asynq.GetRetryCount(ctx)
	return retried+1 >= h.limits.DeadlineAttempts || retried >= maxR
}

// lastDelivery reports whether asynq gives up on the task if this
// delivery returns an error: its retries are spent, and asynq archives it
// whatever the error, a WaitError too (ErrorHandler then fails it). Such
// a delivery of expensive work is not capped: a run over its key's cap
// by one is the smaller error than a task failed for waiting.
func lastDelivery(ctx context.Context) bool {
	maxR, ok := asynq.GetMaxRetry(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	return ok && retried >= maxR
}

// processItems runs a single task's item (batch units go through
// processUnit, whose items are not task records). Every step
// is idempotent, so a redelivered task is harmless: items that already
// ended are skipped by the start script, and the finish script counts an
// item only on its first move to a terminal state.
func (h *Handler) processItems(ctx context.Context, owner string, items []tasks.Item) error {
	// Register for cancellation before reading the state, so a cancel that
	// lands between the two is not missed.
	ictx := make([]context.Context, len(items))
	for i, it := range items {
		c, cancel := context.WithCancel(ctx)
		ictx[i] = c
		release := h.cancels.register(it.ID, cancel)
		defer func() { release(); cancel() }()
	}

	// Decode first, so the start script can also look each answer up in
	// the cache: the API checked already, but an identical puzzle may have
	// been solved since.
	parsed := make([]*puzzle.Parsed, len(items))
	outs := make([]*outcome, len(items))
	keys := make([]string, len(items))
	ts := make([]Transition, len(items))
	for i, it := range items {
		ts[i] = Transition{ID: it.ID}
		// The request is our own Payload, validated by the API; decoding
		// it again holds bytes that changed in Redis to the same rules.
		p, err := puzzle.Decode(it.Request)
		if err != nil {
			outs[i] = &outcome{code: apitype.CodeInvalidPuzzle, msg: err.Error()}
			continue
		}
		parsed[i], keys[i] = p, p.Key()
	}
	var (
		prev []apitype.TaskState
		hits []json.RawMessage
	)
	if unstarted := len(items) == 1 && parsed[0] != nil && h.instant(parsed[0]); unstarted {
		// An instant solve (a table lookup, microseconds) skips Start:
		// no client could see it active, and the cache cannot beat the
		// table. Finish counts the attempt, and leaves alone a task that
		// ended meanwhile (a cancel), as Start would have.
		prev = []apitype.TaskState{apitype.TaskStatePending}
		ts[0].Unstarted = true
	} else {
		var err error
		prev, hits, err = h.store.Start(ctx, ts, keys)
		if err != nil {
			return fmt.Errorf("tasks: start %d items: %w", len(items), err)
		}
	}
	for i, hit := range hits {
		if hit != nil && outs[i] == nil {
			outs[i] = &outcome{result: hit, cached: true}
		}
	}

	var (
		pendingIdx []int
		lastFlush  = time.Now()
		finished   bool // a Finish of this delivery succeeded
	)
	flush := func() error {
		if len(pendingIdx) == 0 {
			return nil
		}
		if err := h.finish(ctx, owner, items, parsed, keys, outs, pendingIdx, ts[0].Unstarted); err != nil {
			return err
		}
		finished = true
		pendingIdx = pendingIdx[:0]
		lastFlush = time.Now()
		return nil
	}
	for i := range items {
		if !endedNow(prev[i]) {
			continue
		}
		if outs[i] == nil {
			outs[i] = h.tracedSolve(ctx, ictx[i], items[i].ID, parsed[i])
		}
		if ctx.Err() != nil {
			// Shutdown or a lost lease: write what is done, and let asynq
			// requeue the task; the finished items will be skipped.
			if err := flush(); err != nil {
				return err
			}
			return fmt.Errorf("tasks: interrupted: %w", ctx.Err())
		}
		if outs[i].overrun && !h.lastDeadlineAttempt(ctx) {
			if err := flush(); err != nil {
				return err
			}
			return fmt.Errorf("tasks: task %s: %w", items[i].ID, ErrDeadlineOverrun)
		}
		if !outs[i].skip {
			pendingIdx = append(pendingIdx, i)
		}
		if time.Since(lastFlush) >= h.flushEvery {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if finished {
		// The last Finish came after every write and every state this
		// delivery read (Start's), so it confirmed them all.
		noteFinalWrite(ctx)
	}
	return nil
}

// solve runs one item under its kind's deadline and budget, turning every
// way it can end into an outcome. A panic in a solver fails the item, not
// the worker.
func (h *Handler) solve(parent, ictx context.Context, id string, p *puzzle.Parsed) (o *outcome) {
	k := p.Kind()
	ctx := ictx
	if !h.instant(p) {
		// A table lookup is not given a deadline: it never reads it, and
		// the timer cost as much as the lookup.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ictx, h.limits.Deadline[k])
		defer cancel()
	}
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			h.log.Error("solver panic", "kind", string(k), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			o = &outcome{code: apitype.CodeInternal, msg: "internal error while solving"}
		}
		if h.metrics != nil && o != nil && !o.skip && parent.Err() == nil {
			h.solveSeconds(k).Observe(time.Since(start).Seconds())
		}
	}()
	sp := p
	if !h.instant(p) {
		// Budgets and progress are the search's; a table lookup reads
		// neither, and each With copies the request.
		sp = p.WithMaxNodes(h.limits.MaxNodes[k]).WithProgress(h.reportProgress(ctx, id))
	}
	res, err := h.solveFn(ctx, sp)
	var ie *solvers.InputError
	switch {
	case err == nil:
		return &outcome{result: res}
	case parent.Err() != nil:
		return &outcome{skip: true} // the caller sees parent.Err() and requeues
	case ictx.Err() != nil:
		return &outcome{skip: true} // canceled by a client
	case errors.Is(err, context.DeadlineExceeded):
		return &outcome{code: apitype.CodeTimeout, msg: fmt.Sprintf("%s solve exceeded its deadline of %s", k, h.limits.Deadline[k]), overrun: true}
	case errors.Is(err, solvers.ErrBudgetExceeded):
		return &outcome{code: apitype.CodeBudgetExceeded, msg: err.Error()}
	case errors.As(err, &ie):
		return &outcome{code: apitype.CodeInvalidPuzzle, msg: ie.Error()}
	default:
		h.log.Error("solver error", "kind", string(k), "err", err)
		return &outcome{code: apitype.CodeInternal, msg: "internal error while solving"}
	}
}

// tracedSolve is solve in a "task.solve" span when h traces.
func (h *Handler) tracedSolve(parent, ictx context.Context, id string, p *puzzle.Parsed) *outcome {
	if h.tracer == nil {
		return h.solve(parent, ictx, id, p)
	}
	ctx, span := h.tracer.Start(ictx, "task.solve", trace.WithAttributes(attribute.String("puzzleq.kind", string(p.Kind())),
		attribute.String("puzzleq.item.id", id)))
	o := h.solve(parent, ctx, id, p)
	if o.code != "" {
		span.SetStatus(codes.Error, o.code+": "+o.msg)
	}
	span.End()
	return o
}

// solveSeconds returns the solve time histogram of kind k, looked up
// once per kind rather than by label on every item.
func (h *Handler) solveSeconds(k puzzle.Kind) prometheus.Observer {
	if o, ok := h.solveObs[k]; ok {
		return o
	}
	return h.metrics.SolveSeconds.WithLabelValues(string(k))
}

// finish writes the outcomes of items idx in one round trip and counts the
// ones this call actually ended. keys are the items' cache keys as
// processItems computed them (Parsed.Key encodes and hashes the puzzle,
// so once per item is enough).
func (h *Handler) finish(ctx context.Context, owner string, items []tasks.Item, parsed []*puzzle.Parsed, keys []string, outs []*outcome, idx []int, unstarted bool) error {
	ts := make([]Transition, len(idx))
	ckeys := make([]string, len(idx))
	for j, i := range idx {
		o := outs[i]
		t := Transition{ID: items[i].ID, Owner: owner, Unstarted: unstarted}
		if o.code == "" {
			t.State, t.Result, t.Cached = apitype.TaskStateCompleted, o.result, o.cached
			ckeys[j] = keys[i] // "" for an item that did not decode
		} else {
			t.State, t.Code, t.Msg = apitype.TaskStateFailed, o.code, o.msg
		}
		ts[j] = t
	}
	// The results must be written even if the task's ctx just ended: they
	// are done work. A short detached context bounds the write.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	wctx, span := tracing.Start(wctx, h.tracer, "task.write")
	prev, err := h.store.Finish(wctx, ts, ckeys)
	tracing.Fail(span, err)
	span.End()
	if err != nil && (!errors.Is(err, ErrNotReplicated) || len(prev) != len(ts)) {
		return fmt.Errorf("tasks: finish %d items: %w", len(ts), err)
	}
	// Written but not confirmed (ErrNotReplicated): counted here, where
	// the items ended, and returned below, so that asynq runs the task
	// again and that delivery, finding them ended, confirms them.
	unconfirmed := err
	for j, i := range idx {
		if !endedNow(prev[j]) {
			continue // a duplicate delivery: counted the first time
		}
		h.history.Ended(owner, outs[i].code == "", 1, acceptedAt(ctx))
		if h.metrics == nil {
			continue
		}
		kind := "unknown"
		if parsed[i] != nil {
			kind = string(parsed[i].Kind())
		}
		outcomeLabel := string(apitype.TaskStateCompleted)
		if outs[i].code != "" {
			outcomeLabel = outs[i].code
		}
		h.metrics.Tasks.WithLabelValues(kind, outcomeLabel).Inc()
		if outs[i].cached {
			h.metrics.CacheHits.Inc()
		}
	}
	if unconfirmed != nil {
		return fmt.Errorf("tasks: finish %d items: %w", len(ts), unconfirmed)
	}
	return nil
}

// endedNow reports whether a record that Store.Finish (or Start) found in
// state prev is one this call moves to its end: it was still pending or
// active, not ended by an earlier delivery or a cancel.
func endedNow(prev apitype.TaskState) bool {
	return prev == apitype.TaskStatePending || prev == apitype.TaskStateActive
}

// ErrorHandler marks the record failed when asynq gives up on a task
// after its last retry, so no record stays "active" forever. It is
// asynq's ErrorHandler hook.
func (h *Handler) ErrorHandler() asynq.ErrorHandlerFunc {
	return func(ctx context.Context, t *asynq.Task, err error) {
		retried, _ := asynq.GetRetryCount(ctx)
		maxR, _ := asynq.GetMaxRetry(ctx)
		if d, ok := IsWait(err); ok && retried < maxR {
			h.log.Debug("expensive task waits for a slot of its key", "type", t.Type(), "wait", d.String())
			return // asynq runs it again after d, counting no retry
		}
		h.log.Warn("task error", "type", t.Type(), "retried", retried, "max_retry", maxR, "err", err)
		if errors.Is(err, ErrNotReplicated) || errors.Is(err, ErrRedisChanged) {
			return // done, but unconfirmed or maybe not kept: asynq runs it again, counting no retry
		}
		if retried < maxR && !errors.Is(err, asynq.SkipRetry) {
			return // asynq retries it
		}
		if t.Type() == tasks.TypeUnit {
			h.failUnit(ctx, t)
			return
		}
		var p tasks.SolvePayload
		if tasks.DecodePayload(t.Payload(), &p) != nil {
			return
		}
		ts := []Transition{{ID: p.ID, Owner: p.Owner, State: apitype.TaskStateFailed, Code: apitype.CodeInternal,
			Msg: "gave up after repeated infrastructure errors"}}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if h.gate != nil {
			if pz, err := puzzle.Decode(p.Request); err == nil && !pz.Cheap() {
				// The tasks that joined this one's solve fail with it:
				// nothing else would end them.
				_, byOwner, ferr := h.gate.FinishSolve(wctx, solveRun(p.Owner, p.Item, pz), ts[0])
				if ferr != nil {
					h.log.Error("mark solve failed after last retry", "type", t.Type(), "err", ferr)
				}
				h.countSolveHistory(withAcceptedAt(ctx, p.At), p.Owner, false, byOwner)
				return
			}
		}
		prev, ferr := h.store.Finish(wctx, ts, nil)
		if ferr != nil {
			h.log.Error("mark failed after last retry", "type", t.Type(), "err", ferr)
		}
		if len(prev) == 1 && endedNow(prev[0]) {
			h.history.Ended(p.Owner, false, 1, p.At)
		}
	}
}
