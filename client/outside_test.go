package client_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// TestClientFromAnotherModule builds testdata/outside, a module of its own
// that requires this one as a user's program does, and runs it against a
// real stack: the client and the solvers' request and result types are
// importable from outside the repository, the program links nothing
// under puzzleq's internal/, and a typed solve works end to end.
func TestClientFromAnotherModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// A copy, so that the build's go.sum (the repository's, which covers
	// every module the client needs) never lands in the checkout.
	dir := t.TempDir()
	for _, f := range []string{"go.mod", "main.go"} {
		b, err := os.ReadFile(filepath.Join("testdata", "outside", f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "go.mod" {
			b = []byte(strings.Replace(string(b), "=> ../../..", "=> "+root, 1))
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	gobin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	bin := filepath.Join(dir, "outside")
	build := exec.Command(gobin, "build", "-o", bin, ".")
	build.Dir = dir
	// scripts/build.sh's configuration (stacktest.BuildEnv, -trimpath), which
	// the rest of the run has compiled the standard library for.
	build.Env = append(append(os.Environ(), stacktest.BuildEnv...), "GOWORK=off", "GOFLAGS=-mod=mod -trimpath")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build the outside module: %v\n%s", err, out)
	}
	list := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}}", ".")
	list.Dir, list.Env = dir, build.Env
	deps, err := list.Output()
	if err != nil {
		t.Fatalf("go list the outside module: %v", err)
	}
	var own int
	for _, p := range strings.Fields(string(deps)) {
		if strings.HasPrefix(p, "github.com/puzzleq/puzzleq/") {
			own++
		}
		if strings.HasPrefix(p, "github.com/puzzleq/puzzleq/internal/") {
			t.Errorf("the client's program links %s", p)
		}
	}
	if own < 3 {
		t.Errorf("the outside program links %d of puzzleq's packages; is it built from this checkout?\n%s", own, deps)
	}

	s := stacktest.StartWith(t, 1, map[string]string{"KEY_PREFIX": "coutside:"})
	out, err := exec.Command(bin, s.URL).CombinedOutput()
	if err != nil || string(out) != "3 DRD\n" {
		t.Fatalf("the outside program: %v, printed %q; want \"3 DRD\\n\"", err, out)
	}
}
