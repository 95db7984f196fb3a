package recovery

import (
	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/tasks"
)

// RedriveQueue returns the queue a dead worker's task from queue is
// re-driven on. A batch unit goes to the interactive queue, because it
// has waited its turn once already: on the bulk queue it would wait
// behind up to FEED_DEPTH units again, and interactive is served first
// (QUEUE_WEIGHTS); a crash re-drives at most one worker's concurrency of
// tasks. A unit of the cheap lane goes to the cheap lane's singles queue
// for the same reason. Any other task keeps its queue (webhook deliveries
// stay apart from the solves, cheap work in its lane).
func RedriveQueue(queue string) string {
	switch queue {
	case tasks.QueueBulk:
		return tasks.QueueInteractive
	case tasks.QueueCheapBulk:
		return tasks.QueueCheap
	}
	return queue
}

// RedriveID is the task ID of the copy of task id re-driven after worker
// died. It differs from id, which asynq still holds as active until it
// recovers it, and is the same on every try, so a watchdog that re-drives
// the same dead worker twice (a pass interrupted before it reaped the
// worker) makes one copy while the first is queued.
func RedriveID(id, worker string) string { return id + "~" + worker }

// RedriveTask builds the copy of a dead worker's task ti: the same type,
// payload, retries, timeout and retention, under RedriveID on
// RedriveQueue. Units
// have fixed task IDs (UnitRef.TaskID) for the feed's deduplication; the
// copy's ID is its own, and the handler reads the unit from the payload.
func RedriveTask(ti *asynq.TaskInfo, worker string) *asynq.Task {
	opts := []asynq.Option{asynq.TaskID(RedriveID(ti.ID, worker)), asynq.Queue(RedriveQueue(ti.Queue)), asynq.MaxRetry(ti.MaxRetry)}
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
