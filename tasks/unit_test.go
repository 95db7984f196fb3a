package tasks_test

import (
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/tasks"
)

// TestUnitRoundTrip: a unit read back from its outbox form builds the same
// task, payload byte for byte, and a damaged one is refused.
func TestUnitRoundTrip(t *testing.T) {
	t.Parallel()
	u := tasks.Unit{TaskID: tasks.ChunkTaskID("b", 3), Type: tasks.TypeChunk, Queue: tasks.QueueBulk,
		Timeout: 90 * time.Second, Payload: []byte(`{"batch_id":"b","items":[{"id":"x","request":{"a":"line\nbreak"}}]}`)}
	b, err := u.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got tasks.Unit
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if got.TaskID != u.TaskID || got.Type != u.Type || got.Queue != u.Queue || got.Timeout != u.Timeout ||
		string(got.Payload) != string(u.Payload) {
		t.Fatalf("read back %+v, want %+v", got, u)
	}
	if task := got.Task(); task.Type() != u.Type || string(task.Payload()) != string(u.Payload) {
		t.Fatalf("task %s %s", task.Type(), task.Payload())
	}
	for _, bad := range []string{"", "no header", `{"id":""}` + "\n{}", "{\n"} {
		var v tasks.Unit
		if err := v.UnmarshalBinary([]byte(bad)); err == nil {
			t.Errorf("%q decoded as %+v", bad, v)
		}
	}
}
