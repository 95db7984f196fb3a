package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/tasks"
)

// fakeStore is a tasks.Store whose writes can be made to fail, for the
// failure paths a real Redis reaches only by chance. The behaviour on a
// healthy store is tested on the real one (handler_test.go).
type fakeStore struct {
	mu        sync.Mutex
	state     map[string]apitype.TaskState
	finishErr error
	finished  []tasks.Transition
}

func (f *fakeStore) Start(_ context.Context, ts []tasks.Transition, _ []string) ([]apitype.TaskState, []json.RawMessage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	prev := make([]apitype.TaskState, len(ts))
	for i, t := range ts {
		prev[i] = f.state[t.ID]
		if prev[i] == apitype.TaskStatePending {
			f.state[t.ID] = apitype.TaskStateActive
		}
	}
	return prev, make([]json.RawMessage, len(ts)), nil
}

func (f *fakeStore) Finish(_ context.Context, ts []tasks.Transition, _ []string) ([]apitype.TaskState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.finishErr != nil {
		return nil, f.finishErr
	}
	prev := make([]apitype.TaskState, len(ts))
	for i, t := range ts {
		prev[i] = f.state[t.ID]
		if !prev[i].Terminal() {
			f.state[t.ID] = t.State
			f.finished = append(f.finished, t)
		}
	}
	return prev, nil
}

func (f *fakeStore) SetProgress(context.Context, string, apitype.Progress) error { return nil }

// A solve whose result cannot be written must not be acknowledged: the
// handler returns a retryable error, and the redelivery writes it.
func TestResultWriteFailureIsRetried(t *testing.T) {
	t.Parallel()
	st := &fakeStore{state: map[string]apitype.TaskState{"w1": apitype.TaskStatePending}, finishErr: errors.New("redis: connection reset")}
	h := tasks.NewHandler(st, nil, testLimits(), nil, nil)
	task, err := tasks.NewSolveTask("w1", "", "", mustParse(t, sample8), tasks.QueueInteractive, testLimits())
	if err != nil {
		t.Fatal(err)
	}
	err = h.ProcessTask(context.Background(), task)
	if err == nil || errors.Is(err, asynq.SkipRetry) || !errors.Is(err, st.finishErr) {
		t.Fatalf("ProcessTask = %v, want the store's error, retryable", err)
	}
	st.finishErr = nil
	if err := h.ProcessTask(context.Background(), task); err != nil {
		t.Fatalf("redelivery: %v", err)
	}
	if len(st.finished) != 1 || st.finished[0].State != apitype.TaskStateCompleted || len(st.finished[0].Result) == 0 {
		t.Fatalf("finished %+v, want w1 completed with its result", st.finished)
	}
}

// A payload is decoded with exact, unique names, as requests are: under
// encoding/json, "ID" would be taken for "id" and the last of two "id"s
// would win, so the handler could run another record than the one a
// reader of the same bytes sees. A member it does not know is skipped, so
// that a worker one release behind still runs a payload that gained one.
func TestPayloadNamesAreExact(t *testing.T) {
	t.Parallel()
	req := `"request":` + sample8
	const (
		completed   = "w1 completed"
		nothing     = "nothing run"
		undecodable = "undecodable (SkipRetry), nothing run"
	)
	for _, tc := range []struct {
		name, typ, payload, want string
	}{
		{"exact", tasks.TypeSliding, `{"id":"w1",` + req + `}`, completed},
		{"unknown member", tasks.TypeSliding, `{"id":"w1",` + req + `,"trace_id":"t"}`, completed},
		{"folded name", tasks.TypeSliding, `{"ID":"w1",` + req + `}`, undecodable},
		{"folded name of a chunk", tasks.TypeChunk, `{"batch_id":"b","ITEMS":[{"id":"w1",` + req + `}]}`, nothing},
		{"repeated name", tasks.TypeSliding, `{"id":"w1","id":"w2",` + req + `}`, undecodable},
		{"repeated in an item", tasks.TypeChunk, `{"batch_id":"b","items":[{"id":"w1",` + req + `,"id":"w2"}]}`, undecodable},
	} {
		st := &fakeStore{state: map[string]apitype.TaskState{"w1": apitype.TaskStatePending, "w2": apitype.TaskStatePending}}
		h := tasks.NewHandler(st, nil, testLimits(), nil, nil)
		err := h.ProcessTask(context.Background(), asynq.NewTask(tc.typ, []byte(tc.payload)))
		var got string
		switch {
		case err == nil && len(st.finished) == 1 && st.finished[0].ID == "w1" && st.finished[0].State == apitype.TaskStateCompleted:
			got = completed
		case err == nil && len(st.finished) == 0:
			got = nothing
		case errors.Is(err, asynq.SkipRetry) && len(st.finished) == 0:
			got = undecodable
		default:
			got = fmt.Sprintf("error %v, finished %+v", err, st.finished)
		}
		if got != tc.want {
			t.Errorf("%s: %s; want %s", tc.name, got, tc.want)
		}
	}
}
