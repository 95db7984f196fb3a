package deploy_test

import (
	"bytes"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDockerfile checks the image's shape: a multi-stage build whose
// final stage is distroless static or scratch, run as a non-root user,
// with exec-form commands (there is no shell), and a .dockerignore that
// keeps what the build needs.
func TestDockerfile(t *testing.T) {
	d, err := parseDockerfile(readFile(t, filepath.Join(root, "Dockerfile")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(d.finalFrom, "gcr.io/distroless/static") && d.finalFrom != "scratch" {
		t.Errorf("final stage FROM %s, want distroless static or scratch", d.finalFrom)
	}
	if u := strings.SplitN(d.finalUser, ":", 2)[0]; u == "" || u == "0" || u == "root" {
		t.Errorf("final stage USER %q, want a non-root user", d.finalUser)
	}
	if !strings.HasPrefix(d.cmd, "[") {
		t.Errorf("CMD %s is not in exec form: the image has no shell", d.cmd)
	}
	if d.copyTarget == "" {
		t.Errorf("the final stage does not copy the binaries")
	}

	var ignore []string
	for _, line := range strings.Split(readFile(t, filepath.Join(root, ".dockerignore")), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			ignore = append(ignore, line)
		}
	}
	for _, need := range []string{"go.mod", "go.sum", "scripts/build.sh", "cmd/api/main.go", "internal/app/api.go", "tasks/tasks.go"} {
		for _, pat := range ignore {
			if m, _ := filepath.Match(pat, need); m || strings.HasPrefix(need, strings.TrimSuffix(pat, "/")+"/") {
				t.Errorf(".dockerignore pattern %q drops %s, which the build needs", pat, need)
			}
		}
	}
}

// TestBuildScriptMakesStaticBinaries runs the Dockerfile's build step,
// scripts/build.sh, and checks that every binary is statically linked
// (no interpreter, no dynamic section) and carries no build paths.
func TestBuildScriptMakesStaticBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	_, bins := imageBinaries(t)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "scripts/build.sh", out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/build.sh: %v\n%s", err, b)
	}
	abs, _ := filepath.Abs(root)
	for _, name := range keys(bins) {
		p := filepath.Join(out, name)
		f, err := elf.Open(p)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP || prog.Type == elf.PT_DYNAMIC {
				t.Errorf("%s: has %s: not a static binary", name, prog.Type)
			}
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("%s: links %v", name, libs)
		}
		f.Close()
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(abs+"/")) {
			t.Errorf("%s: contains the build path %s: not built with -trimpath", name, abs)
		}
	}
	if entries, _ := os.ReadDir(out); len(entries) != len(bins) {
		t.Errorf("build made %d files, want %d (%v)", len(entries), len(bins), keys(bins))
	}
}
