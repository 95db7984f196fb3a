package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/attribute"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/tracing"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// UnitWork is what StartUnit found for a unit: the items that may run.
type UnitWork struct {
	// Owner is the API key that submitted the batch ("" when auth is off).
	Owner string
	// Items are the unit's items without an ended entry, in index order:
	// the ones this delivery must solve. Empty when every item has ended,
	// been canceled, or the batch is gone.
	Items []UnitItem
	// Ended is the request of an own unit's item that has ended or been
	// canceled (Items is then empty), so that the delivery can leave the
	// parked set of the solve it may have waited for; nil otherwise.
	Ended []byte
	// Mark is the store's note of how this delivery started the unit,
	// for FinishUnit, which the handler hands it to unread. It lets the
	// store write the first outcomes of a chunk by its cheaper path; ""
	// when there is none.
	Mark string
}

// UnitItem is one item of a unit to solve.
type UnitItem struct {
	// Index is the item's index in its batch (apitype.ItemID names it).
	Index int
	// Request is the item's canonical request, for puzzle.Decode.
	Request []byte
}

// ItemOutcome is how one item of a unit ended, for FinishUnit.
type ItemOutcome struct {
	Index int
	// State is completed or failed.
	State apitype.TaskState
	// Result is a completed item's answer.
	Result json.RawMessage
	// CacheKey, for a completed expensive item, is the cache key its
	// result is kept under: the store writes the result there once and
	// the item refers to it. "" for cheap items, which are not cached.
	CacheKey string
	// Cached is true when Result came from the cache.
	Cached bool
	// Code and Msg say why a failed item failed (an apitype task error
	// code).
	Code, Msg string
}

// Feeder moves a batch's waiting units onto the bulk queue, a few at a
// time (see docs/batches.md). Workers feed when they finish a unit, so the
// queue never runs dry while a batch waits; *store.Store satisfies it.
type Feeder interface {
	// Feed takes up to max units from the feed, in fair order, while
	// queue's pending list is shorter than depth, and marks them as being
	// enqueued.
	Feed(ctx context.Context, queue string, depth, max int) ([]tasks.UnitRef, error)
	// EnqueueFed puts units that Feed took on queue, in asynq's stored
	// form (asynqdata.Unit), and acknowledges them in the same step, a
	// few hundred units a round trip. A unit whose task asynq holds
	// already is acknowledged while that task waits to run, queued afresh
	// when asynq archived it, and left unacknowledged while it runs. It
	// returns how many it acknowledged; the rest stay in the feeding set
	// for the reconciler.
	EnqueueFed(ctx context.Context, queue string, refs []tasks.UnitRef) (int, error)
}

// feedConfig is how a Handler refills the bulk queue after a unit.
type feedConfig struct {
	feeder Feeder
	depth  int
}

// feedMax bounds the units one feed after a unit moves. Each finished
// unit takes one off the queue, so a few per finish keep it full, while
// one worker's feed stays a short script and a few enqueues.
const feedMax = 8

// feedTimeout bounds the feed after a unit. The unit is done by then, so
// a slow feed only delays its acknowledgement; the reconciler feeds too.
const feedTimeout = 5 * time.Second

// writeTimeout bounds the writes of outcomes that must happen even when
// the task's context has just ended: they are done work.
const writeTimeout = 10 * time.Second

// SetFeed makes h feed the bulk queue after every unit it finishes:
// units move from f onto the queue while it holds fewer than depth
// waiting tasks (FEED_DEPTH). Without it the handler does not feed, and
// the queue is refilled only by the API and its reconciler. Call it
// before the handler serves tasks.
func (h *Handler) SetFeed(f Feeder, depth int) {
	h.feed = &feedConfig{feeder: f, depth: depth}
}

// SetWriteInterval sets how long finished items of a running unit (or of
// a single task's) wait before they are written; the binaries set it
// from UNIT_WRITE_INTERVAL.
func (h *Handler) SetWriteInterval(d time.Duration) { h.flushEvery = d }

// FeedQueue takes up to max units from f while queue holds fewer than
// depth waiting tasks, and enqueues and acknowledges them (EnqueueFed). A
// unit it did not acknowledge stays in the feeding set, and the
// reconciler enqueues it again. It returns how many it acknowledged.
func FeedQueue(ctx context.Context, f Feeder, queue string, depth, max int) (int, error) {
	refs, err := f.Feed(ctx, queue, depth, max)
	return enqueueFed(ctx, f, queue, refs, err)
}

// LowWaterFeeder is a Feeder that can also feed only once the queue has
// drained below a low-water mark; *store.Store satisfies it. A worker
// with one feeds in batches (see feedAfterUnit).
type LowWaterFeeder interface {
	Feeder
	// FeedBelow is Feed that takes nothing while queue's pending list
	// holds low tasks or more.
	FeedBelow(ctx context.Context, queue string, low, depth, max int) ([]tasks.UnitRef, error)
}

