// Package asynqdata is the one place that knows how asynq keeps its data
// in Redis, for the store's scripts that write it directly instead of
// through asynq.Client (a task recorded and enqueued in one round trip,
// a few hundred units enqueued in one script). It holds asynq's key
// names, the encoding of asynq's task message, and what each of our
// scripts writes of asynq's; an asynq upgrade, or a change of how the
// keys are laid out across a cluster, is checked here and by this
// package's tests, which read everything we write back through
// asynq.Inspector.
//
// What our scripts write of asynq's (asynq v0.26):
//
//   - submitScript (internal/store/scripts.go) enqueues a single task
//     where it records it, as asynq's enqueue script does: HSET
//     TaskKey(queue, id) msg=<Solve's message> state=pending
//     pending_since=<ns>, LPUSH PendingKey(queue) id, SADD QueuesKey
//     queue; nothing when TaskKey exists (a conflicting ID).
//   - enqueueFedScript (internal/store/feed.go) does the same for each fed
//     unit (Unit's message), one LPUSH for all; a unit whose task asynq
//     archived or completed is removed from ArchivedKey or CompletedKey,
//     its hash deleted, and queued afresh; one waiting in any other state
//     is left as it is.
//   - promoteLua (internal/store/solves.go) moves a parked run's task from
//     RetryKey to PendingKey (LPUSH, or RPUSH to run after the others) and
//     sets its hash's state=pending pending_since=<ns>. It builds the
//     keys from QueueKeyPrefix's form in Lua, reads the hash's state and
//     msg, and tells a parked run by the wait message (worker.WaitMessage)
//     that asynq keeps in the message's error_msg field.
//
// What we read of asynq's without asynq (Active, for internal/recovery's
// watchdog): ActiveKey, the list of a queue's running tasks, and
// LeaseKey, the sorted set of each running task's lease. asynq's dequeue
// script (RPOPLPUSH pending active, ZADD lease) gives a task a lease of
// 30 s (its rdb.LeaseDuration) from the dequeuing worker's clock; the
// server that runs it extends it to now + 30 s every 5 s (its
// heartbeater, ZADD XX), and only while it holds it; asynq's recoverer,
// on every worker about once a minute, retries a task whose lease ended
// over 30 s ago. A task is in both or neither, except within one of
// asynq's scripts.
//
// Asynq's keys take no prefix: a Redis shared by deployments shares them.
package asynqdata

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// Asynq's key names (its internal/base: TaskKey, PendingKey, ActiveKey,
// RetryKey, ArchivedKey, CompletedKey, AllQueues). A queue's keys share
// the hash tag {<queue>}, so a queue lives on one Redis Cluster slot.

// QueueKeyPrefix is the prefix of every key of queue's.
func QueueKeyPrefix(queue string) string { return "asynq:{" + queue + "}:" }

// TaskKey is the hash of one task: its message, state and times.
func TaskKey(queue, id string) string { return QueueKeyPrefix(queue) + "t:" + id }

// PendingKey is the list of queue's waiting task IDs. The feeder keeps it
// short and KEDA's trigger reads its length, so both depend on it.
func PendingKey(queue string) string { return QueueKeyPrefix(queue) + "pending" }

// ActiveKey is the list of queue's running task IDs.
func ActiveKey(queue string) string { return QueueKeyPrefix(queue) + "active" }

// LeaseKey is the sorted set of queue's running task IDs, each scored by
// when its lease ends (Unix seconds).
func LeaseKey(queue string) string { return QueueKeyPrefix(queue) + "lease" }

// RetryKey is the sorted set of queue's tasks waiting to be retried.
func RetryKey(queue string) string { return QueueKeyPrefix(queue) + "retry" }

// ArchivedKey is the sorted set of queue's archived tasks.
func ArchivedKey(queue string) string { return QueueKeyPrefix(queue) + "archived" }

// CompletedKey is the sorted set of queue's tasks kept after success.
func CompletedKey(queue string) string { return QueueKeyPrefix(queue) + "completed" }

// QueuesKey is the set of every queue's name.
const QueuesKey = "asynq:queues"

// Enqueued is a task as asynq keeps it in Redis, for a script that
// records a task and enqueues it in one call (the store's submit script)
// instead of asynq.Client's own round trip.
type Enqueued struct {
	// ID is the task's ID, Queue its queue.
	ID, Queue string
	// Msg is asynq's task message, encoded as asynq.Client encodes it.
	Msg []byte
}

// Solve is tasks.NewSolveTaskAt's task in asynq's stored form.
//
// asynq stores a task as a protobuf TaskMessage (its internal/proto, not
// importable). The fields that tasks.NewSolveTask's options set are written
// here, in field order, as proto.Marshal writes them; asynq's other
// fields are zero, which protobuf leaves out. The message must stay
// decodable by the asynq release the workers run: protobuf field numbers
// never change, and TestSolveMatchesAsynq holds the bytes equal
// to asynq.Client's own.
func Solve(id, owner string, p *puzzle.Parsed, queue string, l tasks.Limits, at time.Time) (Enqueued, error) {
	return SolveTraced(id, owner, p, queue, l, at, "", "")
}

