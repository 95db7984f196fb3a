package client

import (
	"encoding/json"
	"fmt"

	"github.com/puzzleq/puzzleq/solvers/fill"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/solvers/sweep"
)

// Result is a solver's answer, the type ResultOf decodes into:
// sliding.Result, sweep.Result or fill.Result, from the packages under
// github.com/puzzleq/puzzleq/solvers.
type Result interface {
	sliding.Result | sweep.Result | fill.Result
}

// Ended is what ResultOf reads a result from: a task (Submit, Solve, Get,
// the lists) or a line of a batch's results (Results).
type Ended interface {
	*Task | *ResultLine
}

// kindOf returns the puzzle kind whose answer R is.
func kindOf[R Result]() string {
	var r R
	switch any(r).(type) {
	case sliding.Result:
		return "sliding"
	case sweep.Result:
		return "sweep"
	default:
		return "fill"
	}
}

// NotCompletedError is ResultOf's error for a task or line that has no
// result: one that failed or was canceled (Err says why) or has not ended.
type NotCompletedError struct {
	// ID is the task's.
	ID string
	// State is the task's state, anything but completed.
	State TaskState
	// Err is why a failed or canceled task ended so; nil for one that has
	// not ended.
	Err *TaskError
}

func (e *NotCompletedError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("task %s %s: %s (%s)", e.ID, e.State, e.Err.Message, e.Err.Code)
	}
	return fmt.Sprintf("task %s has not ended (%s)", e.ID, e.State)
}

// ResultOf returns the result of a completed task or results line as the
// solver's type R, for instance
//
//	t, err := c.Solve(ctx, client.Sliding(sliding.Puzzle{Board: board}, sliding.Options{}))
//	...
//	res, err := client.ResultOf[sliding.Result](t)
//
// A task or line that did not complete is a *NotCompletedError, and a
// task of another kind than R's is an error too (a results line does not
// name its kind, so the caller knows it).
func ResultOf[R Result, E Ended](x E) (R, error) {
	var (
		r        R
		id, kind string
		state    TaskState
		raw      json.RawMessage
		why      *TaskError
		haveKind bool
	)
	switch v := any(x).(type) {
	case *Task:
		if v == nil {
			return r, fmt.Errorf("ResultOf of a nil *Task")
		}
		id, kind, state, raw, why, haveKind = v.ID, v.Kind, v.State, v.Result, v.Error, true
	case *ResultLine:
		if v == nil {
			return r, fmt.Errorf("ResultOf of a nil *ResultLine")
		}
		id, state, raw, why = v.ID, v.State, v.Result, v.Error
	}
	if want := kindOf[R](); haveKind && kind != want {
		return r, fmt.Errorf("task %s is a %s puzzle, not %s", id, kind, want)
	}
	if state != StateCompleted {
		return r, &NotCompletedError{ID: id, State: state, Err: why}
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, fmt.Errorf("task %s: decode its %s result: %w", id, kindOf[R](), err)
	}
	return r, nil
}