// enqueueFed enqueues and acknowledges the units a feed took (see
// FeedQueue); err is the feed's.
func enqueueFed(ctx context.Context, f Feeder, queue string, refs []tasks.UnitRef, err error) (int, error) {
	if err != nil {
		return 0, fmt.Errorf("tasks: feed %s: %w", queue, err)
	}
	if len(refs) == 0 {
		return 0, nil
	}
	n, err := f.EnqueueFed(ctx, queue, refs)
	if err != nil {
		return n, fmt.Errorf("tasks: enqueue %d fed units: %w", len(refs), err)
	}
	return n, nil
}

// decodeUnitRef decodes a unit task's payload (see payloadOptions) and
// checks that it names a unit.
func decodeUnitRef(data []byte) (tasks.UnitRef, error) {
	var r tasks.UnitRef
	if err := tasks.DecodePayload(data, &r); err != nil {
		return r, err
	}
	if r.BatchID == "" {
		return r, errors.New("no batch_id")
	}
	if _, _, err := tasks.ParseUnit(r.Unit); err != nil {
		return r, err
	}
	return r, nil
}

// unitItem is one item of a unit being run.
type unitItem struct {
	index  int
	id     string          // apitype.ItemID: the name cancels and progress use
	ctx    context.Context // canceled when a client cancels the item
	parsed *puzzle.Parsed  // nil when the request did not decode
	// cacheKey is where a completed result is kept once: set for an own
	// unit's expensive item, "" for cheap items, which are not cached.
	cacheKey string
	out      *outcome
}

