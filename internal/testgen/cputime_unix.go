//go:build unix

package testgen

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time (user + system) the process has used. On a
// shared, overloaded machine wall-clock ns/op mostly measures the
// neighbours; CPU time measures the work, so benchmarks report it beside
// ns/op.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ProcessMaxRSS is the peak resident set size of the process in bytes
// (Linux reports ru_maxrss in KiB).
func ProcessMaxRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return int64(ru.Maxrss) * 1024
}
