//go:build !race

package sliding

// raceEnabled is true under -race, where the reference BFS runs several
// times slower, so the property test uses fewer 3×3 boards.
const raceEnabled = false
