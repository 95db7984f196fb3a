package app

import (
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// Where a container's memory limit is found, inside the container: cgroup
// v2 first, then v1. Kubernetes and Docker mount the container's own
// cgroup at /sys/fs/cgroup.
var cgroupLimitFiles = []string{
	"/sys/fs/cgroup/memory.max",
	"/sys/fs/cgroup/memory/memory.limit_in_bytes",
}

// memoryLimitShare is the part of the container's limit given to the Go
// heap's soft limit: the rest is for what the runtime does not count
// (thread stacks, fragmentation, the binary's own pages), so that the GC
// works harder before the kernel's OOM killer does.
const memoryLimitShare = 0.9

// SetMemoryLimit gives the Go runtime a soft memory limit of 90% of the
// container's memory limit (the cgroup's memory.max, or
// memory.limit_in_bytes under cgroup v1), unless GOMEMLIMIT is set, which
// the runtime has then applied itself. Without a container limit it does
// nothing. The API and the worker call it first thing, so a pod's
// resources.limits.memory is all the deployment needs to say; in the
// Kubernetes manifests that is 384Mi for the API (GOMEMLIMIT 345 MiB) and
// 1Gi for the worker (920 MiB). It returns the limit set, 0 for none.
func SetMemoryLimit(getenv func(string) string, readFile func(string) ([]byte, error), log *slog.Logger) int64 {
	if v := getenv("GOMEMLIMIT"); v != "" {
		log.Info("memory limit", "gomemlimit", v, "source", "GOMEMLIMIT")
		return 0
	}
	for _, f := range cgroupLimitFiles {
		b, err := readFile(f)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		n, err := strconv.ParseInt(s, 10, 64)
		// "max" (v2) or a page-rounded 2^63 (v1) mean no limit.
		if err != nil || n <= 0 || n >= 1<<60 {
			return 0
		}
		soft := int64(float64(n) * memoryLimitShare)
		debug.SetMemoryLimit(soft)
		log.Info("memory limit", "gomemlimit_bytes", soft, "container_limit_bytes", n, "source", f)
		return soft
	}
	return 0
}

// ReadFile is os.ReadFile, named for the callers that pass it.
var ReadFile = os.ReadFile
