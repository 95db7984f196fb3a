package tasks

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
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
		asynq.MaxRetry(MaxRetry), asynq.Timeout(r.Timeout)), nil
}
