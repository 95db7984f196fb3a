package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/client"
)

// TestGetShowsProgress runs a 15-puzzle long enough to watch (one of the
// 80-move positions, the hardest there are: about 85 s of CPU) on the real
// stack, and reads it with puzzlectl get while it runs: the JSON and the
// table both show the search's progress. The task is canceled once seen.
func TestGetShowsProgress(t *testing.T) {
	t.Parallel()
	s := startStack(t, 1)
	c := client.New(s.base)
	ctx := context.Background()
	task, err := c.Submit(ctx, client.RawRequest([]byte(`{"kind":"sliding","puzzle":{"board":[[0,12,9,13],[15,11,10,14],[3,7,2,5],[4,8,6,1]]}}`)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Cancel(context.WithoutCancel(ctx), task.ID) })

	// The first 15-puzzle a worker meets builds its pattern databases
	// (seconds of CPU, more under -race) before the search reports.
	var got client.Task
	var out string
	for deadline := time.Now().Add(4 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		code, o, errOut := run(t, "", "--server", s.base, "get", task.ID, "-o", "json")
		if code != 0 || json.Unmarshal([]byte(o), &got) != nil {
			t.Fatalf("get -o json: exit %d, out %q, stderr %q", code, o, errOut)
		}
		if got.State != client.StateActive && got.State != client.StatePending {
			t.Fatalf("the task ended (%s) before its progress was seen: %s", got.State, o)
		}
		if got.Progress != nil {
			out = o
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress within 4 minutes: %s", o)
		}
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	var p struct {
		Bound int   `json:"bound"`
		Nodes int64 `json:"nodes"`
	}
	if err := json.Unmarshal(raw["progress"], &p); err != nil || p.Bound < 80-30 || p.Bound > 80 || p.Nodes < 0 {
		t.Fatalf(`"progress" of the running task: %s (%v); want a bound between 50 and 80`, raw["progress"], err)
	}
	if got.State != client.StateActive {
		t.Errorf("state %s with progress, want active", got.State)
	}

	code, table, errOut := run(t, "", "--server", s.base, "get", task.ID)
	if code != 0 || !strings.Contains(table, "PROGRESS") || !strings.Contains(table, "bound ") {
		t.Errorf("get (table): exit %d, out %q, stderr %q; want a PROGRESS column", code, table, errOut)
	}
	t.Logf("progress of the running task: %s\n%s", raw["progress"], table)
}
