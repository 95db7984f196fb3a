//go:build unix

package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/cli"
)

// TestConfigFileThatIsNotAFile points puzzlectl's config at a FIFO, at a
// path under a regular file, and through symbolic links: a FIFO is
// refused at once (opening one would block for good), a config that
// cannot be saved is a usage error that names the file, and a linked
// config file is written through its link, which stays a link. It sets
// environment variables, so it does not run in parallel.
func TestConfigFileThatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("PUZZLEQ_URL", "")
	t.Setenv("PUZZLEQ_API_KEY", "")
	runIn := func(args ...string) (int, string, string) {
		t.Helper()
		type res struct {
			code     int
			out, err string
		}
		done := make(chan res, 1)
		go func() {
			code, out, errOut := run(t, "", args...)
			done <- res{code, out, errOut}
		}()
		select {
		case r := <-done:
			return r.code, r.out, r.err
		case <-time.After(10 * time.Second):
			t.Fatalf("%v: no answer in 10 s", args)
			return 0, "", ""
		}
	}

	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "to-fifo.yaml")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, link} {
		t.Setenv("PUZZLECTL_CONFIG", p)
		for _, args := range [][]string{{"config", "get-contexts"}, {"config", "set-context", "a", "--server", "http://x"}, {"--retries", "0", "list"}} {
			if code, _, errOut := runIn(args...); code != cli.ExitUsage || !strings.Contains(errOut, "not a regular file") {
				t.Errorf("%s, %v: exit %d, stderr %q; want 2 and the file refused", p, args, code, errOut)
			}
		}
	}

	file := filepath.Join(dir, "plain")
	os.WriteFile(file, nil, 0o600)
	t.Setenv("PUZZLECTL_CONFIG", filepath.Join(file, "config.yaml"))
	if code, _, errOut := runIn("config", "set-context", "a", "--server", "http://x"); code != cli.ExitUsage || !strings.Contains(errOut, "config file") {
		t.Errorf("a config under a regular file: exit %d, stderr %q; want 2 naming the config file", code, errOut)
	}

	// Through a link, existing or dangling: the link stays, the file it
	// names is written.
	os.MkdirAll(filepath.Join(dir, "dotfiles"), 0o700)
	for _, target := range []string{"exists.yaml", "dangling.yaml"} {
		real := filepath.Join(dir, "dotfiles", target)
		if target == "exists.yaml" {
			os.WriteFile(real, []byte("contexts: []\n"), 0o600)
		}
		ln := filepath.Join(dir, "link-"+target)
		if err := os.Symlink(filepath.Join("dotfiles", target), ln); err != nil { // relative, as dotfile managers make them
			t.Fatal(err)
		}
		t.Setenv("PUZZLECTL_CONFIG", ln)
		if code, _, errOut := runIn("config", "set-context", "a", "--server", "http://x"); code != 0 {
			t.Fatalf("set-context through a link to %s: exit %d, stderr %q", target, code, errOut)
		}
		if fi, err := os.Lstat(ln); err != nil || fi.Mode().Type() != os.ModeSymlink {
			t.Errorf("the link to %s was replaced: %v, %v", target, fi.Mode(), err)
		}
		if b, err := os.ReadFile(real); err != nil || !strings.Contains(string(b), "http://x") {
			t.Errorf("the file the link names, %s: %q, %v; want the context written", target, b, err)
		}
	}
}
