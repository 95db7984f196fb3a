//go:build !linux

package fill

import "time"

// threadCPU is not measured outside Linux; the cpu-ns metrics read 0.
func threadCPU() time.Duration { return 0 }
