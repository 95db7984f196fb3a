// Package testgen makes puzzle requests for tests and bench tools, so that
// every test package draws its random puzzles the same way: a fixture
// named by a seed is the same request wherever it is used.
package testgen

import (
	"bytes"
	"math/rand"
)

// Fill returns a fill request ({"kind":"fill","puzzle":{...}}) on two
// side x side grids of random 0/1 cells drawn from rng, the game board's
// cells first, row by row, then the table's. It writes the JSON by hand:
// formatting each cell would take seconds for the 1000x1000 boards that
// memory tests upload by the dozen.
func Fill(rng *rand.Rand, side int) string {
	var b bytes.Buffer
	b.Grow(4*side*side + 64)
	grid := func() {
		b.WriteByte('[')
		for i := range side {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteByte('[')
			for j := range side {
				if j > 0 {
					b.WriteByte(',')
				}
				b.WriteByte('0' + byte(rng.Intn(2)))
			}
			b.WriteByte(']')
		}
		b.WriteByte(']')
	}
	b.WriteString(`{"kind":"fill","puzzle":{"game_board":`)
	grid()
	b.WriteString(`,"table":`)
	grid()
	b.WriteString(`}}`)
	return b.String()
}

// Fills returns n fill requests of side x side from one generator seeded
// with seed; they repeat only by a vanishing chance.
func Fills(n, side int, seed int64) []string {
	rng := rand.New(rand.NewSource(seed))
	out := make([]string, n)
	for i := range out {
		out[i] = Fill(rng, side)
	}
	return out
}
