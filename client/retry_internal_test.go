package client

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestServerClosedIdleText holds serverClosedIdle to net/http's own text:
// the error is unexported, so the client matches its message, and a Go
// release that rewords it would silently turn the retry off. The race
// that returns it (an idle connection closed by the server just as a
// request goes out on it) cannot be produced on demand, so the source of
// the Go that builds this test is read instead.
func TestServerClosedIdleText(t *testing.T) {
	root, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Skipf("no go command to find the Go source with: %v", err)
	}
	src := filepath.Join(strings.TrimSpace(string(root)), "src", "net", "http", "transport.go")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Skipf("no Go source to check against: %v", err)
	}
	const decl = `errServerClosedIdle = errors.New("http: server closed idle connection")`
	if !strings.Contains(string(b), decl) {
		t.Fatalf("%s no longer declares %s: serverClosedIdle must follow it", src, decl)
	}
	// As http.Client returns it: wrapped in a *url.Error.
	wrapped := &url.Error{Op: "Post", URL: "http://api/v1/tasks", Err: errors.New("http: server closed idle connection")}
	if !serverClosedIdle(wrapped) || !notConnected(fmt.Errorf("submit: %w", wrapped)) {
		t.Fatal("the wrapped error is not recognised")
	}
	if serverClosedIdle(errors.New("http: server closed idle connection and more")) {
		t.Fatal("a longer message matched")
	}
}
