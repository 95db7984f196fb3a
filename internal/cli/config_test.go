package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/cli"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// TestContextsAndCompletion drives the config file's contexts and shell
// completion against a real stack: which server and key a command uses,
// in which order flags, environment and contexts win, that no key is ever
// printed, and that completion offers the key's own tasks and batches.
// It sets environment variables, so it does not run in parallel.
func TestContextsAndCompletion(t *testing.T) {
	s := stacktest.Start(t, stacktest.Options{Workers: 1, Env: map[string]string{"API_KEYS": "alice:alice-key-0123456789,bob:bob-key-0123456789ab"}})
	cfg := filepath.Join(t.TempDir(), "puzzlectl", "config.yaml")
	t.Setenv("PUZZLECTL_CONFIG", cfg)
	t.Setenv("PUZZLEQ_URL", "")
	t.Setenv("PUZZLEQ_API_KEY", "")
	const dead = "http://127.0.0.1:1" // nothing listens on port 1
	mustRun := func(stdin string, args ...string) string {
		t.Helper()
		code, out, errOut := run(t, stdin, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
		return out
	}
	wantExit := func(want int, args ...string) string {
		t.Helper()
		code, out, errOut := run(t, "", args...)
		if code != want {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q; want exit %d", args, code, out, errOut, want)
		}
		return errOut
	}

	// Without a config file nothing changes: the default server.
	if errOut := wantExit(cli.ExitUnreachable, "--retries", "0", "list"); !strings.Contains(errOut, "localhost:8080") {
		t.Fatalf("no config: stderr %q; want the default server named", errOut)
	}

	mustRun("", "config", "set-context", "alice", "--server", s.URL, "--api-key", "alice-key-0123456789")
	mustRun("", "config", "set-context", "dead", "--server", dead)
	if fi, err := os.Stat(cfg); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("config file: %v, mode %v; want it readable by its owner only", err, fi.Mode())
	}
	if got := mustRun("", "config", "current-context"); got != "alice\n" {
		t.Fatalf("current-context %q; want the first context created", got)
	}

	// The current context gives server and key.
	out := mustRun("1 0 3\n4 2 5\n7 8 6\n", "solve", "--format", "boj1525")
	if out != "3\n" {
		t.Fatalf("solve through the current context printed %q", out)
	}
	in := filepath.Join(t.TempDir(), "jobs.jsonl")
	os.WriteFile(in, []byte(`{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}`+"\n"), 0o644)
	var sub struct {
		Batch string `json:"batch"`
	}
	if err := json.Unmarshal([]byte(mustRun("", "submit", "-f", in)), &sub); err != nil || sub.Batch == "" {
		t.Fatalf("submit through the context: %v", err)
	}

	// Keys are never printed; which context is current is.
	out = mustRun("", "config", "get-contexts")
	rows := strings.Split(out, "\n")
	if strings.Contains(out, "alice-key") || len(rows) != 4 || strings.Join(strings.Fields(rows[1]), " ") != "* alice "+s.URL+" set" ||
		strings.Join(strings.Fields(rows[2]), " ") != "dead "+dead+" -" {
		t.Fatalf("get-contexts printed %q", out)
	}
	var docs []struct {
		Name    string `json:"name"`
		HasKey  bool   `json:"api_key_set"`
		Current bool   `json:"current"`
	}
	out = mustRun("", "config", "get-contexts", "-o", "json")
	if err := json.Unmarshal([]byte(out), &docs); err != nil || len(docs) != 2 || !docs[0].HasKey || !docs[0].Current || docs[1].HasKey || strings.Contains(out, "alice-key") {
		t.Fatalf("get-contexts -o json printed %q (%v)", out, err)
	}

	// Order: --server beats everything; --context beats the environment;
	// the environment beats the current context.
	mustRun("", "--context", "dead", "--server", s.URL, "--api-key", "alice-key-0123456789", "list")
	wantExit(cli.ExitUnreachable, "--context", "dead", "--retries", "0", "list")
	t.Setenv("PUZZLEQ_URL", dead)
	wantExit(cli.ExitUnreachable, "--retries", "0", "list")
	if out := mustRun("", "--context", "alice", "list", "-o", "json"); !strings.Contains(out, sub.Batch) {
		t.Fatalf("--context alice over $PUZZLEQ_URL listed %q", out)
	}
	t.Setenv("PUZZLEQ_URL", "")
	t.Setenv("PUZZLEQ_API_KEY", "bob-key-0123456789ab")
	if out := mustRun("", "list", "-o", "json"); out != "[]\n" {
		t.Fatalf("$PUZZLEQ_API_KEY (bob) over the context's key listed %q; want bob's empty list", out)
	}
	t.Setenv("PUZZLEQ_API_KEY", "")

	// A context's key goes only to that context's server: with the
	// server from the environment, the current context's key stays home
	// (the API refuses the keyless request: 401, exit 4).
	mustRun("", "config", "set-context", "elsewhere", "--server", dead, "--api-key", "alice-key-0123456789")
	mustRun("", "config", "use-context", "elsewhere")
	t.Setenv("PUZZLEQ_URL", s.URL)
	wantExit(cli.ExitNotFound, "list")
	t.Setenv("PUZZLEQ_URL", "")
	mustRun("", "config", "use-context", "alice")
	mustRun("", "config", "delete-context", "elsewhere")

	// Without a config directory ($HOME unset, as under cron or in a
	// bare container), the flags and environment alone still work.
	t.Setenv("PUZZLECTL_CONFIG", "")
	t.Setenv("HOME", "")
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("PUZZLEQ_URL", s.URL)
	t.Setenv("PUZZLEQ_API_KEY", "alice-key-0123456789")
	if out := mustRun("", "list", "-o", "json"); !strings.Contains(out, sub.Batch) {
		t.Fatalf("list without a config directory: %q", out)
	}
	wantExit(cli.ExitUsage, "--context", "alice", "list")
	t.Setenv("PUZZLECTL_CONFIG", cfg)
	t.Setenv("PUZZLEQ_URL", "")
	t.Setenv("PUZZLEQ_API_KEY", "")

	// Shell completion offers the key's own IDs, and the flags' values.
	if out := mustRun("", "__complete", "results", ""); !strings.Contains(out, sub.Batch+"\t") {
		t.Fatalf("completion of a batch ID: %q; want %s", out, sub.Batch)
	}
	if out := mustRun("", "__complete", "get", ""); strings.Count(out, "\tsliding completed") != 1 {
		t.Fatalf("completion of a task ID: %q; want the one task solve sent", out)
	}
	if out := mustRun("", "__complete", "--context", "dead", "get", ""); strings.Contains(out, "\t") {
		t.Fatalf("completion against a dead server: %q; want nothing", out)
	}
	if out := mustRun("", "__complete", "list", "-o", ""); !strings.Contains(out, "yaml\n") || !strings.Contains(out, "ndjson\n") {
		t.Fatalf("completion of -o: %q", out)
	}
	if out := mustRun("", "__complete", "config", "use-context", ""); !strings.Contains(out, "alice\t") || !strings.Contains(out, "dead\t") {
		t.Fatalf("completion of a context: %q", out)
	}

	// Mistakes are usage errors that name what is wrong.
	if errOut := wantExit(cli.ExitUsage, "--context", "nope", "list"); !strings.Contains(errOut, `"nope"`) {
		t.Fatalf("unknown context: stderr %q", errOut)
	}
	wantExit(cli.ExitUsage, "config", "use-context", "nope")
	wantExit(cli.ExitUsage, "config", "set-context", "x", "--server", "localhost:8080")
	mustRun("", "config", "use-context", "dead")
	mustRun("", "config", "delete-context", "dead")
	if errOut := wantExit(cli.ExitUsage, "config", "current-context"); !strings.Contains(errOut, "use-context") {
		t.Fatalf("current-context after deleting it: stderr %q", errOut)
	}
	os.WriteFile(cfg, []byte("contexts: [\n"), 0o600)
	if errOut := wantExit(cli.ExitUsage, "list"); !strings.Contains(errOut, cfg) {
		t.Fatalf("a broken config file: stderr %q; want the file named", errOut)
	}
	// A field it does not know (written by a newer puzzlectl) is ignored.
	os.WriteFile(cfg, []byte("current-context: a\ncolour: blue\ncontexts:\n- name: a\n  server: "+s.URL+"\n  api-key: alice-key-0123456789\n  colour: red\n"), 0o600)
	mustRun("", "list")
}
