package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/cli"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

const failingLine = `{"custom_id":"bad","kind":"sweep","puzzle":{"board":[".....","....."]},"options":{"max_nodes":1}}`

// TestJobCommandsOnAStack drives results, list, batch cancel and retry,
// health and the exit codes against a real stack: a redis-server, the
// API and a worker.
func TestJobCommandsOnAStack(t *testing.T) {
	t.Parallel()
	s := stacktest.Start(t, stacktest.Options{Workers: 1, Env: map[string]string{"API_KEYS": "alice:alice-key-0123456789,bob:bob-key-0123456789ab"}})
	as := func(key string, args ...string) []string {
		return append([]string{"--server", s.URL, "--api-key", key}, args...)
	}
	in := filepath.Join(t.TempDir(), "jobs.jsonl")
	lines := []string{`{"custom_id":"ok","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`, failingLine}
	if err := os.WriteFile(in, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "", as("alice-key-0123456789", "submit", "-f", in, "-o", "json")...)
	if code != 0 {
		t.Fatalf("submit: exit %d, stderr %q", code, errOut)
	}
	// -o json is one document: the accepted batches as one array.
	var subs []struct {
		Batch     string `json:"batch"`
		Total     int    `json:"total"`
		FirstLine int    `json:"first_line"`
		LastLine  int    `json:"last_line"`
	}
	if err := json.Unmarshal([]byte(out), &subs); err != nil || len(subs) != 1 || subs[0].Batch == "" || subs[0].Total != 2 || subs[0].LastLine != 2 {
		t.Fatalf("submit -o json printed %q: %v", out, err)
	}
	id := subs[0].Batch

	t.Run("results", func(t *testing.T) {
		code, out, errOut := run(t, "", as("alice-key-0123456789", "results", id, "--wait", "--timeout", "30s")...)
		rl := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if code != cli.ExitFailed || len(rl) != 2 || !strings.Contains(rl[0], `"state":"completed"`) || !strings.Contains(rl[1], `"budget_exceeded"`) {
			t.Fatalf("results --wait: exit %d, out %q, stderr %q; want the two NDJSON lines and exit 1", code, out, errOut)
		}
		var l apitype.ResultLine
		if err := json.Unmarshal([]byte(rl[1]), &l); err != nil || l.ID != id+"-1" || *l.CustomID != "bad" {
			t.Fatalf("line %q: %+v %v", rl[1], l, err)
		}
		// json, yaml and table print the same lines as one document.
		code, out, _ = run(t, "", as("alice-key-0123456789", "results", id, "-o", "json")...)
		jsonOut := []byte(out)
		var arr []apitype.ResultLine
		if err := json.Unmarshal(jsonOut, &arr); code != cli.ExitFailed || err != nil || len(arr) != 2 || arr[1].ID != id+"-1" || arr[1].Error == nil || arr[1].Error.Code != "budget_exceeded" {
			t.Fatalf("results -o json: exit %d, out %q (%v); want one array of the two lines and exit 1", code, out, err)
		}
		code, out, _ = run(t, "", as("alice-key-0123456789", "results", id, "-o", "yaml")...)
		var fromYAML, fromJSON []any
		json.Unmarshal(jsonOut, &fromJSON)
		if err := yaml.Unmarshal([]byte(out), &fromYAML); code != cli.ExitFailed || err != nil || len(fromYAML) != 2 || !reflect.DeepEqual(fromYAML, fromJSON) {
			t.Fatalf("results -o yaml: exit %d, out %q (%v); want the array of -o json as YAML", code, out, err)
		}
		code, out, _ = run(t, "", as("alice-key-0123456789", "results", id, "-o", "table")...)
		if rows := strings.Split(strings.TrimSpace(out), "\n"); code != cli.ExitFailed || len(rows) != 3 || !strings.HasPrefix(rows[0], "INDEX") ||
			!strings.Contains(rows[1], "ok") || !strings.Contains(rows[2], "budget_exceeded") {
			t.Fatalf("results -o table: exit %d, out %q", code, out)
		}
		code, out, _ = run(t, "", as("alice-key-0123456789", "results", id, "--state", "completed")...)
		if code != 0 || strings.Count(out, "\n") != 1 || !strings.Contains(out, `"custom_id":"ok"`) {
			t.Fatalf("results --state completed: exit %d, out %q", code, out)
		}
		if code, _, errOut := run(t, "", as("alice-key-0123456789", "results", id, "--state", "done")...); code != cli.ExitUsage || !strings.Contains(errOut, "--state") {
			t.Fatalf("--state done: exit %d, stderr %q", code, errOut)
		}
		if code, _, errOut := run(t, "", as("bob-key-0123456789ab", "results", id)...); code != cli.ExitNotFound {
			t.Fatalf("bob reads alice's results: exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("delete a single task", func(t *testing.T) {
		code, b, _ := s.DoAs("alice-key-0123456789", "POST", "/v1/tasks?wait=10s", `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,0,6],[7,5,8]]}}`)
		if code != 200 {
			t.Fatalf("solve: %d %s", code, b)
		}
		tid := stacktest.Decode[apitype.Task](t, b).ID
		if code, _, errOut := run(t, "", as("bob-key-0123456789ab", "delete", tid)...); code != cli.ExitNotFound {
			t.Fatalf("bob deletes: exit %d, stderr %q", code, errOut)
		}
		for range 2 { // a repeat answers as the first
			if code, out, errOut := run(t, "", as("alice-key-0123456789", "delete", tid)...); code != 0 || out != tid+": deleted\n" {
				t.Fatalf("delete: exit %d, out %q, stderr %q", code, out, errOut)
			}
		}
		if code, _, errOut := run(t, "", as("alice-key-0123456789", "get", tid)...); code != cli.ExitNotFound {
			t.Fatalf("get after the delete: exit %d, stderr %q", code, errOut)
		}
		if code, _, errOut := run(t, "", as("alice-key-0123456789", "delete", id+"-0")...); code == 0 || !strings.Contains(errOut, "batches/"+id) {
			t.Fatalf("delete of a batch item: exit %d, stderr %q; want a refusal naming its batch", code, errOut)
		}
	})

	t.Run("list", func(t *testing.T) {
		code, out, errOut := run(t, "", as("alice-key-0123456789", "list", "--state", "failed")...)
		if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "failed") || !strings.HasPrefix(out, "ID") {
			t.Fatalf("list --state failed: exit %d, out %q, stderr %q", code, out, errOut)
		}
		code, out, _ = run(t, "", as("alice-key-0123456789", "list", "batches", "--state", "completed", "-o", "json")...)
		if code != 0 || out != "[]\n" {
			t.Fatalf("list batches --state completed: exit %d, out %q; want an empty array", code, out)
		}
		code, out, _ = run(t, "", as("alice-key-0123456789", "list", "batches", "--state", "completed", "-o", "yaml")...)
		if code != 0 || out != "[]\n" {
			t.Fatalf("list batches --state completed -o yaml: exit %d, out %q; want an empty sequence", code, out)
		}
		if code, out, _ := run(t, "", as("bob-key-0123456789ab", "list")...); code != 0 || strings.Contains(out, id) {
			t.Fatalf("bob's list: exit %d, out %q", code, out)
		}
		if code, _, _ := run(t, "", as("alice-key-0123456789", "list", "jobs")...); code != cli.ExitUsage {
			t.Fatalf("list jobs: exit %d", code)
		}
		if code, _, errOut := run(t, "1 0 3\n4 2 5\n7 8 6\n", as("alice-key-0123456789", "solve", "--format", "boj1525")...); code != 0 {
			t.Fatalf("solve: exit %d, stderr %q", code, errOut)
		}
		code, out, errOut = run(t, "", as("alice-key-0123456789", "list", "tasks", "--all", "-o", "json")...)
		var tasks []apitype.Task
		if err := json.Unmarshal([]byte(out), &tasks); code != 0 || err != nil || len(tasks) != 1 || tasks[0].Kind != "sliding" {
			t.Fatalf("list tasks --all -o json: exit %d, out %q (%v), stderr %q; want an array of the one task solve sent", code, out, err, errOut)
		}
		code, out, _ = run(t, "", as("alice-key-0123456789", "list", "tasks", "-o", "ndjson")...)
		var task apitype.Task
		if err := json.Unmarshal([]byte(out), &task); code != 0 || err != nil || task.ID != tasks[0].ID || strings.Count(out, "\n") != 1 {
			t.Fatalf("list tasks -o ndjson: exit %d, out %q (%v); want the task as one line", code, out, err)
		}
	})

	t.Run("retry and cancel", func(t *testing.T) {
		code, out, errOut := run(t, "", as("alice-key-0123456789", "batch", "retry", id)...)
		if code != 0 || !strings.Contains(out, "retrying 1 tasks") {
			t.Fatalf("batch retry: exit %d, out %q, stderr %q", code, out, errOut)
		}
		code, out, _ = run(t, "", as("alice-key-0123456789", "batch", id, "--watch", "--timeout", "30s", "-o", "json")...)
		var doc struct {
			Counts apitype.Counts `json:"counts"`
			Done   bool           `json:"done"`
		}
		if err := json.Unmarshal([]byte(out), &doc); code != cli.ExitFailed || err != nil || doc.Counts.Failed != 1 || !doc.Done {
			t.Fatalf("batch --watch -o json after the retry: exit %d, out %q (%v); want the final counts as one document", code, out, err)
		}
		if code, _, errOut := run(t, "", as("bob-key-0123456789ab", "batch", "retry", id)...); code != cli.ExitNotFound || !strings.Contains(errOut, "--api-key") {
			t.Fatalf("bob retries: exit %d, stderr %q", code, errOut)
		}
		// One item: the failed one runs again under its ID; the
		// completed one is a conflict.
		code, out, errOut = run(t, "", as("alice-key-0123456789", "retry", id+"-1", "-o", "json")...)
		var tk apitype.Task
		if err := json.Unmarshal([]byte(out), &tk); code != 0 || err != nil || tk.ID != id+"-1" || tk.CustomID == nil || *tk.CustomID != "bad" {
			t.Fatalf("retry of the failed item: exit %d, out %q (%v), stderr %q", code, out, err, errOut)
		}
		if code, _, errOut := run(t, "", as("alice-key-0123456789", "retry", id+"-0")...); code != cli.ExitConflict || !strings.Contains(errOut, "completed") {
			t.Fatalf("retry of the completed item: exit %d, stderr %q; want %d", code, errOut, cli.ExitConflict)
		}
		code, out, _ = run(t, "", as("alice-key-0123456789", "batch", id, "--watch", "--timeout", "30s", "-o", "json")...)
		if err := json.Unmarshal([]byte(out), &doc); code != cli.ExitFailed || err != nil || doc.Counts.Failed != 1 || doc.Counts.Completed != 1 || !doc.Done {
			t.Fatalf("batch --watch after the item's retry: exit %d, out %q (%v)", code, out, err)
		}
		code, out, errOut = run(t, "", as("alice-key-0123456789", "batch", "cancel", id)...)
		if code != cli.ExitConflict || !strings.Contains(errOut, "409") {
			t.Fatalf("batch cancel of a done batch: exit %d, out %q, stderr %q; want %d", code, out, errOut, cli.ExitConflict)
		}
		// Done, it can be deleted, by its owner alone; then it is not
		// found.
		if code, _, errOut := run(t, "", as("bob-key-0123456789ab", "batch", "delete", id)...); code != cli.ExitNotFound {
			t.Fatalf("bob deletes: exit %d, stderr %q", code, errOut)
		}
		code, out, errOut = run(t, "", as("alice-key-0123456789", "batch", "delete", id, "-o", "json")...)
		var del struct {
			ID      string `json:"id"`
			Deleted bool   `json:"deleted"`
		}
		if err := json.Unmarshal([]byte(out), &del); code != 0 || err != nil || del.ID != id || !del.Deleted {
			t.Fatalf("batch delete: exit %d, out %q (%v), stderr %q", code, out, err, errOut)
		}
		if code, _, errOut := run(t, "", as("alice-key-0123456789", "batch", id)...); code != cli.ExitNotFound {
			t.Fatalf("batch after its delete: exit %d, stderr %q; want %d", code, errOut, cli.ExitNotFound)
		}
	})

	t.Run("auth", func(t *testing.T) {
		code, _, errOut := run(t, "", "--server", s.URL, "list")
		if code != cli.ExitNotFound || !strings.Contains(errOut, "--api-key") || !strings.Contains(errOut, "PUZZLEQ_API_KEY") {
			t.Fatalf("no key: exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("health and waits without a worker", func(t *testing.T) {
		if code, out, errOut := run(t, "", as("alice-key-0123456789", "health")...); code != 0 || !strings.Contains(out, "1 worker alive (") {
			t.Fatalf("health with a worker: exit %d, out %q, stderr %q", code, out, errOut)
		}
		if err := s.StopWorkers(); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := run(t, "", as("alice-key-0123456789", "health")...)
		if code != cli.ExitFailed || !strings.Contains(errOut, "no worker is alive") {
			t.Fatalf("health without a worker: exit %d, out %q, stderr %q", code, out, errOut)
		}
		// A wait that nothing ends stops at --timeout.
		one := filepath.Join(t.TempDir(), "one.jsonl")
		os.WriteFile(one, []byte(failingLine+"\n"), 0o644)
		start := time.Now()
		code, _, errOut = run(t, "", as("alice-key-0123456789", "submit", "-f", one, "--wait", "--timeout", "1s")...)
		if code != cli.ExitTimeout || !strings.Contains(errOut, "no worker is alive") || !strings.Contains(errOut, "accepted (lines 1-1)") ||
			time.Since(start) > 20*time.Second {
			t.Fatalf("submit --wait without a worker: exit %d after %s, stderr %q", code, time.Since(start), errOut)
		}
		code, out, _ = run(t, "", as("alice-key-0123456789", "list", "--state", "pending", "-o", "json")...)
		var pending []apitype.BatchSummary
		if code != 0 || json.Unmarshal([]byte(out), &pending) != nil || len(pending) == 0 || pending[0].State != apitype.TaskStatePending {
			t.Fatalf("list --state pending: exit %d, out %q", code, out)
		}
		b := pending[0]
		code, _, errOut = run(t, "", as("alice-key-0123456789", "batch", b.ID, "--watch", "--timeout", "500ms")...)
		if code != cli.ExitTimeout || !strings.Contains(errOut, "--timeout 500ms passed") {
			t.Fatalf("batch --watch --timeout: exit %d, stderr %q", code, errOut)
		}
		code, _, errOut = run(t, "", as("alice-key-0123456789", "get", b.ID+"-0", "--wait", "--timeout", "500ms")...)
		if code != cli.ExitTimeout || !strings.Contains(errOut, "--timeout 500ms passed") {
			t.Fatalf("get --wait --timeout: exit %d, stderr %q", code, errOut)
		}
		code, out, _ = run(t, "", as("alice-key-0123456789", "batch", "cancel", b.ID)...)
		if code != 0 || !strings.Contains(out, "canceled 1 tasks") {
			t.Fatalf("batch cancel: exit %d, out %q", code, out)
		}
		// Interrupted (Ctrl-C cancels Run's context): 130, whichever
		// command it stops.
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(300*time.Millisecond, cancel)
		code, _, errOut = runCtx(ctx, "", as("alice-key-0123456789", "get", b.ID+"-0", "--wait")...)
		if code != cli.ExitFailed {
			t.Fatalf("get --wait of the canceled item: exit %d, stderr %q", code, errOut)
		}
		ctx, cancel = context.WithCancel(context.Background())
		time.AfterFunc(300*time.Millisecond, cancel)
		code, _, errOut = runCtx(ctx, "", as("alice-key-0123456789", "submit", "-f", one, "--wait", "--run-id", "interrupt")...)
		if code != cli.ExitInterrupted || !strings.Contains(errOut, "interrupted") {
			t.Fatalf("interrupted submit --wait: exit %d, stderr %q", code, errOut)
		}
	})
}

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := run(t, "", args...)
		if code != 0 || !strings.HasPrefix(out, "puzzlectl ") || len(out) < 15 {
			t.Errorf("%v: exit %d, out %q, stderr %q", args, code, out, errOut)
		}
	}
}

// TestLocalSolveKeepsPDBsInTheCacheDir: solve --local writes the pattern
// databases of a searched board to os.UserCacheDir()/puzzleq, where the
// next run reads them instead of building them again.
func TestLocalSolveKeepsPDBsInTheCacheDir(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache) // os.UserCacheDir on Linux
	t.Setenv("HOME", cache)           // and on macOS
	t.Setenv("PDB_DIR", "")           // which $PDB_DIR would override
	req := `{"kind":"sliding","puzzle":{"board":[[1,2,3,4,5],[6,7,8,0,9]]}}` + "\n"
	for range 2 {
		code, out, errOut := run(t, req, "solve", "--local", "--format", "json")
		if code != 0 || !strings.Contains(out, `"moves":1`) {
			t.Fatalf("solve --local: exit %d, out %q, stderr %q", code, out, errOut)
		}
	}
	files, _ := filepath.Glob(filepath.Join(cache, "*", "puzzleq", "sliding-2x5-*"))
	more, _ := filepath.Glob(filepath.Join(cache, "puzzleq", "sliding-2x5-*"))
	if len(files)+len(more) != 2 {
		t.Fatalf("pattern database files in the cache directory: %v %v, want the two of 2x5", files, more)
	}
}
