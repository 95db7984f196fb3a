package tasks

import "github.com/hibiken/asynq"

// RedriveQueue returns the queue a copy of a task from queue runs on,
// when the task runs again outside its turn: a dead worker's task
// re-driven by the watchdog, or one that ran as a Redis master changed.
// A batch unit goes to the interactive queue, because it has waited its
// turn once already: on the bulk queue it would wait behind up to
// FEED_DEPTH units again, and interactive is served first
// (QUEUE_WEIGHTS); such copies are few (one worker's concurrency, or the
// tasks of a few seconds). A unit of the cheap lane goes to the cheap
// lane's singles queue for the same reason. Any other task keeps its
// queue (webhook deliveries stay apart from the solves, cheap work in its
// lane).
func RedriveQueue(queue string) string {
	switch queue {
	case QueueBulk:
		return QueueInteractive
	case QueueCheapBulk:
		return QueueCheap
	}
	return queue
}

// RedriveID is the task ID of a copy of task id made for the reason tag
// names (the dead worker's ID, for one). It differs from id, which asynq
// may still hold, and is the same on every try, so a copy made twice for
// one reason (a watchdog pass interrupted before it reaped the worker)
// is one task while the first is queued. A unit's handler reads the unit
// from the payload, not from the task ID.
func RedriveID(id, tag string) string { return id + "~" + tag }

// RedriveTask builds a copy of task ti made for the reason tag names: the
// same type, payload, retries, timeout (or deadline) and retention, under
// RedriveID(ti.ID, tag) on RedriveQueue(ti.Queue). Units have fixed task
// IDs (UnitRef.TaskID) for the feed's deduplication; the copy's ID is its
// own, and the handler reads the unit from the payload.
func RedriveTask(ti *asynq.TaskInfo, tag string) *asynq.Task {
	opts := []asynq.Option{asynq.TaskID(RedriveID(ti.ID, tag)), asynq.Queue(RedriveQueue(ti.Queue)), asynq.MaxRetry(ti.MaxRetry)}
	if ti.Retention > 0 {
		opts = append(opts, asynq.Retention(ti.Retention))
	}
	switch {
	case ti.Timeout > 0:
		opts = append(opts, asynq.Timeout(ti.Timeout))
	case !ti.Deadline.IsZero():
		opts = append(opts, asynq.Deadline(ti.Deadline))
	}
	return asynq.NewTask(ti.Type, ti.Payload, opts...)
}
