package recovery

import (
	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/tasks"
)

// RedriveTask builds the copy of a dead worker's task ti: the same type,
// payload, retries, timeout and retention, under tasks.RedriveID on
// tasks.RedriveQueue. Units
// have fixed task IDs (UnitRef.TaskID) for the feed's deduplication; the
// copy's ID is its own, and the handler reads the unit from the payload.
func RedriveTask(ti *asynq.TaskInfo, worker string) *asynq.Task {
	opts := []asynq.Option{asynq.TaskID(tasks.RedriveID(ti.ID, worker)), asynq.Queue(tasks.RedriveQueue(ti.Queue)), asynq.MaxRetry(ti.MaxRetry)}
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
