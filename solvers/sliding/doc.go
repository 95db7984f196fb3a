// Package sliding solves the sliding-tile puzzle (Baekjoon 1525, "퍼즐"):
// an R×C board holding the tiles 0..R*C-1 once each, 0 being the blank, to
// be brought to 1, 2, ..., R*C-1 with the blank last by sliding tiles into
// the blank. Solve returns the minimum number of moves and one shortest
// path, or -1 when the goal cannot be reached. Every shape with both sides
// at least 2 and at most 16 cells is accepted (2×2 up to 4×4, 3×5, 5×3,
// 2×8, 8×2); larger boards are refused as too large.
//
// Two methods share the work, chosen by the size of the state space (n!/2
// reachable boards for n cells): a distance table for boards of at most 9
// cells (at most 9!/2 = 181,440 states: 2×2, 2×3, 3×2, 2×4, 4×2, 3×3), and
// IDA* with additive pattern databases above that (10!/2 = 1.8 M states
// for 2×5 already, 16!/2 ≈ 10^13 for 4×4).
//
// # Distance table (at most 9 cells)
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
// 9!/2 states.
//
// # IDA* with pattern databases (10 to 16 cells)
//
// Larger boards are solved by iterative-deepening A*: depth-first searches
// bounded by f = g + h, the bound raised each time to the smallest f that
// exceeded it, so the first solution found is optimal when h never
// overestimates. The search never moves the blank straight back, keeps
// the board in fixed arrays (no allocation per node), updates h
// incrementally (a move changes one tile, so only that tile's group is
// looked up again), polls ctx and reports Options.Progress every few
// thousand nodes, and stops with an error wrapping
// solvers.ErrBudgetExceeded after Options.MaxNodes nodes (DefaultMaxNodes
// when 0). Boards with more rows than columns are transposed first (tile
// cells and names reflected along the main diagonal, which maps goal to
// goal and moves to moves), so only the shapes with rows <= cols need
// databases; the path is transposed back. The IDA* path is a shortest
// path, not necessarily the lexicographically smallest.
//
// h is the sum of additive (disjoint) pattern databases (Korf & Felner,
// 2002): the tiles are split into groups, and for each placement of a
// group's tiles the database holds the fewest moves of that group's tiles
// needed to bring them home, the other tiles being indistinguishable and
// their moves free. A move moves one tile, counted in one group only, so
// the sum over groups never overestimates. A database is built once by a
// backward 0-1 breadth-first search from the goal over (placement, blank
// cell), in which a blank move costs 1 if it slides a pattern tile and 0
// otherwise; the entry of a placement is its smallest distance over blank
// cells. It is indexed by the rank of the group's cells as a
// k-permutation of the n cells, n!/(n-k)! entries (5,765,760 for six tiles
// on 16 cells) of four bits each: an entry stores (moves - md)/2, md being
// the group's Manhattan distance, which the lookup adds back (moves and md
// have the same parity, and the difference is at most 13 over all groups
// below, 6 for 4×4). The partitions (see searchShapes) are
//
//	4×4: {1,5,6,9,10,13} {7,8,11,12,14,15} {2,3,4}   6-6-3
//	3×5: {1,2,6,7,11} {3,4,8,12,13} {5,9,10,14}       5-5-4
//	3×4: {1,2,5,6,9,10} {3,4,7,8,11}                  6-5
//	2×8: {1,2,3,9,10} {4,5,11,12,13} {6,7,8,14,15}    5-5-5
//	2×7: {1,2,3,8,9} {4,5,10,11,12} {6,7,13}          5-5-3
//	2×6: {1,2,3,7,8,9} {4,5,6,10,11}                  6-5
//	2×5: {1,2,3,6,7} {4,5,8,9}                        5-4
//
// All of them hold 7,949,712 bytes (7.6 MiB, PDBMemory), 5,767,440 of
// them for 4×4. Building the two six-tile 4×4 databases takes about 3.3 s
// of CPU each (one after the other, with 14.4 MB of scratch each);
// the other shapes take under 0.9 s each. They are built on first use of a
// shape, or by Preload, which can also keep them in files (SHA-256
// checked, written atomically; reading the 4×4 files back takes under
// 10 ms).
//
// 4×4 has a second, larger table set: Korf and Felner's 7-8 partition,
// {1..8} (the top two rows) and {9..15}, with 518,918,400 and 57,657,600
// entries (259 MB and 29 MB at four bits each; the 8-tile build needs
// 1.3 GB of scratch and minutes of CPU). It is built once into a
// directory (BuildTables, puzzlectl pdb build), verified by SHA-256
// (VerifyTables) and memory-mapped read-only (UseTables), so every
// process of a host shares one copy through the page cache and a process
// start reads nothing; without its files 4×4 uses 6-6-3. ActiveTables
// says which set is in use.
//
// On 4×4 the search also uses the board reflected along the main
// diagonal: cell (r, c) becomes (c, r) and tile v, whose goal cell is
// (gr, gc), becomes the tile whose goal cell is (gc, gr). That map sends
// the goal to the goal (the blank's home, the last cell, is on the
// diagonal) and each move to a move, so a board and its reflection are
// exactly as far from the goal, and the databases' value for the reflected
// board is a lower bound for the board itself. h is the larger of the two
// sums, which is still admissible. The lookup is useful because neither
// partition is mapped onto itself by the reflection (the reflected 6-6-3
// groups are {1,2,3,4,6,7}, {8,10,11,12,14,15}, {5,9,13}; the 7-8 groups
// become the two left columns and the two right ones), so the second sum
// measures different tile interactions; with a partition that the
// reflection maps onto itself the two sums would always be equal.
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
// This tie-break holds for the table method. When several neighbours lie
// one step closer to the goal, the walk takes
// the first in the order D, L, R, U (alphabetical). Because every neighbour
// at distance d-1 starts some shortest path, this greedy choice yields the
// lexicographically smallest shortest path as a string, a definition that
// does not depend on the implementation and that any other correct solver
// can reproduce. For the sample "1 0 3 / 4 2 5 / 7 8 6" the shortest path
// is unique, DRD, so every order agrees there.
package sliding
