package apitype

import "time"

// The resources of the list routes (GET /v1/batches, GET /v1/tasks,
// GET /v1/batches/{id}/items), of POST /v1/batches/{id}/retry and of
// GET /v1/status. They are kept flat and small on purpose: the dashboard
// and scripts read them as they are.

// BatchSummary is one batch of GET /v1/batches: the batch without its
// page of tasks, with its state and the kinds of its items.
type BatchSummary struct {
	ID string `json:"id"`
	// State is BatchStateOf(Counts, Total, canceled): pending, active,
	// completed, failed or canceled.
	State  TaskState `json:"state"`
	Total  int       `json:"total"`
	Counts Counts    `json:"counts"`
	// Done is true when every task has ended.
	Done bool `json:"done"`
	// Kinds are the puzzle kinds of the batch's items, sorted.
	Kinds []string `json:"kinds"`
	// Format is the judge format the batch was submitted in; null for JSON.
	Format    *string    `json:"format"`
	CreatedAt *time.Time `json:"created_at"`
	DoneAt    *time.Time `json:"done_at"`
}

// BatchStateOf is the one state a batch is listed under, for the state
// filter of GET /v1/batches: canceled when it was canceled (and not
// retried since), else, while items have not ended, pending (none has
// started or ended) or active; once done, completed when every item
// completed and failed when any did not.
func BatchStateOf(c Counts, total int, canceled bool) TaskState {
	switch {
	case canceled:
		return TaskStateCanceled
	case c.Ended() < total && c.Active == 0 && c.Ended() == 0:
		return TaskStatePending
	case c.Ended() < total:
		return TaskStateActive
	case c.Completed == total:
		return TaskStateCompleted
	}
	return TaskStateFailed
}

// BatchList is the answer of GET /v1/batches: the caller's batches,
// newest first.
type BatchList struct {
	Batches []BatchSummary `json:"batches"`
	// NextCursor is the cursor of the next page; null on the last page.
	// A page may hold fewer than the limit (even none) when a filter
	// skipped many batches; only a null cursor ends the list.
	NextCursor *string `json:"next_cursor"`
}

// TaskList is the answer of GET /v1/tasks (the caller's single tasks,
// newest first) and of GET /v1/batches/{id}/items (a batch's items, in
// submission order).
type TaskList struct {
	Tasks []Task `json:"tasks"`
	// NextCursor is the cursor of the next page; null on the last page.
	// As for BatchList, a filtered page may be short.
	NextCursor *string `json:"next_cursor"`
}

// BatchRetried is the answer of POST /v1/batches/{id}/retry.
type BatchRetried struct {
	ID string `json:"id"`
	// Retried counts the failed and canceled tasks this request queued
	// again.
	Retried int `json:"retried"`
	// Complete is false when the retry was cut short (Redis failed, or it
	// ran out of time) after it had queued Retried tasks again: those run,
	// and another retry re-opens the rest (a task is never re-opened
	// twice). Retried is then a lower bound: the call that failed may
	// have re-opened its chunk before its answer was lost. It is true
	// when every task there was to retry was reached.
	Complete bool `json:"complete"`
}

// ServiceStatus is the answer of GET /v1/status: whether any worker is
// alive, how many slots they have, and how much work waits.
type ServiceStatus struct {
	// WorkersAlive counts the worker processes whose heartbeat is fresh
	// and that take tasks (not draining).
	WorkersAlive int `json:"workers_alive"`
	// Slots is the tasks those workers can run at once; Busy how many
	// they run now.
	Slots int `json:"slots"`
	Busy  int `json:"busy"`
	// Workers are the live worker processes, draining ones included.
	Workers []WorkerStatus `json:"workers"`
	// Queues are the queues' depths.
	Queues []QueueStatus `json:"queues"`
	// BacklogUnits is about how many batch units wait in the fair feed,
	// not yet on the bulk queue (counted in buckets of 50, rounded up).
	BacklogUnits int `json:"backlog_units"`
	// OldestPendingSeconds is how long the oldest waiting work has
	// waited: the oldest task pending or waiting for a slot on a queue
	// (QueueStatus.OldestPendingSeconds), or the oldest batch with units
	// still in the feed; 0 when nothing waits.
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
}

// WorkerStatus is one live worker process, as its last heartbeat
// (HEARTBEAT_INTERVAL) described it. Its host and process are not told:
// /v1/status is a tenant's route, and where the workers run is the
// operator's business (the worker logs them beside its ID when it
// starts, and the operator dashboard lists them).
type WorkerStatus struct {
	// ID is the worker's name, new with each start: the worker_id of
	// every line it logs.
	ID string `json:"id"`
	// Slots is its concurrency; Busy the tasks it runs now.
	Slots     int        `json:"slots"`
	Busy      int        `json:"busy"`
	StartedAt *time.Time `json:"started_at"`
	// Running counts the tasks it runs on its solver slots by type
	// (solve:sliding, solve:unit, ...).
	Running map[string]int `json:"running"`
	// Draining is true once it is shutting down: it takes no new task,
	// finishes those it runs and leaves. ServiceStatus's totals leave it
	// out.
	Draining bool `json:"draining"`
}

// QueueStatus is one queue's depth.
type QueueStatus struct {
	Name string `json:"name"`
	// Pending tasks wait for a worker; Active ones run; Waiting ones are
	// expensive runs parked until a solver slot goes to them (their key
	// holds its fair share, or every slot is busy): they fail nothing
	// and run when a slot frees. Retry ones wait to be retried after an
	// error (asynq's retry set holds both; Waiting + Retry is its count).
	Pending int `json:"pending"`
	Active  int `json:"active"`
	Waiting int `json:"waiting"`
	Retry   int `json:"retry"`
	// OldestPendingSeconds is how long the oldest task that waits to run
	// has waited: pending, or waiting for a slot since it was first told
	// to wait; 0 when none waits.
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
}
