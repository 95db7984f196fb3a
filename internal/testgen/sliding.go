package testgen

import (
	"fmt"
	"math/rand"
)

// slidingRequest is the request of a 3x3 sliding board, row by row.
func slidingRequest(b [9]int) string {
	return fmt.Sprintf(`{"kind":"sliding","puzzle":{"board":[[%d,%d,%d],[%d,%d,%d],[%d,%d,%d]]}}`,
		b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8])
}

// EightPuzzle returns the i-th of the 9! arrangements of a 3x3 sliding
// board as a request: distinct per i, solvable or not (both are valid
// requests, and both are cheap).
func EightPuzzle(i int) string {
	p := [9]int{1, 2, 3, 4, 5, 6, 7, 8, 0}
	for j, k := 0, i; j < 8; j, k = j+1, k/(9-j) {
		r := j + k%(9-j)
		p[j], p[r] = p[r], p[j]
	}
	return slidingRequest(p)
}

// EightPuzzles returns n distinct solvable 3x3 sliding requests (there
// are 181,440), drawn with seed: the same seed gives the same requests.
func EightPuzzles(n int, seed int64) []string {
	rng := rand.New(rand.NewSource(seed))
	seen := make(map[[9]int]bool, n)
	out := make([]string, 0, n)
	for len(out) < n {
		var b [9]int
		copy(b[:], rng.Perm(9))
		if !solvable(b) || seen[b] {
			continue
		}
		seen[b] = true
		out = append(out, slidingRequest(b))
	}
	return out
}

// solvable reports whether a 3x3 board (0 the blank) can reach the goal:
// its tiles have an even number of inversions.
func solvable(b [9]int) bool {
	inv := 0
	for i := 0; i < 9; i++ {
		for j := i + 1; j < 9; j++ {
			if b[i] != 0 && b[j] != 0 && b[i] > b[j] {
				inv++
			}
		}
	}
	return inv%2 == 0
}
