//go:build race

package cli_test

// raceEnabled shrinks the large end-to-end runs: the race detector slows
// the in-process API and worker 5-20x.
const raceEnabled = true
