// Package tasks defines puzzleq's asynq tasks: the stable type strings,
// the queues, the payloads with their NewXTask constructors, and the
// handler that runs the solvers. cmd/api and cmd/worker only wire it up.
package tasks

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
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
	// TypeChunk carries several cheap items of a batch in one task, so a
	// 10,000-item batch costs a few hundred queue operations, not 10,000.
	TypeChunk = "solve:chunk"
)

// Queue names. Single submissions go to QueueInteractive so they never
// wait behind a bulk batch. The names contain no '{' or '}', which asynq
// uses for Redis Cluster hash tags.
const (
	QueueInteractive = "interactive"
	QueueBulk        = "bulk"
)

// Queues lists every queue a worker must serve.
var Queues = []string{QueueInteractive, QueueBulk}

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
	BatchID string `json:"batch_id,omitempty"`
	// Owner is the API key name that submitted the task, so the worker
	// can give back its pending quota when the task ends.
	Owner string `json:"owner,omitempty"`
	Item
}

// ChunkPayload is the payload of solve:chunk: items of one batch, each
// with its own record and result.
type ChunkPayload struct {
	BatchID string `json:"batch_id"`
	Owner   string `json:"owner,omitempty"`
	Items   []Item `json:"items"`
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

// decodePayload decodes a SolvePayload or ChunkPayload (see
// payloadOptions). Each item's Request is decoded by puzzle.Decode.
func decodePayload(data []byte, v any) error { return jsonv2.Unmarshal(data, v, payloadOptions) }

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
}

// deadline is the deadline of kind k.
func (l Limits) deadline(k puzzle.Kind) time.Duration { return l.Deadline[k] }

// timeoutMargin is added to the per-item deadline for asynq's own task
// timeout. The handler enforces the item deadline itself, and must win the
// race: asynq treats its own timeout as retryable, ours is final.
const timeoutMargin = 30 * time.Second

// maxRetry bounds retries of infrastructure errors (Redis unreachable).
const maxRetry = 10

// Unit is one queued task as the API's outbox keeps it until it is on the
// queue: everything needed to build the asynq task again, byte for byte,
// in another process. Its TaskID is fixed when the unit is made, so
// enqueueing it twice (the API that accepted the batch, and then the
// reconciler that finishes an enqueue a crash interrupted) yields one
// task: asynq answers the second with asynq.ErrTaskIDConflict.
type Unit struct {
	TaskID  string          `json:"id"`
	Type    string          `json:"type"`
	Queue   string          `json:"queue"`
	Timeout time.Duration   `json:"timeout"`
	Payload json.RawMessage `json:"payload"`
}

// unitHeader is a Unit without its payload, for MarshalBinary.
type unitHeader struct {
	TaskID  string        `json:"id"`
	Type    string        `json:"type"`
	Queue   string        `json:"queue"`
	Timeout time.Duration `json:"timeout"`
}

// MarshalBinary encodes the unit as a one-line JSON header, a newline and
// the payload as is: unlike json.Marshal it neither validates nor copies
// the payload through an encoder, which for a batch's units is most of
// the work.
func (u Unit) MarshalBinary() ([]byte, error) {
	h, err := json.Marshal(unitHeader{TaskID: u.TaskID, Type: u.Type, Queue: u.Queue, Timeout: u.Timeout})
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(h)+1+len(u.Payload))
	b = append(append(append(b, h...), '\n'), u.Payload...)
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary encoded.
func (u *Unit) UnmarshalBinary(b []byte) error {
	h, payload, ok := bytes.Cut(b, []byte{'\n'})
	if !ok {
		return fmt.Errorf("tasks: unit without a header line")
	}
	var uh unitHeader
	if err := json.Unmarshal(h, &uh); err != nil {
		return fmt.Errorf("tasks: unit header: %w", err)
	}
	if uh.TaskID == "" || uh.Type == "" || uh.Queue == "" {
		return fmt.Errorf("tasks: unit header without id, type or queue")
	}
	*u = Unit{TaskID: uh.TaskID, Type: uh.Type, Queue: uh.Queue, Timeout: uh.Timeout, Payload: payload}
	return nil
}

// Task builds the asynq task of the unit.
func (u Unit) Task() *asynq.Task {
	return asynq.NewTask(u.Type, u.Payload,
		asynq.TaskID(u.TaskID), asynq.Queue(u.Queue), asynq.MaxRetry(maxRetry), asynq.Timeout(u.Timeout))
}

// ChunkTaskID is the asynq task ID of a batch's chunk number index:
// derived, so that any process can enqueue a chunk again without making
// a second task. It cannot collide with a record ID, which has no '-'.
func ChunkTaskID(batchID string, index int) string {
	return batchID + "-" + strconv.Itoa(index)
}

// NewSolveUnit builds the unit for one request. id is both the record ID
// and asynq's task ID, so operators can find it in asynq's tools.
func NewSolveUnit(id, batchID, owner string, p *puzzle.Parsed, queue string, l Limits) (Unit, error) {
	typ, err := TypeFor(p.Kind())
	if err != nil {
		return Unit{}, err
	}
	b, err := json.Marshal(SolvePayload{BatchID: batchID, Owner: owner, Item: Item{ID: id, Request: p.Payload()}})
	if err != nil {
		return Unit{}, fmt.Errorf("tasks: encode solve payload: %w", err)
	}
	return Unit{TaskID: id, Type: typ, Queue: queue,
		Timeout: l.deadline(p.Kind()) + timeoutMargin, Payload: b}, nil
}

// NewSolveTask builds the task for one request (see NewSolveUnit).
func NewSolveTask(id, batchID, owner string, p *puzzle.Parsed, queue string, l Limits) (*asynq.Task, error) {
	u, err := NewSolveUnit(id, batchID, owner, p, queue, l)
	if err != nil {
		return nil, err
	}
	return u.Task(), nil
}

// NewChunkUnit builds the unit for several cheap items of a batch, the
// index-th chunk of it (see ChunkTaskID).
func NewChunkUnit(batchID, owner string, index int, ids []string, reqs []*puzzle.Parsed, queue string, l Limits) (Unit, error) {
	cp := ChunkPayload{BatchID: batchID, Owner: owner, Items: make([]Item, len(ids))}
	var total time.Duration
	for i, id := range ids {
		if _, err := TypeFor(reqs[i].Kind()); err != nil {
			return Unit{}, err
		}
		cp.Items[i] = Item{ID: id, Request: reqs[i].Payload()}
		// Chunks hold only cheap items (see puzzle.Parsed.Cheap); a kind's deadline is
		// sized for its hardest boards, which never ride in a chunk.
		total += min(l.deadline(reqs[i].Kind()), time.Minute)
	}
	b, err := json.Marshal(cp)
	if err != nil {
		return Unit{}, fmt.Errorf("tasks: encode chunk payload: %w", err)
	}
	return Unit{TaskID: ChunkTaskID(batchID, index), Type: TypeChunk, Queue: queue,
		Timeout: total + timeoutMargin, Payload: b}, nil
}

// NewChunkTask builds one task for several cheap items of a batch, as
// chunk 0 of it (see NewChunkUnit).
func NewChunkTask(batchID, owner string, ids []string, reqs []*puzzle.Parsed, queue string, l Limits) (*asynq.Task, error) {
	u, err := NewChunkUnit(batchID, owner, 0, ids, reqs, queue, l)
	if err != nil {
		return nil, err
	}
	return u.Task(), nil
}
