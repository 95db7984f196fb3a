package webhook_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/webhook"
)

// TestVerifyFromAnotherModule builds testdata/receiver, a module of its
// own that requires this one, as a receiver's program does, and has it
// verify a webhook signed here: the package is importable from outside
// the repository, and Verify there accepts what the server signs and
// refuses a changed body.
func TestVerifyFromAnotherModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	gobin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	bin := filepath.Join(t.TempDir(), "receiver")
	build := exec.Command(gobin, "build", "-o", bin, ".")
	build.Dir = filepath.Join("testdata", "receiver")
	// scripts/build.sh's configuration (no cgo, -trimpath), which the rest of
	// the run has compiled the standard library for.
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=mod -trimpath")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build the outside module: %v\n%s", err, out)
	}

	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	s, err := webhook.ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"type":"batch.done","data":{"id":"b1"}}`)
	ts := time.Now().Unix()
	sig := s.Sign("msg_b_1", ts, body)
	run := func(body []byte) error {
		cmd := exec.Command(bin, secret, "msg_b_1", strconv.FormatInt(ts, 10), sig)
		cmd.Stdin = bytes.NewReader(body)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("receiver: %s", out)
		}
		return err
	}
	if err := run(body); err != nil {
		t.Errorf("the signed body: %v, want verified", err)
	}
	if err := run(append(body, ' ')); err == nil {
		t.Error("a changed body verified")
	}
}
