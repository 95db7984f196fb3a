package app

import (
	"io"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"testing"
)

// The soft limit is 90% of the container's, from cgroup v2 or v1; no
// limit, or GOMEMLIMIT set, leaves the runtime alone.
func TestSetMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	files := func(m map[string]string) func(string) ([]byte, error) {
		return func(name string) ([]byte, error) {
			if v, ok := m[name]; ok {
				return []byte(v), nil
			}
			return nil, os.ErrNotExist
		}
	}
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, c := range []struct {
		name  string
		env   map[string]string
		files map[string]string
		want  int64
	}{
		{"cgroup v2", nil, map[string]string{"/sys/fs/cgroup/memory.max": "536870912\n"}, 483183820},
		{"cgroup v1", nil, map[string]string{"/sys/fs/cgroup/memory/memory.limit_in_bytes": "1073741824\n"}, 966367641},
		{"v2 unlimited", nil, map[string]string{"/sys/fs/cgroup/memory.max": "max\n"}, 0},
		{"v1 unlimited", nil, map[string]string{"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"no cgroup", nil, nil, 0},
		{"GOMEMLIMIT wins", map[string]string{"GOMEMLIMIT": "100MiB"}, map[string]string{"/sys/fs/cgroup/memory.max": "536870912"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			got := SetMemoryLimit(env(c.env), files(c.files), log)
			if got != c.want {
				t.Fatalf("SetMemoryLimit = %d, want %d", got, c.want)
			}
			want := c.want
			if want == 0 {
				want = math.MaxInt64
			}
			if rt := debug.SetMemoryLimit(-1); rt != want {
				t.Errorf("the runtime's limit is %d, want %d", rt, want)
			}
		})
	}
}
