// Package tasks defines puzzleq's asynq tasks: the stable type strings,
// the queues, the payloads with their NewXTask constructors, and the
// handler that runs the solvers. cmd/api and cmd/worker only wire it up.
package tasks

import (
	"encoding/binary"
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
	// Owner is the API key name that submitted the task, so the worker
	// can give back its pending quota when the task ends.
	Owner string `json:"owner,omitempty"`
	Item
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

// decodePayload decodes a SolvePayload or a UnitRef (see
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

// maxRetry bounds retries of infrastructure errors (Redis unreachable).
const maxRetry = 10

// MaxDeliveries is the most times asynq delivers one task: the first and
// maxRetry retries. Limits.DeadlineAttempts cannot exceed it.
const MaxDeliveries = maxRetry + 1

// NewSolveTask builds the task for one single request. id is both the
// record ID and asynq's task ID, so operators can find it in asynq's
// tools.
func NewSolveTask(id, owner string, p *puzzle.Parsed, queue string, l Limits) (*asynq.Task, error) {
	typ, err := TypeFor(p.Kind())
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(SolvePayload{Owner: owner, Item: Item{ID: id, Request: p.Payload()}})
	if err != nil {
		return nil, fmt.Errorf("tasks: encode solve payload: %w", err)
	}
	return asynq.NewTask(typ, b, asynq.TaskID(id), asynq.Queue(queue), asynq.MaxRetry(maxRetry),
		asynq.Timeout(l.deadline(p.Kind())+timeoutMargin)), nil
}

// Enqueued is a task as asynq keeps it in Redis, for a script that
// records a task and enqueues it in one call (the store's submit script)
// instead of asynq.Client's own round trip.
type Enqueued struct {
	// ID is the task's ID, Queue its queue.
	ID, Queue string
	// Msg is asynq's task message, encoded as asynq.Client encodes it.
	Msg []byte
}

// NewSolveEnqueued is NewSolveTask's task in asynq's stored form.
//
// asynq stores a task as a protobuf TaskMessage (its internal/proto, not
// importable). The fields that NewSolveTask's options set are written
// here, in field order, as proto.Marshal writes them; asynq's other
// fields are zero, which protobuf leaves out. The message must stay
// decodable by the asynq release the workers run: protobuf field numbers
// never change, and TestNewSolveEnqueuedMatchesAsynq holds the bytes equal
// to asynq.Client's own.
func NewSolveEnqueued(id, owner string, p *puzzle.Parsed, queue string, l Limits) (Enqueued, error) {
	typ, err := TypeFor(p.Kind())
	if err != nil {
		return Enqueued{}, err
	}
	payload, err := solvePayload(id, owner, p.Payload())
	if err != nil {
		return Enqueued{}, err
	}
	timeout := int64((l.deadline(p.Kind()) + timeoutMargin) / time.Second)
	return enqueued(typ, payload, id, queue, timeout), nil
}

// enqueued encodes a task as asynq v0.26's TaskMessage with the fields
// our tasks set (asynq.TaskID, Queue, MaxRetry and Timeout), in field
// order, as proto.Marshal writes them; a zero timeout is left out, as
// protobuf leaves out zero fields.
func enqueued(typ string, payload []byte, id, queue string, timeoutSeconds int64) Enqueued {
	msg := make([]byte, 0, len(payload)+len(typ)+len(id)+len(queue)+24)
	msg = protoBytes(msg, 1, []byte(typ))   // type
	msg = protoBytes(msg, 2, payload)       // payload
	msg = protoBytes(msg, 3, []byte(id))    // id
	msg = protoBytes(msg, 4, []byte(queue)) // queue
	msg = protoVarint(msg, 5, maxRetry)     // retry
	if timeoutSeconds > 0 {
		msg = protoVarint(msg, 8, uint64(timeoutSeconds)) // timeout
	}
	return Enqueued{ID: id, Queue: queue, Msg: msg}
}

// protoBytes appends a protobuf length-delimited field (wire type 2).
func protoBytes(b []byte, field uint64, v []byte) []byte {
	if len(v) == 0 {
		return b // proto3 leaves empty fields out
	}
	b = binary.AppendUvarint(b, field<<3|2)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// protoVarint appends a protobuf varint field (wire type 0).
func protoVarint(b []byte, field, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = binary.AppendUvarint(b, field<<3)
	return binary.AppendUvarint(b, v)
}

// solvePayload is json.Marshal of the SolvePayload, byte for byte, built
// without reflection and without rescanning the request, which puzzle
// has already written compact: this runs on every single submission,
// cache hits included. Anything json.Marshal would escape differently
// (HTML characters, U+2028 and U+2029, which start with 0xE2) takes
// json.Marshal itself.
func solvePayload(id, owner string, req json.RawMessage) ([]byte, error) {
	if !plainString(id) || !plainString(owner) || rewritesRaw(req) {
		b, err := json.Marshal(SolvePayload{Owner: owner, Item: Item{ID: id, Request: req}})
		if err != nil {
			return nil, fmt.Errorf("tasks: encode solve payload: %w", err)
		}
		return b, nil
	}
	b := make([]byte, 0, len(req)+len(id)+len(owner)+32)
	b = append(b, '{')
	if owner != "" {
		b = append(b, `"owner":"`...)
		b = append(b, owner...)
		b = append(b, `",`...)
	}
	b = append(b, `"id":"`...)
	b = append(b, id...)
	b = append(b, `","request":`...)
	b = append(b, req...)
	return append(b, '}'), nil
}

// plainString reports whether json.Marshal writes s as itself between
// quotes: printable ASCII without quotes, backslashes or HTML characters
// (U+2028 and U+2029 are not ASCII).
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// rewritesRaw reports whether json.Marshal would rewrite a compact raw
// message: HTML characters, and U+2028 and U+2029, which start with
// 0xE2. One pass over the bytes: bytes.ContainsAny with 0xE2 in its set,
// not a valid rune, decoded the request rune by rune (5% of the API's
// own CPU on a cache hit).
func rewritesRaw(req []byte) bool {
	for _, c := range req {
		switch c {
		case '<', '>', '&', 0xe2:
			return true
		}
	}
	return false
}
