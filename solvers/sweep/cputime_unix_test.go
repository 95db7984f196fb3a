//go:build unix

package sweep

import (
	"syscall"
	"time"
)

// cpuTime is the process's user+system CPU time. On a shared, busy
// machine it moves much less than wall time when other jobs steal the
// core, so benchmarks report it next to ns/op.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
