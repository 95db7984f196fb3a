package api_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// stack is a real deployment in miniature (internal/stacktest): a
// redis-server process, the API and workers, wired by the same code as
// the binaries.
type stack struct {
	*stacktest.Stack
	t *testing.T
}

// startStack starts redis, the API and n workers. env overrides settings
// of both binaries.
func startStack(t *testing.T, workers int, env map[string]string) *stack {
	t.Helper()
	return &stack{stacktest.Start(t, stacktest.Options{Workers: workers, Env: env}), t}
}

// task is the JSON task resource.
type task struct {
	ID          string          `json:"id"`
	Kind        string          `json:"kind"`
	State       string          `json:"state"`
	Result      json.RawMessage `json:"result"`
	Error       *apiErr         `json:"error"`
	Cached      bool            `json:"cached"`
	BatchID     *string         `json:"batch_id"`
	CreatedAt   *time.Time      `json:"created_at"`
	StartedAt   *time.Time      `json:"started_at"`
	CompletedAt *time.Time      `json:"completed_at"`
	Attempts    int             `json:"attempts"`
}

type apiErr struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field"`
}

type errBody struct {
	Error apiErr `json:"error"`
}

type batch struct {
	ID         string         `json:"id"`
	Total      int            `json:"total"`
	Counts     map[string]int `json:"counts"`
	Done       bool           `json:"done"`
	Tasks      []task         `json:"tasks"`
	NextCursor *string        `json:"next_cursor"`
	TaskIDs    []string       `json:"task_ids"`
}

func decode[T any](t *testing.T, b []byte) T { return stacktest.Decode[T](t, b) }

// submit posts one request and returns the task resource.
func (s *stack) submit(req string, wantStatus int) task {
	return decode[task](s.t, s.Submit(req, wantStatus))
}

// wait long-polls a task until it ends (or the wait runs out).
func (s *stack) wait(id string, d time.Duration) task { return decode[task](s.t, s.WaitTask(id, d)) }
