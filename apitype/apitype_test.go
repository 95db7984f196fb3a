package apitype_test

import (
	"encoding/json"
	"testing"

	"github.com/puzzleq/puzzleq/apitype"
)

func TestTerminal(t *testing.T) {
	want := map[apitype.TaskState]bool{
		apitype.TaskStatePending: false, apitype.TaskStateActive: false,
		apitype.TaskStateCompleted: true, apitype.TaskStateFailed: true, apitype.TaskStateCanceled: true,
	}
	if len(apitype.TaskStates()) != len(want) {
		t.Fatalf("TaskStates() = %v, want the %d states", apitype.TaskStates(), len(want))
	}
	for _, s := range apitype.TaskStates() {
		w, ok := want[s]
		if !ok {
			t.Fatalf("unexpected state %q", s)
		}
		if s.Terminal() != w {
			t.Errorf("%s.Terminal() = %t, want %t", s, s.Terminal(), w)
		}
		if tk := (apitype.Task{State: s}); tk.Terminal() != w {
			t.Errorf("Task in %s: Terminal() = %t, want %t", s, tk.Terminal(), w)
		}
	}
	if apitype.TaskState("").Terminal() || apitype.TaskState("done").Terminal() {
		t.Error("an unknown state is terminal")
	}
}

func TestCounts(t *testing.T) {
	c := apitype.Counts{Pending: 1, Active: 2, Completed: 4, Failed: 8, Canceled: 16}
	sum := 0
	for _, s := range apitype.TaskStates() {
		sum += c.Of(s)
	}
	if sum != 31 || c.Ended() != 28 || c.Of("done") != 0 {
		t.Errorf("sum of Of = %d, Ended = %d, Of(unknown) = %d; want 31, 28, 0", sum, c.Ended(), c.Of("done"))
	}
	// Of reads the field whose JSON name is the state.
	b, _ := json.Marshal(c)
	var m map[string]int
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, s := range apitype.TaskStates() {
		if m[string(s)] != c.Of(s) {
			t.Errorf("counts[%q] = %d in JSON, Of = %d", s, m[string(s)], c.Of(s))
		}
	}
}

// The codes of each list are distinct; the contract test in internal/api
// holds the lists to openapi.yaml.
func TestCodesDistinct(t *testing.T) {
	for name, codes := range map[string][]string{"ErrorCodes": apitype.ErrorCodes(), "TaskErrorCodes": apitype.TaskErrorCodes()} {
		seen := map[string]bool{}
		for _, c := range codes {
			if c == "" || seen[c] {
				t.Errorf("%s: code %q is empty or repeated", name, c)
			}
			seen[c] = true
		}
	}
}
