//go:build !unix

package testgen

import "time"

// ProcessCPU is not measured on this platform; benchmarks then report a
// CPU time of 0.
func ProcessCPU() time.Duration { return 0 }

// ProcessMaxRSS is not measured on this platform.
func ProcessMaxRSS() int64 { return 0 }
