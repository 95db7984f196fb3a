package stacktest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// SolveSome submits to the API at apiURL a cheap task (queue cheap) and an
// expensive one (a 2×5 board a move from its goal: queue interactive), and
// a batch of two cheap items and an expensive one (queues cheap-bulk and
// bulk), and waits until all are done, so that a dashboard has every queue
// of tasks.Queues and tasks.CheapQueues to list.
func SolveSome(t testing.TB, apiURL string) {
	t.Helper()
	post := func(path, body string) map[string]any {
		resp, err := http.Post(apiURL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST %s: %s %v %v", path, resp.Status, m, err)
		}
		return m
	}
	get := func(path string) map[string]any {
		resp, err := http.Get(apiURL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	// The smallest expensive shape: its pattern databases build in
	// milliseconds, where a 15-puzzle's take seconds, and under the race
	// detector longer than the waits below.
	const hard = `{"kind":"sliding","puzzle":{"board":[[1,2,3,4,5],[6,7,8,0,9]]}}`
	task := post("/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`)
	search := post("/v1/tasks", hard)
	batch := post("/v1/batches", `{"tasks":[{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}},`+
		`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,0,6],[7,5,8]]}},`+hard+`]}`)
	for _, id := range []any{task["id"], search["id"]} {
		if m := get(fmt.Sprintf("/v1/tasks/%v?wait=20s", id)); m["state"] != "completed" {
			t.Fatalf("task: %v", m)
		}
	}
	if m := get(fmt.Sprintf("/v1/batches/%v?wait=20s", batch["id"])); m["done"] != true {
		t.Fatalf("batch: %v", m)
	}
}
