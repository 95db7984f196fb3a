package apitype_test

import (
	"encoding/json"
	"fmt"

	"github.com/puzzleq/puzzleq/apitype"
)

// Decode an answer of GET /v1/tasks/{id} and branch on its state and
// error code.
func ExampleTask() {
	body := []byte(`{"id":"9b2f0c6a4e1d4f3a8c7b6a5d4e3f2a1b","kind":"sweep","state":"failed","result":null,
		"error":{"code":"budget_exceeded","message":"node budget exceeded"},"cached":false,"batch_id":null,
		"created_at":"2026-11-30T09:00:00.123Z","started_at":"2026-11-30T09:00:00.131Z",
		"completed_at":"2026-11-30T09:00:01.002Z","attempts":1,"progress":null}`)
	var t apitype.Task
	if err := json.Unmarshal(body, &t); err != nil {
		panic(err)
	}
	switch {
	case !t.Terminal():
		fmt.Println("still running")
	case t.State == apitype.TaskStateCompleted:
		fmt.Println(string(t.Result))
	case t.Error.Code == apitype.CodeBudgetExceeded:
		fmt.Println("too hard for the budget; retrying cannot help")
	default:
		fmt.Println(t.Error.Code, t.Error.Message)
	}
	// Output: too hard for the budget; retrying cannot help
}
