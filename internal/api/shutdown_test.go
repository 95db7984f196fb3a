package api_test

import (
	"bufio"
	"encoding/json"
	"io"
	"math/rand"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// TestShutdownAnswersHeldPolls: stopping the API answers every held long
// poll at once, 202 with the current state, instead of holding it to the
// shutdown timeout and cutting it; the API then stops. Nothing runs the
// tasks (no workers), so every poll would otherwise hold its whole wait.
func TestShutdownAnswersHeldPolls(t *testing.T) {
	t.Parallel()
	s := stacktest.StartWith(t, 0, map[string]string{"SHUTDOWN_TIMEOUT": "20s"})
	tk := s.Submit(sample8, http.StatusAccepted)
	code, b := s.Do("POST", "/v1/batches", json.RawMessage(`{"tasks":[`+sample8+`,`+randomSliding(rand.New(rand.NewSource(7)))+`]}`))
	if code != http.StatusAccepted {
		t.Fatalf("POST /v1/batches: %d %s", code, b)
	}
	batch := decode[apitype.BatchCreated](t, b)
	const wait = "30s"
	polls := []struct{ name, method, path, body string }{
		{"task", "GET", "/v1/tasks/" + tk.ID + "?wait=" + wait, ""},
		{"item", "GET", "/v1/tasks/" + batch.TaskIDs[1] + "?wait=" + wait, ""},
		{"batch", "GET", "/v1/batches/" + batch.ID + "?wait=" + wait, ""},
		{"results", "GET", "/v1/batches/" + batch.ID + "/results?wait=" + wait, ""},
		{"submit", "POST", "/v1/tasks?wait=" + wait, randomSliding(rand.New(rand.NewSource(8)))},
	}
	type answer struct {
		code int
		body []byte
		err  error
		at   time.Time
	}
	answers := make([]answer, len(polls))
	var wg sync.WaitGroup
	for i, p := range polls {
		wg.Go(func() {
			var body io.Reader
			if p.body != "" {
				body = strings.NewReader(p.body)
			}
			req, _ := http.NewRequest(p.method, s.URL+p.path, body)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answers[i] = answer{err: err, at: time.Now()}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			answers[i] = answer{code: resp.StatusCode, body: b, err: err, at: time.Now()}
		})
	}
	time.Sleep(500 * time.Millisecond) // every poll is held now
	stopAt := time.Now()
	s.Close()
	stopped := time.Since(stopAt)
	wg.Wait()
	for i, p := range polls {
		a := answers[i]
		if a.err != nil || a.code != http.StatusAccepted {
			t.Errorf("%s: %d %v %.200s, want 202 with the current state", p.name, a.code, a.err, a.body)
			continue
		}
		// Far inside the wait (30 s) and the shutdown timeout (20 s).
		if d := a.at.Sub(stopAt); d > 5*time.Second {
			t.Errorf("%s answered %v after the stop began, want at once", p.name, d)
		}
		switch p.name {
		case "task", "item", "submit":
			if tr := decode[apitype.Task](t, a.body); tr.State != apitype.TaskStatePending || tr.ID == "" {
				t.Errorf("%s: %+v, want the pending task", p.name, tr)
			}
		case "batch":
			if br := decode[apitype.Batch](t, a.body); br.Done || br.ID != batch.ID || br.Counts.Pending != 2 {
				t.Errorf("batch: %+v, want the batch, not done, 2 pending", br)
			}
		case "results":
			n := 0
			sc := bufio.NewScanner(strings.NewReader(string(a.body)))
			for sc.Scan() {
				var l apitype.ResultLine
				if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.State != apitype.TaskStatePending {
					t.Errorf("results line %q: %v, want a pending item", sc.Text(), err)
				}
				n++
			}
			if n != 2 {
				t.Errorf("results: %d lines, want 2", n)
			}
		}
	}
	// Waiting on the polls would take SHUTDOWN_TIMEOUT (20 s); the bound
	// leaves a loaded machine 15 s to stop at once.
	if stopped > 15*time.Second {
		t.Errorf("the API took %v to stop with polls held, want at once (SHUTDOWN_TIMEOUT is 20s)", stopped)
	}
}