// processUnit runs one unit of a batch. Every step is idempotent, so a
// redelivered unit is harmless: StartUnit returns only the items that
// have not ended, and FinishUnit writes and counts an item only once.
func (h *Handler) processUnit(ctx context.Context, ref tasks.UnitRef) error {
	chunk, n, _ := tasks.ParseUnit(ref.Unit) // checked by decodeUnitRef
	registered := map[int]context.Context{}
	var releases []func()
	defer func() {
		for _, r := range releases {
			r()
		}
	}()
	register := func(i int) context.Context {
		if c, ok := registered[i]; ok {
			return c
		}
		c, cancel := context.WithCancel(ctx)
		release := h.cancels.register(apitype.ItemID(ref.BatchID, i), cancel)
		registered[i] = c
		releases = append(releases, func() { release(); cancel() })
		return c
	}
	// An own unit's item is known before the store is read: register it
	// for cancellation first, so that a cancel landing between the two
	// does not leave a long search running. A chunk's items are known
	// only from StartUnit; a cancel that lands before they are registered
	// costs one cheap solve, whose outcome FinishUnit then drops, since
	// the canceled item has its entry already.
	if !chunk {
		register(n)
	}
	w, err := h.store.StartUnit(ctx, ref)
	if err != nil {
		return fmt.Errorf("tasks: start unit %s: %w", ref.TaskID(), err)
	}

	items := make([]unitItem, len(w.Items))
	for i, wi := range w.Items {
		it := &items[i]
		it.index, it.id, it.ctx = wi.Index, apitype.ItemID(ref.BatchID, wi.Index), ctx
		// The request is our own Payload, validated by the API; decoding
		// it again holds bytes that changed in Redis to the same rules
		// (Decode takes a canonical sliding payload by its fast path).
		p, err := puzzle.Decode(wi.Request)
		if err != nil {
			it.out = &outcome{code: apitype.CodeInvalidPuzzle, msg: err.Error()}
			continue
		}
		it.parsed = p
		// A table lookup ends within microseconds of starting: a cancel
		// could not stop it, and FinishUnit drops its outcome when the
		// item was canceled meanwhile, so it is not registered (a
		// context and a map entry per item were a tenth of its cost).
		if !chunk || !h.instant(p) {
			it.ctx = register(wi.Index)
		}
		if chunk || p.Cheap() {
			continue // solved faster than a cache entry is read (docs/batches.md)
		}
		// An identical search may have been solved since the batch was
		// accepted, by another batch or a single task: never run it twice.
		it.cacheKey = p.Key()
		hit, err := h.store.Cached(ctx, it.cacheKey)
		if err != nil {
			return fmt.Errorf("tasks: cache lookup for item %s: %w", it.id, err)
		}
		if hit != nil {
			it.out = &outcome{result: hit, cached: true}
		}
	}

	// An own unit's expensive item that must be searched holds one of
	// its owner's slots while it runs, as an expensive single task does
	// (one key's batch of hard boards cannot take every slot), and waits
	// for an identical solve in flight rather than run it twice. One that
	// needs no search after all (ended, canceled or cached while it was
	// parked) hands on the slot it may have been promoted into.
	if !chunk && h.gate != nil {
		if len(items) == 1 && items[0].out == nil && items[0].cacheKey != "" {
			release, hit, err := h.takeSlot(ctx, ref, w.Owner, &items[0])
			if err != nil {
				return err
			}
			if hit != nil {
				items[0].out = &outcome{result: hit, cached: true}
			} else {
				defer release()
			}
		} else if len(items) == 0 || items[0].cacheKey != "" {
			// Ended or canceled, or cached (it may have waited for the
			// solve that cached it: PassSlot then brings more of the
			// items still waiting for it). A cheap own item (a large
			// fill) is never gated, so it has nothing to hand on.
			solve, cacheKey := "", ""
			if len(items) == 1 {
				solve, cacheKey = solveKey(items[0].parsed, items[0].cacheKey), items[0].cacheKey
			} else if p, err := puzzle.Decode(w.Ended); err == nil && !p.Cheap() {
				// An earlier delivery of this item may still be in the
				// solve's parked set (its worker died before asynq moved
				// it to the retry set, so no promotion took it out).
				solve, cacheKey = solveKey(p, p.Key()), p.Key()
			}
			h.passSlot(ctx, w.Owner, apitype.ItemID(ref.BatchID, n), solve, cacheKey)
		}
	}

	var (
		done      []int // items solved and not yet written
		lastFlush = time.Now()
		// mark goes with the first write only: after it the unit's
		// hash holds entries, which the store's cheaper path is not for.
		mark = w.Mark
	)
	flush := func() error {
		if len(done) == 0 {
			return nil
		}
		if err := h.finishUnit(ctx, ref, w.Owner, mark, items, done); err != nil {
			return err
		}
		done, lastFlush, mark = done[:0], time.Now(), ""
		return nil
	}
	for i := range items {
		it := &items[i]
		if it.out == nil {
			if chunk {
				// A chunk's hundreds of table lookups get no span each.
				it.out = h.solve(ctx, it.ctx, it.id, it.parsed)
			} else {
				it.out = h.tracedSolve(ctx, it.ctx, it.id, it.parsed)
			}
		}
		if it.out.overrun && ctx.Err() == nil && !h.lastDeadlineAttempt(ctx) {
			// Not this item's failure: write what is done, and let asynq
			// deliver the unit again for the rest.
			if err := flush(); err != nil {
				return err
			}
			return fmt.Errorf("tasks: unit %s item %s: %w", ref.TaskID(), it.id, ErrDeadlineOverrun)
		}
		if !it.out.skip {
			done = append(done, i)
		}
		if ctx.Err() != nil {
			// Shutdown or a lost lease: write what is done, and let asynq
			// requeue the unit; the redelivery skips the ended items.
			if err := flush(); err != nil {
				return err
			}
			return fmt.Errorf("tasks: unit %s interrupted: %w", ref.TaskID(), ctx.Err())
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
	h.feedAfterUnit(ctx, ref)
	return nil
}

// inlineResultMax is the largest result an item's entry holds inline. A
// larger one (a 1000x1000 fill's is 4 MB) is written once to the result
// cache under its puzzle's key and the entry refers to it, as for a
// search: the entry stays a head of a few hundred bytes, which readers
// read with the states, and the result is sized (STRLEN) and read (GET)
// with plain commands. Inline, its head could only be had by copying the
// whole entry into a Lua script: 40 /results downloads of such fills at
// once made Redis copy 480 MB, and every client's calls timed out.
const inlineResultMax = 64 << 10

// finishUnit writes the outcomes of items idx in one round trip and
// counts the ones this call ended.
func (h *Handler) finishUnit(ctx context.Context, ref tasks.UnitRef, owner, mark string, items []unitItem, idx []int) error {
	outs := make([]ItemOutcome, len(idx))
	for j, i := range idx {
		it := &items[i]
		if it.out.code == "" {
			key := it.cacheKey
			if key == "" && len(it.out.result) > inlineResultMax && it.parsed != nil {
				key = it.parsed.Key()
			}
			outs[j] = ItemOutcome{Index: it.index, State: apitype.TaskStateCompleted, Result: it.out.result,
				CacheKey: key, Cached: it.out.cached}
		} else {
			outs[j] = ItemOutcome{Index: it.index, State: apitype.TaskStateFailed, Code: it.out.code, Msg: it.out.msg}
		}
	}
	// The outcomes must be written even if the task's ctx just ended:
	// they are done work. A short detached context bounds the write.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	wctx, span := tracing.Start(wctx, h.tracer, "unit.write")
	ended, err := h.store.FinishUnit(wctx, ref, mark, outs)
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("puzzleq.items", len(outs)))
		tracing.Fail(span, err)
	}
	span.End()
	if err != nil {
		return fmt.Errorf("tasks: finish %d items of unit %s: %w", len(outs), ref.TaskID(), err)
	}
	// The store says how many items this call ended, not which. All of
	// them, unless a duplicate delivery or a cancel raced this write; in
	// that rare case the first ones are counted, so that the totals stay
	// right and at most a kind or outcome label is off. Counts are added
	// per label pair, not per item: a chunk has one or two pairs.
	type labels struct{ kind, outcome string }
	var (
		counts          = map[labels]int{}
		hits, completed int
	)
	counted := idx[:min(ended, len(idx))]
	for _, i := range counted {
		it := &items[i]
		if it.out.code == "" {
			completed++
		}
		if h.metrics == nil {
			continue
		}
		l := labels{"unknown", string(apitype.TaskStateCompleted)}
		if it.parsed != nil {
			l.kind = string(it.parsed.Kind())
		}
		if it.out.code != "" {
			l.outcome = it.out.code
		}
		counts[l]++
		if it.out.cached {
			hits++
		}
	}
	h.history.Ended(owner, true, completed, 0)
	h.history.Ended(owner, false, len(counted)-completed, 0)
	if h.metrics == nil {
		return nil
	}
	for l, n := range counts {
		h.metrics.Tasks.WithLabelValues(l.kind, l.outcome).Add(float64(n))
	}
	if hits > 0 {
		h.metrics.CacheHits.Add(float64(hits))
	}
	return nil
}