// SolveTraced is Solve with the submission's W3C trace context in the
// payload (tasks.SolvePayload's TraceParent and TraceState); with both
// "" it writes Solve's bytes.
func SolveTraced(id, owner string, p *puzzle.Parsed, queue string, l tasks.Limits, at time.Time, traceparent, tracestate string) (Enqueued, error) {
	typ, err := tasks.TypeFor(p.Kind())
	if err != nil {
		return Enqueued{}, err
	}
	payload, err := solvePayload(id, owner, p.Payload(), at.UnixMilli(), traceparent, tracestate)
	if err != nil {
		return Enqueued{}, err
	}
	timeout := int64(l.TaskTimeout(p.Kind()) / time.Second)
	return enqueued(typ, payload, id, queue, timeout), nil
}

// enqueued encodes a task as asynq v0.26's TaskMessage with the fields
// our tasks set (asynq.TaskID, Queue, MaxRetry and Timeout), in field
// order, as proto.Marshal writes them; a zero timeout is left out, as
// protobuf leaves out zero fields.
func enqueued(typ string, payload []byte, id, queue string, timeoutSeconds int64) Enqueued {
	msg := make([]byte, 0, len(payload)+len(typ)+len(id)+len(queue)+24)
	msg = protoBytes(msg, 1, []byte(typ))             // type
	msg = protoBytes(msg, 2, payload)                 // payload
	msg = protoBytes(msg, 3, []byte(id))              // id
	msg = protoBytes(msg, 4, []byte(queue))           // queue
	msg = protoVarint(msg, 5, uint64(tasks.MaxRetry)) // retry
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
func solvePayload(id, owner string, req json.RawMessage, at int64, traceparent, tracestate string) ([]byte, error) {
	if !plainString(id) || !plainString(owner) || rewritesRaw(req) || !plainString(traceparent) || !plainString(tracestate) {
		b, err := json.Marshal(tasks.SolvePayload{Owner: owner, Item: tasks.Item{ID: id, Request: req}, At: at,
			TraceParent: traceparent, TraceState: tracestate})
		if err != nil {
			return nil, fmt.Errorf("asynqdata: encode solve payload: %w", err)
		}
		return b, nil
	}
	b := make([]byte, 0, len(req)+len(id)+len(owner)+56+traceBytes(traceparent, tracestate))
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
	if at != 0 {
		b = append(b, `,"at":`...)
		b = strconv.AppendInt(b, at, 10)
	}
	if traceparent != "" {
		b = append(b, `,"traceparent":"`...)
		b = append(b, traceparent...)
		b = append(b, '"')
	}
	if tracestate != "" {
		b = append(b, `,"tracestate":"`...)
		b = append(b, tracestate...)
		b = append(b, '"')
	}
	return append(b, '}'), nil
}

// traceBytes is what the trace context adds to a payload: 0 without one,
// so that an untraced payload's buffer is sized as before.
func traceBytes(traceparent, tracestate string) int {
	n := 0
	if traceparent != "" {
		n += len(traceparent) + 17
	}
	if tracestate != "" {
		n += len(tracestate) + 16
	}
	return n
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

// Unit is tasks.NewUnitTask's task in asynq's stored form (see
// Solve), for a store script that enqueues many units in one
// call (worker.Feeder's EnqueueFed). TestUnitMatchesAsynq holds the bytes
// equal to asynq.Client's own.
func Unit(r tasks.UnitRef, queue string) (Enqueued, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return Enqueued{}, fmt.Errorf("asynqdata: encode unit payload: %w", err)
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = asynqDefaultTimeout // as asynq.Client sets it
	}
	return enqueued(tasks.TypeUnit, b, r.TaskID(), queue, int64(timeout.Seconds())), nil
}

// asynqDefaultTimeout is the timeout asynq.Client gives a task enqueued
// with neither a timeout nor a deadline (asynq v0.26's defaultTimeout).
const asynqDefaultTimeout = 30 * time.Minute

// ActiveTask is a task asynq lists as running.
type ActiveTask struct {
	Queue, ID string
	// Lease is when its lease ends, in whole seconds by the clock of the
	// worker that took or last extended it; zero when LeaseKey has no
	// entry for it (read between two of asynq's commands).
	Lease time.Time
}

// Active returns the tasks asynq lists as running on queues, each with
// its lease, in one pipelined round trip (LRANGE of ActiveKey and ZRANGE
// of LeaseKey per queue, each queue's two keys on its own cluster slot).
func Active(ctx context.Context, rdb redis.Cmdable, queues ...string) ([]ActiveTask, error) {
	type read struct {
		ids    *redis.StringSliceCmd
		leases *redis.ZSliceCmd
	}
	reads := make([]read, len(queues))
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range queues {
			reads[i] = read{p.LRange(ctx, ActiveKey(q), 0, -1), p.ZRangeWithScores(ctx, LeaseKey(q), 0, -1)}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("asynqdata: read the active tasks of %v: %w", queues, err)
	}
	var out []ActiveTask
	for i, q := range queues {
		leases := make(map[string]time.Time, len(reads[i].leases.Val()))
		for _, z := range reads[i].leases.Val() {
			if id, ok := z.Member.(string); ok {
				leases[id] = time.Unix(int64(z.Score), 0)
			}
		}
		for _, id := range reads[i].ids.Val() {
			out = append(out, ActiveTask{Queue: q, ID: id, Lease: leases[id]})
		}
	}
	return out, nil
}
