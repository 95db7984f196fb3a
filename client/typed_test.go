package client_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/solvers/fill"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/solvers/sweep"
)

// ResultOf decodes a completed task's or line's result into the solver's
// type, and refuses what has no such result: another kind, a task that
// failed or has not ended, nil.
func TestResultOf(t *testing.T) {
	t.Parallel()
	done := &client.Task{ID: "t1", Kind: "sweep", State: client.StateCompleted, Result: json.RawMessage(`{"moves":2,"start":[0,1],"path":"LD"}`)}
	got, err := client.ResultOf[sweep.Result](done)
	if err != nil || !reflect.DeepEqual(got, sweep.Result{Moves: 2, Start: []int{0, 1}, Path: "LD"}) {
		t.Errorf("ResultOf[sweep.Result] = %+v, %v", got, err)
	}
	if _, err := client.ResultOf[sliding.Result](done); err == nil || !strings.Contains(err.Error(), "sweep puzzle, not sliding") {
		t.Errorf("ResultOf[sliding.Result] of a sweep task: %v", err)
	}

	line := &client.ResultLine{Index: 3, ID: "b-3", State: client.StateCompleted,
		Result: json.RawMessage(`{"filled":4,"placements":[{"piece":[[0,0]],"hole":[[1,1]],"rotation":90}]}`)}
	f, err := client.ResultOf[fill.Result](line)
	if err != nil || f.Filled != 4 || len(f.Placements) != 1 || f.Placements[0].Rotation != 90 {
		t.Errorf("ResultOf[fill.Result] of a line = %+v, %v", f, err)
	}

	for name, x := range map[string]*client.Task{
		"failed":  {ID: "t2", Kind: "fill", State: client.StateFailed, Error: &client.TaskError{Code: "timeout", Message: "too slow"}},
		"pending": {ID: "t3", Kind: "fill", State: client.StatePending},
	} {
		_, err := client.ResultOf[fill.Result](x)
		var nc *client.NotCompletedError
		if !errors.As(err, &nc) || nc.ID != x.ID || nc.State != x.State || nc.Err != x.Error {
			t.Errorf("%s: err %v, want a NotCompletedError of the task", name, err)
		}
	}
	if _, err := client.ResultOf[fill.Result]((*client.Task)(nil)); err == nil {
		t.Error("ResultOf of a nil task: no error")
	}
	bad := &client.Task{ID: "t4", Kind: "sliding", State: client.StateCompleted, Result: json.RawMessage(`{"moves":"three"}`)}
	if _, err := client.ResultOf[sliding.Result](bad); err == nil {
		t.Error("ResultOf of a result that is not the kind's: no error")
	}
}
