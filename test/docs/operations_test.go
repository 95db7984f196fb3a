package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/app"
)

// runtimeEnv are settings docs/operations.md lists that the Go runtime
// reads, not puzzleq's configuration.
var runtimeEnv = []string{"GOMEMLIMIT", "GOGC"}

// TestOperationsListsEverySetting holds docs/operations.md's settings
// tables to the binaries' configuration: every environment variable the
// API or the worker reads has a row, every row names a variable one of
// them reads, and its "binaries" column says which.
func TestOperationsListsEverySetting(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := settingsInTables(t, string(doc))

	read := map[string]bool{}
	for _, v := range append(app.APIEnv(), app.WorkerEnv()...) {
		read[v] = true
	}
	for v, bins := range documented {
		if slices.Contains(runtimeEnv, v) || !read[v] {
			continue
		}
		api, worker := slices.Contains(app.APIEnv(), v), slices.Contains(app.WorkerEnv(), v)
		want := map[[2]bool]string{{true, true}: "both", {true, false}: "API", {false, true}: "worker"}[[2]bool{api, worker}]
		if bins != want {
			t.Errorf("docs/operations.md says %s is read by %q; it is read by %q", v, bins, want)
		}
	}
	for v := range read {
		if _, ok := documented[v]; !ok {
			t.Errorf("%s is read by the binaries (internal/app/config.go) and missing from docs/operations.md's settings", v)
		}
	}
	for v := range documented {
		if !read[v] && !slices.Contains(runtimeEnv, v) {
			t.Errorf("docs/operations.md lists %s, which no binary reads", v)
		}
	}
}

// settingsInTables returns the variables named in the first column of the
// tables under "## Settings", each with its row's "binaries" column.
func settingsInTables(t *testing.T, doc string) map[string]string {
	t.Helper()
	name := regexp.MustCompile("`([A-Z][A-Z0-9_]*)`")
	out := map[string]string{}
	in := false
	for _, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(l, "## ") {
			in = l == "## Settings"
			continue
		}
		if !in || !strings.HasPrefix(l, "| `") {
			continue
		}
		cells := strings.Split(strings.TrimPrefix(l, "|"), "|")
		if len(cells) < 4 {
			t.Fatalf("docs/operations.md: a settings row without its columns: %s", l)
		}
		for _, m := range name.FindAllStringSubmatch(cells[0], -1) {
			out[m[1]] = strings.TrimSpace(cells[2])
		}
	}
	if len(out) < 20 {
		t.Fatalf("found %d settings in docs/operations.md's \"## Settings\" tables; the parser or the page is wrong", len(out))
	}
	return out
}
