package tasks

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
)

// TypeUnit runs one unit of a batch: the cheap items of one chunk, or one
// expensive item (see docs/batches.md). Its payload is a reference; the
// worker reads the requests from the store, so a queued task is a few
// dozen bytes whatever the puzzles weigh.
const TypeUnit = "solve:unit"

// UnitRef names one unit of a batch.
type UnitRef struct {
	BatchID string `json:"batch_id"`
	// Unit is "c<j>" (the cheap items of chunk j) or "x<i>" (item i alone).
	Unit string `json:"unit"`
	// Timeout is asynq's timeout for the task, fixed when the batch was
	// staged from its items' kinds.
	Timeout time.Duration `json:"-"`
}

// ChunkUnit names the unit of the cheap items of chunk j.
func ChunkUnit(j int) string { return "c" + strconv.Itoa(j) }

// OwnUnit names the unit of item i alone.
func OwnUnit(i int) string { return "x" + strconv.Itoa(i) }

// ParseUnit reads a unit name: chunk is true and n the chunk for "c<j>",
// chunk is false and n the item for "x<i>".
func ParseUnit(u string) (chunk bool, n int, err error) {
	if len(u) < 2 || (u[0] != 'c' && u[0] != 'x') {
		return false, 0, fmt.Errorf("tasks: bad unit %q", u)
	}
	n, err = strconv.Atoi(u[1:])
	if err != nil || n < 0 || strconv.Itoa(n) != u[1:] {
		return false, 0, fmt.Errorf("tasks: bad unit %q", u)
	}
	return u[0] == 'c', n, nil
}

// TaskID is the unit's asynq task ID, fixed so that enqueueing a unit
// twice (the feeder that died and the reconciler after it) makes one task.
func (r UnitRef) TaskID() string { return r.BatchID + ":" + r.Unit }

// Member is the unit as the feed keeps it: "<batch>/<unit>/<timeout ms>".
func (r UnitRef) Member() string {
	return r.BatchID + "/" + r.Unit + "/" + strconv.FormatInt(r.Timeout.Milliseconds(), 10)
}

// ParseMember reads what Member wrote.
func ParseMember(m string) (UnitRef, error) {
	parts := strings.Split(m, "/")
	if len(parts) != 3 {
		return UnitRef{}, fmt.Errorf("tasks: bad feed member %q", m)
	}
	ms, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || ms <= 0 {
		return UnitRef{}, fmt.Errorf("tasks: bad feed member %q", m)
	}
	if _, _, err := ParseUnit(parts[1]); err != nil {
		return UnitRef{}, err
	}
	return UnitRef{BatchID: parts[0], Unit: parts[1], Timeout: time.Duration(ms) * time.Millisecond}, nil
}

// NewUnitTask builds the asynq task of a unit on queue.
func NewUnitTask(r UnitRef, queue string) (*asynq.Task, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("tasks: encode unit payload: %w", err)
	}
	return asynq.NewTask(TypeUnit, b, asynq.TaskID(r.TaskID()), asynq.Queue(queue),
		asynq.MaxRetry(maxRetry), asynq.Timeout(r.Timeout)), nil
}

// NewUnitEnqueued is NewUnitTask's task in asynq's stored form (see
// NewSolveEnqueued), for a store script that enqueues many units in one
// call (Feeder.EnqueueFed). TestNewUnitEnqueuedMatchesAsynq holds the bytes
// equal to asynq.Client's own.
func NewUnitEnqueued(r UnitRef, queue string) (Enqueued, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return Enqueued{}, fmt.Errorf("tasks: encode unit payload: %w", err)
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = asynqDefaultTimeout // as asynq.Client sets it
	}
	return enqueued(TypeUnit, b, r.TaskID(), queue, int64(timeout.Seconds())), nil
}

// asynqDefaultTimeout is the timeout asynq.Client gives a task enqueued
// with neither a timeout nor a deadline (asynq v0.26's defaultTimeout).
const asynqDefaultTimeout = 30 * time.Minute

// PendingListKey is the Redis list asynq keeps a queue's waiting tasks in
// ("asynq:{<queue>}:pending" in asynq v0.26). The feeder keeps it short
// and KEDA's trigger reads its length, so both depend on this one layout.
func PendingListKey(queue string) string { return "asynq:{" + queue + "}:pending" }

// UnitWork is what StartUnit found for a unit: the items that may run.
type UnitWork struct {
	// Owner is the API key that submitted the batch ("" when auth is off).
	Owner string
	// Items are the unit's items without an ended entry, in index order:
	// the ones this delivery must solve. Empty when every item has ended,
	// been canceled, or the batch is gone.
	Items []UnitItem
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
	Feed(ctx context.Context, queue string, depth, max int) ([]UnitRef, error)
	// EnqueueFed puts units that Feed took on queue, in asynq's stored
	// form (NewUnitEnqueued), and acknowledges them in the same step, a
	// few hundred units a round trip. A unit whose task asynq holds
	// already is acknowledged while that task waits to run, queued afresh
	// when asynq archived it, and left unacknowledged while it runs. It
	// returns how many it acknowledged; the rest stay in the feeding set
	// for the reconciler.
	EnqueueFed(ctx context.Context, queue string, refs []UnitRef) (int, error)
}
