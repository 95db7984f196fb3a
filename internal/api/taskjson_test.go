package api

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
)

// taskJSONResults are results encoding/json writes as they are, and ones
// it compacts, escapes or rejects.
var taskJSONResults = []string{"", `{"solvable":true,"moves":2,"path":"LU"}`, `[[1,2],[3,4]]`, `null`, `"x"`,
	`{"a": 1}`, "{\n\"a\":1}", `{"p":"<b>&"}`, `{"p":"é"}`, "{\"p\":\"\u2028\"}", "{\"p\":\"\xff\"}", `{"a":`, `nul`, `{}x`}

// taskJSONResult draws a result, nil (null) as often as the others.
func taskJSONResult(r *rand.Rand) json.RawMessage {
	if r.IntN(len(taskJSONResults)+1) == 0 {
		return nil
	}
	return json.RawMessage(taskJSONResults[r.IntN(len(taskJSONResults))])
}

// taskJSONTimes are times MarshalJSON writes in UTC, with an offset, and
// ones it rejects (years RFC 3339 cannot hold).
func taskJSONTimes() []*time.Time {
	at := func(t time.Time) *time.Time { return &t }
	base := time.Date(2026, 12, 3, 14, 5, 6, 789_000_000, time.UTC)
	return []*time.Time{nil, at(base), at(base.Truncate(time.Second)), at(base.Add(123)),
		at(base.In(time.FixedZone("CET", 3600))), at(base.In(time.FixedZone("odd", -(5*3600 + 30*60 + 7)))),
		at(base.In(time.FixedZone("ZERO", 0))), at(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)),
		at(time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)), at(base.In(time.FixedZone("far", 24*3600)))}
}

// randomTask draws every member from values that take each of
// appendTask's paths.
func randomTask(r *rand.Rand) *apitype.Task {
	str := func() string { return resultLineSeeds[r.IntN(len(resultLineSeeds))] }
	strp := func() *string {
		if r.IntN(3) == 0 {
			return nil
		}
		s := str()
		return &s
	}
	times := taskJSONTimes()
	tm := func() *time.Time { return times[r.IntN(len(times))] }
	states := apitype.TaskStates()
	t := &apitype.Task{ID: str(), CustomID: strp(), Kind: str(), State: states[r.IntN(len(states))],
		Result: taskJSONResult(r), Cached: r.IntN(2) == 0,
		BatchID: strp(), CreatedAt: tm(), StartedAt: tm(), CompletedAt: tm(), Attempts: r.IntN(5) - 1}
	if r.IntN(2) == 0 {
		t.Error = &apitype.TaskError{Code: str(), Message: str()}
	}
	if r.IntN(2) == 0 {
		t.Progress = &apitype.Progress{Bound: r.IntN(90), Nodes: r.Int64()}
	}
	if r.IntN(2) == 0 {
		t.Webhook = &apitype.Webhook{URL: str(), Attempts: r.IntN(9), LastError: strp(), LastAttemptAt: tm(), DeliveredAt: tm()}
		if r.IntN(2) == 0 {
			st := 200 + r.IntN(400)
			t.Webhook.LastStatus = &st
		}
	}
	return t
}

// TestAppendTaskAsJSON: for tasks of every shape, appendTask writes the
// bytes encoding/json writes, and fails where it fails. The fast paths
// must be taken too, or the test would compare encoding/json with itself.
func TestAppendTaskAsJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 3))
	plain, failed := 0, 0
	for range 20000 {
		task := randomTask(r)
		checkTaskJSON(t, task)
		if _, err := json.Marshal(task); err != nil {
			failed++
		} else if task.Result == nil || plainRawJSON(task.Result) {
			plain++
		}
	}
	if plain < 1000 || failed < 1000 {
		t.Fatalf("%d tasks took the plain result path and %d failed: the draw misses a path", plain, failed)
	}
	// The cache hit's answer, as createTask builds it.
	created := time.Now().UTC()
	checkTaskJSON(t, &apitype.Task{ID: newID(), Kind: "sliding", State: apitype.TaskStateCompleted,
		Result: json.RawMessage(`{"solvable":true,"moves":2,"path":"LU"}`), Cached: true, CreatedAt: &created, CompletedAt: &created})
}

// FuzzAppendTask: for any strings and result, appendTask is encoding/json.
func FuzzAppendTask(f *testing.F) {
	for i, res := range taskJSONResults {
		f.Add(resultLineSeeds[i%len(resultLineSeeds)], res, int64(i)*1_000_000_007)
	}
	f.Fuzz(func(t *testing.T, s, result string, nanos int64) {
		at := time.Unix(0, nanos).UTC()
		checkTaskJSON(t, &apitype.Task{ID: s, CustomID: &s, Kind: s, State: apitype.TaskState(s), Result: json.RawMessage(result),
			Error: &apitype.TaskError{Code: s, Message: s}, CreatedAt: &at, Webhook: &apitype.Webhook{URL: s, LastError: &s}})
	})
}

func checkTaskJSON(t *testing.T, task *apitype.Task) {
	t.Helper()
	want, werr := json.Marshal(task)
	got, err := appendTask(nil, task)
	if (err == nil) != (werr == nil) || (err == nil && !bytes.Equal(got, want)) {
		t.Fatalf("appendTask(%+v):\n got %q (%v)\nwant %q (%v)", task, got, err, want, werr)
	}
}
