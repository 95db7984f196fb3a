package stacktest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// SolveSome submits one task (queue interactive) and a two-item batch
// (queue bulk) to the API at apiURL and waits until both are done, so
// that a dashboard has both queues to list.
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
	task := post("/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`)
	batch := post("/v1/batches", `{"tasks":[{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}},`+
		`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,0,6],[7,5,8]]}}]}`)
	if m := get(fmt.Sprintf("/v1/tasks/%v?wait=20s", task["id"])); m["state"] != "completed" {
		t.Fatalf("task: %v", m)
	}
	if m := get(fmt.Sprintf("/v1/batches/%v?wait=20s", batch["id"])); m["done"] != true {
		t.Fatalf("batch: %v", m)
	}
}
