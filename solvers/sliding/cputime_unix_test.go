//go:build unix

package sliding

import "syscall"

// processCPU returns the CPU time (user + system) the process has used, in
// nanoseconds. On a shared, overloaded machine wall-clock ns/op mostly
// measures the neighbours; CPU time measures the work.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// processMaxRSS returns the peak resident set size of the process in
// bytes (Linux reports ru_maxrss in KiB).
func processMaxRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return int64(ru.Maxrss) * 1024
}
