//go:build race

package e2e_test

// raceEnabled relaxes timing assertions: the race detector slows code
// 5-20x, so a latency bound that holds in production cannot hold under it.
const raceEnabled = true
