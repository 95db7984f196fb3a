package testgen

import (
	"syscall"
	"time"
	"unsafe"
)

// ThreadCPU is the CPU time of the calling OS thread. A benchmark that
// locks its goroutine to a thread reports it beside wall time, because on
// a shared, oversubscribed machine wall time also counts the time the
// benchmark spent waiting for a CPU.
func ThreadCPU() time.Duration {
	const clockThreadCPUTimeID = 3
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}
