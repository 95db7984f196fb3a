// Package apitype is the wire contract of puzzleq's HTTP API, version 1:
// the resources the API serves, the states of a task and every error code.
//
// The server (internal/api), the Go client, the record store, the load
// generator and the tests all use these declarations instead of their own
// copies, and a test in internal/api holds every type here against
// openapi.yaml (each schema property has a field with its JSON name, and
// each field a property), so the document and the code cannot drift apart.
//
// Like river's rivertype, it is a leaf: it imports nothing of puzzleq's, so
// any package, inside the module or out, can use it without a cycle.
package apitype

import (
	"encoding/json"
	"time"
)

// TaskState is where a task is in its lifecycle. A task starts pending,
// is active while a worker solves it, and ends completed, failed or
// canceled; an ended task never changes again.
type TaskState string

// The task states.
const (
	// TaskStatePending: accepted and queued, not yet picked up.
	TaskStatePending TaskState = "pending"
	// TaskStateActive: a worker is solving it.
	TaskStateActive TaskState = "active"
	// TaskStateCompleted: solved; the task's result is set.
	TaskStateCompleted TaskState = "completed"
	// TaskStateFailed: it cannot be solved as asked; the task's error says
	// why.
	TaskStateFailed TaskState = "failed"
	// TaskStateCanceled: canceled by request before it ended.
	TaskStateCanceled TaskState = "canceled"
)

// TaskStates returns every task state, in lifecycle order.
func TaskStates() []TaskState {
	return []TaskState{TaskStatePending, TaskStateActive, TaskStateCompleted, TaskStateFailed, TaskStateCanceled}
}

// Terminal reports whether a task in state s has ended for good. It is the
// one definition of "ended" that the server, the store and the clients use.
func (s TaskState) Terminal() bool {
	return s == TaskStateCompleted || s == TaskStateFailed || s == TaskStateCanceled
}

// Task is the task resource: GET /v1/tasks/{id}, and the answer of
// POST /v1/tasks and DELETE /v1/tasks/{id}.
type Task struct {
	// ID is 32 lowercase hex digits for a single task; a batch item's ID
	// is derived from its batch's (see ItemID).
	ID string `json:"id"`
	// CustomID is the caller's name for a batch item, as submitted; null
	// for a single task and for an item submitted without one.
	CustomID *string `json:"custom_id"`
	// Kind is the puzzle kind: sliding, sweep or fill.
	Kind  string    `json:"kind"`
	State TaskState `json:"state"`
	// Result is the solver's answer, whose shape depends on Kind; null
	// until the task completed.
	Result json.RawMessage `json:"result"`
	// Error says why a task failed or was canceled; null otherwise.
	Error *TaskError `json:"error"`
	// Cached is true when the result came from the cache and the task was
	// never queued.
	Cached bool `json:"cached"`
	// BatchID is the batch the task belongs to; null for a single task.
	BatchID     *string    `json:"batch_id"`
	CreatedAt   *time.Time `json:"created_at"`
	StartedAt   *time.Time `json:"started_at"`
	CompletedAt *time.Time `json:"completed_at"`
	// Attempts counts how many times a worker started the task.
	Attempts int `json:"attempts"`
	// Progress is what a long search last reported while it runs; null for
	// everything but sliding boards solved by search.
	Progress *Progress `json:"progress"`
	// Webhook is the completion webhook the task was submitted with and
	// its delivery so far; null when it has none.
	Webhook *Webhook `json:"webhook"`
}

// Terminal reports whether the task has ended.
func (t *Task) Terminal() bool { return t.State.Terminal() }

// TaskPuzzle is what a batch item was asked to solve: GET
// /v1/tasks/{id}/puzzle. It is the item's request in its canonical form
// (the puzzle and every option, defaults included), kept as long as its
// batch; a single task's is not kept once it is queued.
type TaskPuzzle struct {
	ID string `json:"id"`
	// Kind is the puzzle kind: sliding, sweep or fill.
	Kind string `json:"kind"`
	// Puzzle and Options are the kind's, as POST /v1/tasks takes them.
	Puzzle  json.RawMessage `json:"puzzle"`
	Options json.RawMessage `json:"options"`
}

// TaskError says why a task failed or was canceled. Code is one of
// TaskErrorCodes.
type TaskError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Progress is a long search's latest report.
type Progress struct {
	// Bound is the current IDA* bound: a lower bound on the answer's moves.
	Bound int `json:"bound"`
	// Nodes counts the search nodes expanded so far.
	Nodes int64 `json:"nodes"`
}

