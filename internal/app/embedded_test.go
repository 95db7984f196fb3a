package app_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/app"
)

// The README's quick start: no REDIS_URL, one process, and a sample solve.
func TestEmbeddedQuickStart(t *testing.T) {
	t.Parallel()
	env := map[string]string{"HTTP_ADDR": "127.0.0.1:0", "TASK_TTL": "2s", "RESULT_TTL": "2s", "PDB_PRELOAD": "false"}
	cfg, err := app.LoadAPIConfig(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.NewAPI(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if !a.Embedded() {
		t.Fatal("no REDIS_URL must mean embedded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	base := "http://" + a.Addr()

	// Submit and wait in one request, answered from the task's end
	// event; then the same task read back by a long poll.
	const sample = `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`
	resp, err := http.Post(base+"/v1/tasks?wait=10s", "application/json", strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	var tk apitype.Task
	json.NewDecoder(resp.Body).Decode(&tk)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || tk.State != apitype.TaskStateCompleted || string(tk.Result) != `{"moves":3,"solvable":true,"path":"DRD"}` || tk.StartedAt == nil {
		t.Fatalf("embedded solve: %d %+v %s", resp.StatusCode, tk, tk.Result)
	}
	resp, err = http.Get(base + "/v1/tasks/" + tk.ID + "?wait=10s")
	if err != nil {
		t.Fatal(err)
	}
	var again apitype.Task
	json.NewDecoder(resp.Body).Decode(&again)
	resp.Body.Close()
	if again.State != tk.State || string(again.Result) != string(tk.Result) || !again.CompletedAt.Equal(*tk.CompletedAt) {
		t.Fatalf("read back: %+v, answered %+v", again, tk)
	}

	// Records expire: the embedded Redis's clock follows the wall clock.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err = http.Get(base + "/v1/tasks/" + tk.ID)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("record never expired (status %d)", resp.StatusCode)
		}
		time.Sleep(200 * time.Millisecond)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("embedded API did not shut down")
	}
}
