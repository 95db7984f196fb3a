package tasks_test

import (
	"fmt"
	"time"

	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// Build the asynq task for one request, as the API does for POST /v1/tasks
// (with the time it accepted the request).
func ExampleNewSolveTaskAt() {
	p, err := puzzle.Decode([]byte(`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`))
	if err != nil {
		panic(err)
	}
	// The limits come from the worker's and the API's configuration.
	limits := tasks.Limits{Deadline: map[puzzle.Kind]time.Duration{puzzle.KindSliding: 5 * time.Minute}}
	accepted := time.UnixMilli(1_796_000_000_000)
	t, err := tasks.NewSolveTaskAt("0123456789abcdef0123456789abcdef", "", p, tasks.QueueInteractive, limits, accepted)
	if err != nil {
		panic(err)
	}
	fmt.Println(t.Type())
	fmt.Println(string(t.Payload()))
	// Output:
	// solve:sliding
	// {"id":"0123456789abcdef0123456789abcdef","request":{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{}},"at":1796000000000}
}
