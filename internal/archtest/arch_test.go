package archtest

import (
	"bytes"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const module = "github.com/puzzleq/puzzleq"

// root is the module's directory, two levels above this package.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", dir, err)
	}
	return dir
}

// mayImportInternal reports whether package path (relative to the module)
// may import the module's internal/ packages: the binaries under cmd/,
// internal/ itself, and the test suites under test/. Every other package
// is public, and a public package that imported internal/ could not be
// used by the module's users, whose builds cannot import it.
func mayImportInternal(rel string) bool {
	for _, p := range []string{"internal", "cmd", "test"} {
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	return false
}

// TestPublicPackagesImportNoInternal lists every package's imports (test
// files aside: those build only inside this module) with go list, with the
// build tags of the fault and cluster suites so that no file is left out.
func TestPublicPackagesImportNoInternal(t *testing.T) {
	gobin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	cmd := exec.Command(gobin, "list", "-tags", "fault,k8s", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = root(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		rel := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		if mayImportInternal(rel) {
			continue
		}
		checked++
		for _, imp := range f[1:] {
			if imp == module+"/internal" || strings.HasPrefix(imp, module+"/internal/") {
				t.Errorf("public package %s imports %s", f[0], imp)
			}
		}
	}
	if checked < 5 {
		t.Fatalf("checked %d public packages; go list found too few", checked)
	}
}

// historyInComments are what a comment in non-test code must not say: it
// states why the code is as it is, in the present tense. Issue numbers
// name a tracker outside the repository, dates and narration go stale,
// and git holds the history. A date followed by a time is a format's
// example (an RFC 3339 stamp), not history.
var historyInComments = []*regexp.Regexp{
	regexp.MustCompile(`(?i)\bissues? #?\d+`),
	regexp.MustCompile(`(?:^|[^\w&/])#\d+\b`),
	regexp.MustCompile(`\b20\d\d-[01]\d(?:-[0-3]\d(?:[^T\d]|$)|[^-\d]|$)`),
	regexp.MustCompile(`(?i)\b\d{1,2} (January|February|March|April|May|June|July|August|September|October|November|December)\b`),
	regexp.MustCompile(`(?i)\b(January|February|March|April|May|June|July|August|September|October|November|December) \d{1,2}\b`),
	regexp.MustCompile(`(?i)\b(used to|previously|no longer|formerly|until recently)\b`),
	regexp.MustCompile(`(?i)\bbefore (issue|this change|the fix|the change)\b`),
}

// TestCommentsSayWhyInThePresent reads every comment of every non-test
// Go file in the module (testdata aside) and reports each that cites an
// issue, a date or the code's history.
func TestCommentsSayWhyInThePresent(t *testing.T) {
	dir := root(t)
	files := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		rel, _ := filepath.Rel(dir, path)
		for _, g := range f.Comments {
			for _, c := range g.List {
				for _, re := range historyInComments {
					if m := re.FindString(c.Text); m != "" {
						t.Errorf("%s:%d: comment says %q: state the why in the present tense", rel, fset.Position(c.Pos()).Line, strings.TrimSpace(m))
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("read %d Go files; the walk missed the module", files)
	}
}

// TestHistoryPatterns holds the patterns to what they are for.
func TestHistoryPatterns(t *testing.T) {
	for _, bad := range []string{
		"// see issue 12", "// (Issue 13)", "// fixed in #42", "// on 2026-11-30 the run", "// the 2026-11 runs", "// since 1 December",
		"// December 1 run", "// it used to poll", "// previously a pipeline", "// no longer needed", "// before issue 12",
	} {
		if !matchesAny(bad) {
			t.Errorf("%q passes", bad)
		}
	}
	for _, good := range []string{
		"// stamp: \"(devel) 1a6e97c 2006-01-02T15:04:05Z dirty\"", "// a task that ended before it was written",
		"// HTML entity &#39;", "// KEYS[1] the task hash", "// item 12 of the batch",
	} {
		if matchesAny(good) {
			t.Errorf("%q is flagged", good)
		}
	}
}

func matchesAny(s string) bool {
	for _, re := range historyInComments {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}
