package testgen

import "testing"

// EightPuzzles draws distinct solvable boards, the same for a seed;
// EightPuzzle's boards are distinct per index.
func TestEightPuzzles(t *testing.T) {
	a, b := EightPuzzles(200, 7), EightPuzzles(200, 7)
	seen := map[string]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 7 drew %s then %s", a[i], b[i])
		}
		if seen[a[i]] {
			t.Fatalf("%s drawn twice", a[i])
		}
		seen[a[i]] = true
	}
	seen = map[string]bool{}
	for i := range 1000 {
		p := EightPuzzle(i)
		if seen[p] {
			t.Fatalf("EightPuzzle(%d) = %s repeats", i, p)
		}
		seen[p] = true
	}
	if !solvable([9]int{1, 2, 3, 4, 5, 6, 7, 8, 0}) || solvable([9]int{2, 1, 3, 4, 5, 6, 7, 8, 0}) {
		t.Error("solvable misjudges the goal or one swap from it")
	}
}