// instant reports whether p is solved by a table lookup (sliding boards
// of up to 9 cells, see sliding.Solve): it never polls its context, so
// neither a deadline nor a cancel can stop it once it started.
func instant(p *puzzle.Parsed) bool {
	return p.Kind() == puzzle.KindSliding && p.Cells() <= 9
}

// feedAfterUnit refills the bulk queues from the feeds when the handler
// feeds (SetFeed): the queue of the unit's lane first, then the other
// lane's, since a feed that moves a batch's next window of units fills
// both feeds (a mixed batch's cheap units and its own units). Its failure
// does not fail the unit, which is done: the reconciler feeds too, and
// re-enqueues what a failed feed left taken.
func (h *Handler) feedAfterUnit(ctx context.Context, ref tasks.UnitRef) {
	if h.feed == nil {
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), feedTimeout)
	defer cancel()
	queues := []string{tasks.QueueBulk, tasks.QueueCheapBulk}
	if tasks.UnitQueue(ref.Unit) == tasks.QueueCheapBulk {
		queues[0], queues[1] = queues[1], queues[0]
	}
	for _, q := range queues {
		var (
			n   int
			err error
		)
		if lf, ok := h.feed.feeder.(LowWaterFeeder); ok {
			// Feed once the queue is down to half of FEED_DEPTH, and then
			// up to it: a feed, its enqueues and one acknowledgement every
			// depth/2 units rather than all three after every unit. Half
			// a queue still waits for the workers while this one feeds.
			low := (h.feed.depth + 1) / 2
			refs, ferr := lf.FeedBelow(fctx, q, low, h.feed.depth, max(feedMax, h.feed.depth-low+1))
			n, err = enqueueFed(fctx, lf, q, refs, ferr)
		} else {
			n, err = FeedQueue(fctx, h.feed.feeder, q, h.feed.depth, feedMax)
		}
		if err != nil {
			h.log.Warn("feed after unit failed", "unit", ref.TaskID(), "queue", q, "landed", n, "err", err)
		}
	}
}

// failUnit fails the items of a unit that have not ended, when asynq
// gives up on the unit after its last retry, so that none stays active
// and the batch can end.
func (h *Handler) failUnit(ctx context.Context, t *asynq.Task) {
	ref, err := decodeUnitRef(t.Payload())
	if err != nil {
		return // no unit to fail: the payload names none
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	// StartUnit is the store's read of what is left of a unit. It also
	// counts an attempt, which this last look is not, but the store has
	// no other read of a unit's open items.
	w, err := h.store.StartUnit(wctx, ref)
	if err != nil {
		h.log.Error("read unit after last retry", "unit", ref.TaskID(), "err", err)
		return
	}
	if len(w.Items) == 0 {
		return
	}
	outs := make([]ItemOutcome, len(w.Items))
	for i, it := range w.Items {
		outs[i] = ItemOutcome{Index: it.Index, State: apitype.TaskStateFailed, Code: apitype.CodeInternal,
			Msg: "gave up after repeated infrastructure errors"}
	}
	ended, err := h.store.FinishUnit(wctx, ref, w.Mark, outs)
	if err != nil {
		h.log.Error("mark unit failed after last retry", "unit", ref.TaskID(), "items", len(outs), "err", err)
	}
	h.history.Ended(w.Owner, false, ended, 0)
}
