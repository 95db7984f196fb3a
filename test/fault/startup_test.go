//go:build fault

package fault

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestStartupRefusesWeakKeys runs the real api binary with keys it must
// refuse: it exits 1 at once, naming the setting, without listening and
// without showing the key.
func TestStartupRefusesWeakKeys(t *testing.T) {
	const long = "0123456789abcdef-long-key"
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"short tenant key", []string{"API_KEYS=alice:s3cret"}, "API_KEYS: alice's key is 6 bytes"},
		{"short operator key", []string{"OPERATOR_KEYS=ops:t0ken"}, "OPERATOR_KEYS: ops's key is 5 bytes"},
		{"one secret, two names", []string{"API_KEYS=alice:" + long + ",bob:" + long}, "API_KEYS: bob has the same key as alice"},
		{"tenant key reused as operator", []string{"API_KEYS=alice:" + long, "OPERATOR_KEYS=ops:" + long}, "OPERATOR_KEYS: ops has the same key as alice"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := exec.CommandContext(ctx, apiBin)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HTTP_ADDR=" + freeAddr(t)}, tc.env...)
		out, err := cmd.CombinedOutput()
		cancel()
		var ee *exec.ExitError
		switch {
		case !errors.As(err, &ee) || ee.ExitCode() != 1:
			t.Errorf("%s: exit %v, want status 1; output %.300s", tc.name, err, out)
		case !strings.Contains(string(out), tc.want):
			t.Errorf("%s: output %q, want %q", tc.name, out, tc.want)
		case strings.Contains(string(out), long) || strings.Contains(string(out), "s3cret") || strings.Contains(string(out), "t0ken"):
			t.Errorf("%s: the output shows the key: %s", tc.name, out)
		}
	}
}
