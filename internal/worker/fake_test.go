package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// fakeStore is a worker.Store whose writes can be made to fail, for the
// failure paths a real Redis reaches only by chance. The behaviour on a
// healthy store is tested on the real one (handler_test.go).
type fakeStore struct {
	mu        sync.Mutex
	state     map[string]apitype.TaskState
	finishErr error
	finished  []worker.Transition

	// The unit layout, as internal/store keeps it: each unit's items (by
	// the unit's task ID) and each ended item's entry (by item ID).
	units map[string][]worker.UnitItem
	ended map[string]worker.ItemOutcome
	cache map[string]json.RawMessage
	// unitFinishes holds the outs of every FinishUnit call that wrote.
	unitFinishes [][]worker.ItemOutcome
	starts       int
	cacheReads   []string
	// onStart, when set, runs inside StartUnit before it reads: a test's
	// way to land a cancel between registration and the read.
	onStart func(tasks.UnitRef)
}

// newUnitStore returns a fake holding units of batch "b": units maps a
// unit name to its items' indexes, each item's request being reqs[index].
func newUnitStore(units map[string][]int, reqs map[int]string) *fakeStore {
	f := &fakeStore{state: map[string]apitype.TaskState{}, units: map[string][]worker.UnitItem{},
		ended: map[string]worker.ItemOutcome{}, cache: map[string]json.RawMessage{}}
	for u, idx := range units {
		ref := tasks.UnitRef{BatchID: "b", Unit: u}
		for _, i := range idx {
			f.units[ref.TaskID()] = append(f.units[ref.TaskID()], worker.UnitItem{Index: i, Request: []byte(reqs[i])})
		}
	}
	return f
}

func (f *fakeStore) StartUnit(_ context.Context, ref tasks.UnitRef) (*worker.UnitWork, error) {
	if f.onStart != nil {
		f.onStart(ref)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts++
	w := &worker.UnitWork{}
	for _, it := range f.units[ref.TaskID()] {
		if _, done := f.ended[apitype.ItemID(ref.BatchID, it.Index)]; !done {
			w.Items = append(w.Items, it)
		}
	}
	return w, nil
}

func (f *fakeStore) FinishUnit(_ context.Context, ref tasks.UnitRef, _ string, outs []worker.ItemOutcome) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.finishErr != nil {
		return 0, f.finishErr
	}
	n := 0
	for _, o := range outs {
		id := apitype.ItemID(ref.BatchID, o.Index)
		if _, done := f.ended[id]; !done {
			f.ended[id] = o
			n++
		}
	}
	f.unitFinishes = append(f.unitFinishes, outs)
	return n, nil
}

func (f *fakeStore) Cached(_ context.Context, key string) (json.RawMessage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cacheReads = append(f.cacheReads, key)
	return f.cache[key], nil
}

// cancelItem ends item index of batch "b" as canceled, as the API's cancel
// does in the store before it publishes the cancel.
func (f *fakeStore) cancelItem(index int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := apitype.ItemID("b", index)
	if _, done := f.ended[id]; !done {
		f.ended[id] = worker.ItemOutcome{Index: index, State: apitype.TaskStateCanceled}
	}
}

// entry returns how item index of batch "b" ended; ok is false while it
// has not.
func (f *fakeStore) entry(index int) (o worker.ItemOutcome, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok = f.ended[apitype.ItemID("b", index)]
	return o, ok
}

func (f *fakeStore) Start(_ context.Context, ts []worker.Transition, _ []string) ([]apitype.TaskState, []json.RawMessage, error) {
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

func (f *fakeStore) Finish(_ context.Context, ts []worker.Transition, _ []string) ([]apitype.TaskState, error) {
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
	h := worker.NewHandler(st, nil, testLimits(), nil, nil)
	task, err := tasks.NewSolveTask("w1", "", mustParse(t, sample8), tasks.QueueInteractive, testLimits())
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
		{"repeated name", tasks.TypeSliding, `{"id":"w1","id":"w2",` + req + `}`, undecodable},
	} {
		st := &fakeStore{state: map[string]apitype.TaskState{"w1": apitype.TaskStatePending, "w2": apitype.TaskStatePending}}
		h := worker.NewHandler(st, nil, testLimits(), nil, nil)
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
