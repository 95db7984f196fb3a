// Package sliding solves the sliding-tile puzzle (Baekjoon 1525, "퍼즐"):
// an R×C board holding the tiles 0..R*C-1 once each, 0 being the blank, to
// be brought to 1, 2, ..., R*C-1 with the blank last by sliding tiles into
// the blank. Solve returns the minimum number of moves and one shortest
// path, or -1 when the goal cannot be reached.
//
// # Method
//
// The textbook solution runs a breadth-first search from the given board
// for every query, keeping visited boards as strings in a map. For a 3×3
// board that visits up to all 181,440 reachable boards per query: tens of
// milliseconds and megabytes of garbage each time.
//
// Here the search runs once, backwards: a single BFS from the goal labels
// every reachable board of a shape with its distance to the goal. The
// distances live in a byte slice indexed by a permutation rank, so the
// table for 3×3 is 181,440 bytes and takes a few milliseconds to build.
// A query is then one rank and one lookup for the number of moves, plus a
// walk down the distances for the path: from distance d the walk moves the
// blank to a neighbour whose distance is d-1, until it reaches 0.
//
// Tables are built lazily, once per shape and process (a sync.Once per
// shape), and are read-only afterwards, so Solve is safe for concurrent use.
// The table method is chosen by the size of the reachable state space: it
// is used for boards of at most maxTableCells (9) cells, that is at most
// 9!/2 states. Larger boards (4×4, later) need a heuristic search (IDA*
// with pattern databases); they are rejected as too large for now.
//
// # Encoding
//
// A board is packed into a uint64, four bits per cell, cell i (row-major)
// in bits 4i..4i+3; that also fits the 16 cells of a 4×4 board. The table
// works on the same nibbles with the blank's nibble removed (the tile
// sequence) plus the blank's cell, and indexes a board by
//
//	blank * ((n-1)!/2) + lehmer(tiles)/2
//
// where n is the number of cells and lehmer is the Lehmer-code rank of the
// n-1 tiles in row-major order. Two permutations whose ranks differ only in
// the lowest bit differ by a swap of the last two tiles, which flips the
// parity, and for a fixed blank cell exactly one parity is reachable (see
// below). Halving the rank therefore numbers the reachable boards densely:
// no byte of the table is spent on unreachable boards. The split also makes
// moves cheap: a horizontal move leaves the tile sequence as it is, so the
// index changes by ±(n-1)!/2 with no ranking at all; a vertical move
// rotates C adjacent nibbles and re-ranks in O(n) with a bit set and a
// popcount. The BFS queue stores each board in 32 bits (blank cell and
// all tiles but the last, which is recovered by XOR), so the 3×3 build
// allocates 5 bytes per state and never unranks.
//
// # Solvability
//
// Unreachable boards are answered at once by the parity rule, without any
// search or table. Let inv be the number of inversions among the tiles
// (blank skipped, row-major). A horizontal move changes neither inv nor the
// blank's row. A vertical move carries a tile past the C-1 others of a row,
// changing inv by C-1 and the blank's row by one. So with an odd width inv
// mod 2 is invariant, and with an even width (inv + blank row) mod 2 is.
// A board is solvable exactly when that invariant equals the goal's
// (inv = 0, blank in the bottom row); for R, C >= 2 every board satisfying
// it is reachable, which the exhaustive tests confirm for the small shapes.
//
// # Path tie-break
//
// When several neighbours lie one step closer to the goal, the walk takes
// the first in the order D, L, R, U (alphabetical). Because every neighbour
// at distance d-1 starts some shortest path, this greedy choice yields the
// lexicographically smallest shortest path as a string, a definition that
// does not depend on the implementation and that any other correct solver
// can reproduce. For the sample "1 0 3 / 4 2 5 / 7 8 6" the shortest path
// is unique, DRD, so every order agrees there.
package sliding