// Counts are a batch's tasks per state; they add up to the batch's total.
type Counts struct {
	Pending   int `json:"pending"`
	Active    int `json:"active"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	Canceled  int `json:"canceled"`
}

// Of returns the count of state s.
func (c Counts) Of(s TaskState) int {
	switch s {
	case TaskStatePending:
		return c.Pending
	case TaskStateActive:
		return c.Active
	case TaskStateCompleted:
		return c.Completed
	case TaskStateFailed:
		return c.Failed
	case TaskStateCanceled:
		return c.Canceled
	}
	return 0
}

// Ended is the number of tasks in a terminal state.
func (c Counts) Ended() int {
	n := 0
	for _, s := range TaskStates() {
		if s.Terminal() {
			n += c.Of(s)
		}
	}
	return n
}

// Batch is the batch resource, GET /v1/batches/{id}: its counts, whether
// every task has ended, and one page of its tasks in submission order.
type Batch struct {
	ID     string `json:"id"`
	Total  int    `json:"total"`
	Counts Counts `json:"counts"`
	// Done is true when every task has ended.
	Done bool `json:"done"`
	// Format is the judge format the batch was submitted in; null for JSON.
	Format    *string    `json:"format"`
	CreatedAt *time.Time `json:"created_at"`
	DoneAt    *time.Time `json:"done_at"`
	// Tasks is one page of the batch's tasks.
	Tasks []Task `json:"tasks"`
	// NextCursor is the cursor of the next page; null on the last page.
	NextCursor *string `json:"next_cursor"`
	// Webhook is the completion webhook the batch was submitted with and
	// its delivery so far; null when it has none.
	Webhook *Webhook `json:"webhook"`
}

// Webhook is a completion webhook and what its delivery did so far: the
// URL is POSTed a WebhookEvent, signed as the Standard Webhooks
// specification says, once the task or batch has ended, and again with
// backoff until it answers 2xx or the retries run out.
type Webhook struct {
	URL string `json:"url"`
	// Attempts counts the POSTs made so far.
	Attempts int `json:"attempts"`
	// LastStatus is the HTTP status of the last attempt; null before the
	// first, or when the last got no answer (LastError says why).
	LastStatus *int `json:"last_status"`
	// LastError says why the last attempt failed; null when it succeeded
	// or none was made.
	LastError     *string    `json:"last_error"`
	LastAttemptAt *time.Time `json:"last_attempt_at"`
	// DeliveredAt is when an attempt got a 2xx; null until then.
	DeliveredAt *time.Time `json:"delivered_at"`
}

// Webhook event types (WebhookEvent.Type).
const (
	// WebhookBatchDone: every task of a batch has ended; Data is the
	// Batch, without its tasks.
	WebhookBatchDone = "batch.done"
	// WebhookTaskDone: a single task has ended; Data is the Task.
	WebhookTaskDone = "task.done"
)

// WebhookEvent is the body POSTed to a completion webhook. Its headers
// are webhook-id (the same for every attempt of one event),
// webhook-timestamp (the attempt's Unix seconds) and webhook-signature
// ("v1,<base64 HMAC-SHA256 of id.timestamp.body>" under WEBHOOK_SECRET).
type WebhookEvent struct {
	// Type is WebhookBatchDone or WebhookTaskDone.
	Type      string    `json:"type"`
	Timestamp time.Time `json:"timestamp"`
	// Data is the Batch (tasks empty) or the Task, as GET answers it.
	Data json.RawMessage `json:"data"`
}

// BatchProgress is the data of the progress and done events of
// GET /v1/batches/{id}/events.
type BatchProgress struct {
	ID     string     `json:"id"`
	Total  int        `json:"total"`
	Counts Counts     `json:"counts"`
	Done   bool       `json:"done"`
	DoneAt *time.Time `json:"done_at"`
}

// ItemEvent is the data of an item event of GET /v1/batches/{id}/events:
// one task of the batch that has ended, as a ResultLine has it. Result
// is left out of a completed task whose result is over MaxEventResult
// bytes (ResultBytes says how large it is): read it with GET
// /v1/tasks/{id} or /results?from=index.
type ItemEvent struct {
	Index    int             `json:"index"`
	ID       string          `json:"id"`
	CustomID *string         `json:"custom_id"`
	State    TaskState       `json:"state"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    *TaskError      `json:"error,omitempty"`
	// ResultBytes is the size of a completed task's result.
	ResultBytes int64 `json:"result_bytes,omitempty"`
}

// MaxEventResult is the largest result an ItemEvent carries.
const MaxEventResult = 64 << 10

// BatchCreated is the answer of POST /v1/batches.
type BatchCreated struct {
	ID    string `json:"id"`
	Total int    `json:"total"`
	// TaskIDs are the items' IDs in submission order, for a batch of at
	// most MaxListedIDs items; null for a larger one, whose IDs are
	// ItemID(ID, 0) to ItemID(ID, Total-1).
	TaskIDs []string `json:"task_ids"`
}

// MaxListedIDs is the largest batch whose 202 lists its items' IDs.
const MaxListedIDs = 10000

// ResultLine is one line of GET /v1/batches/{id}/results: one item, in
// submission order. Result is set for a completed item and Error for a
// failed or canceled one; an item that has not ended has neither.
type ResultLine struct {
	Index    int             `json:"index"`
	ID       string          `json:"id"`
	CustomID *string         `json:"custom_id"`
	State    TaskState       `json:"state"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    *TaskError      `json:"error,omitempty"`
}

// BatchCanceled is the answer of DELETE /v1/batches/{id}.
type BatchCanceled struct {
	ID string `json:"id"`
	// Canceled counts the tasks this request canceled.
	Canceled int `json:"canceled"`
}

// Status is the answer of /healthz ("ok") and of a ready /readyz
// ("ready").
type Status struct {
	Status string `json:"status"`
}

// ErrorBody is the body of every 4xx and 5xx answer.
type ErrorBody struct {
	Error Error `json:"error"`
}

// Error is what went wrong with a request.
type Error struct {
	// Code is stable, for programs: one of ErrorCodes.
	Code string `json:"code"`
	// Message is for people and may change.
	Message string `json:"message"`
	// Field is the JSON path of the offending input (puzzle.board[2],
	// tasks[17].kind) or the query parameter or header; empty when the
	// error is not about one place.
	Field string `json:"field,omitempty"`
}
