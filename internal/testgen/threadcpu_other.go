//go:build !linux

package testgen

import "time"

// ThreadCPU is not measured outside Linux; it reads 0.
func ThreadCPU() time.Duration { return 0 }
