//go:build !unix

package api_test

// processCPU is not measured on this platform; benchmarks then report a
// cpu-ns/op of 0.
func processCPU() int64 { return 0 }
