// Package tasks is the contract of puzzleq's asynq tasks: the stable type
// strings, the queues, the payloads and the constructors that build them.
// The API enqueues what it defines and the worker (internal/worker) runs
// it; an outside program that enqueues or inspects puzzleq's tasks needs
// only this package, which imports nothing of internal/.
package tasks

import (
	"encoding/json"
	"fmt"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/puzzle"
)

// Task type strings. They are stored in Redis with every queued task, so
// they never change and are never derived from Go type names. The
// single-request types belong to their kinds, in package puzzle.
const (
	TypeSliding = puzzle.TaskTypeSliding
	TypeSweep   = puzzle.TaskTypeSweep
	TypeFill    = puzzle.TaskTypeFill
)

// Queue names. Single submissions go to QueueInteractive so they never
// wait behind a bulk batch. The names contain no '{' or '}', which asynq
// uses for Redis Cluster hash tags.
const (
	QueueInteractive = "interactive"
	QueueBulk        = "bulk"
)

// The cheap lane's queues. Cheap work (puzzle.Parsed.Cheap: sliding
// boards of up to 9 cells, fills) goes here: a single task to QueueCheap,
// a batch's shared unit of a chunk's cheap items to QueueCheapBulk. Every
// worker serves them from an asynq server of its own, on
// CHEAP_CONCURRENCY slots, so that cheap work never waits behind searches
// that hold every solver slot. Singles are served before bulk units, as
// on the solver queues.
const (
	QueueCheap     = "cheap"
	QueueCheapBulk = "cheap-bulk"
)

// Queues lists every queue a worker serves on its solver slots.
var Queues = []string{QueueInteractive, QueueBulk}

// CheapQueues lists every queue a worker serves on its cheap slots.
var CheapQueues = []string{QueueCheap, QueueCheapBulk}

// SingleQueue is the queue a single task of p goes to: the cheap lane's
// when p is cheap, the interactive one otherwise.
func SingleQueue(p *puzzle.Parsed) string {
	if p.Cheap() {
		return QueueCheap
	}
	return QueueInteractive
}

// UnitQueue is the queue a batch unit goes to: a chunk's shared unit
// holds only cheap items (internal/ingest puts every expensive item in a
// unit of its own) and runs in the cheap lane; an item's own unit runs on
// the solver slots.
func UnitQueue(unit string) string {
	if chunk, _, err := ParseUnit(unit); err == nil && chunk {
		return QueueCheapBulk
	}
	return QueueBulk
}

// TypeFor returns the single-task type for a kind. An unknown kind is an
// error wrapping puzzle.ErrUnknownKind, never a default type.
func TypeFor(k puzzle.Kind) (string, error) {
	s, err := puzzle.SpecOf(k)
	if err != nil {
		return "", fmt.Errorf("tasks: %w", err)
	}
	return s.TaskType, nil
}

// Item is one task record's ID with its request.
type Item struct {
	ID      string          `json:"id"`
	Request json.RawMessage `json:"request"`
}

// SolvePayload is the payload of the solve:<kind> tasks: one item.
type SolvePayload struct {
	// Owner is the API key name that submitted the task, so the worker
	// can give back its pending quota when the task ends.
	Owner string `json:"owner,omitempty"`
	Item
	// At is when the API accepted the task, in Unix milliseconds, so that
	// the worker that ends it can record the task's latency in the
	// history (GET /v1/history); 0 when the sender did not set it.
	At int64 `json:"at,omitempty"`
	// TraceParent and TraceState are the W3C trace context of the
	// submission (traceparent and tracestate), so that the worker's spans
	// join the API's trace; "" when the API does not trace. A worker that
	// predates them skips them, as it skips any member it does not know.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// payloadOptions are the decisions a payload is decoded with. Names match
// exactly and a repeated name is an error, as in a request (puzzle's
// strict decoding), so no reader of the same bytes can see another ID or
// batch than the handler does. Unlike a request, a member the payload
// type does not declare is skipped: payloads pass between releases of our
// own processes, and during a rolling upgrade a worker one release behind
// must still run a task whose payload gained a field. Rejecting it would
// drop an accepted task as undecodable.
var payloadOptions = jsonv2.JoinOptions(
	jsonv2.MatchCaseInsensitiveNames(false),
	jsontext.AllowDuplicateNames(false),
	jsonv2.RejectUnknownMembers(false),
)

// DecodePayload decodes a SolvePayload or a UnitRef (see
// payloadOptions). Each item's Request is decoded by puzzle.Decode.
func DecodePayload(data []byte, v any) error { return jsonv2.Unmarshal(data, v, payloadOptions) }

// Limits bound the work of one item of each kind. Retrying cannot help a
// solve that hit one, so hitting it is a final failure. The values come
// from the binaries' configuration, which states every default once;
// tasks uses what it is given and has no defaults of its own.
type Limits struct {
	// Deadline per item of each kind. Every kind needs one: a kind left
	// out has no time at all, so each of its solves fails with timeout.
	Deadline map[puzzle.Kind]time.Duration
	// MaxNodes per item of each kind; 0 leaves the solver's default.
	MaxNodes map[puzzle.Kind]int64
	// DeadlineAttempts is how many deliveries of a task may overrun a
	// Deadline before the item fails with timeout; earlier overruns
	// return ErrDeadlineOverrun, which asynq retries. 0 or 1: the first
	// overrun is final (and so is any overrun outside asynq, where there
	// is no retry).
	DeadlineAttempts int
}

// deadline is the deadline of kind k.
func (l Limits) deadline(k puzzle.Kind) time.Duration { return l.Deadline[k] }

// timeoutMargin is added to the per-item deadline for asynq's own task
// timeout. The handler enforces the item deadline itself, and must win the
// race: asynq treats its own timeout as retryable, ours is final.
const timeoutMargin = 30 * time.Second

// MaxRetry bounds retries of infrastructure errors (Redis unreachable).
const MaxRetry = 10

// MaxDeliveries is the most times asynq delivers one task: the first and
// MaxRetry retries. Limits.DeadlineAttempts cannot exceed it.
const MaxDeliveries = MaxRetry + 1

// TaskTimeout is asynq's timeout for a single task of kind k: the item's
// deadline and timeoutMargin.
func (l Limits) TaskTimeout(k puzzle.Kind) time.Duration { return l.deadline(k) + timeoutMargin }

// NewSolveTask builds the task for one single request, accepted now. id
// is both the record ID and asynq's task ID, so operators can find it in
// asynq's tools.
func NewSolveTask(id, owner string, p *puzzle.Parsed, queue string, l Limits) (*asynq.Task, error) {
	return NewSolveTaskAt(id, owner, p, queue, l, time.Now())
}

// NewSolveTaskAt is NewSolveTask for a request accepted at at.
func NewSolveTaskAt(id, owner string, p *puzzle.Parsed, queue string, l Limits, at time.Time) (*asynq.Task, error) {
	typ, err := TypeFor(p.Kind())
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(SolvePayload{Owner: owner, Item: Item{ID: id, Request: p.Payload()}, At: at.UnixMilli()})
	if err != nil {
		return nil, fmt.Errorf("tasks: encode solve payload: %w", err)
	}
	return asynq.NewTask(typ, b, asynq.TaskID(id), asynq.Queue(queue), asynq.MaxRetry(MaxRetry),
		asynq.Timeout(l.TaskTimeout(p.Kind()))), nil
}
