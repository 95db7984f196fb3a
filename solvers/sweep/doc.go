// Package sweep solves Baekjoon 9944, "N×M board completion": place a
// ball on an empty cell of a board of '.' and '*', then roll it up, down,
// left or right; a roll moves at least one cell and stops just before an
// obstacle, the border or a cell the ball has already visited. The game
// ends when no roll is possible. Find the fewest rolls of a game that
// visits every empty cell, over all start cells, or -1.
//
// # Search
//
// The solver is the textbook depth-first search over roll sequences from
// every start cell, made fast by representation and by pruning that never
// changes the optimum:
//
//   - The unvisited cells are a bitset, one uint64 per row with padding
//     rows above and below, so a horizontal roll is a couple of bit scans
//     and the bounds below are a few word operations per row.
//
//   - Every start cell shares one best-so-far answer (branch and bound).
//     A node is cut when moves + lower bound >= best, so only strictly
//     better games are searched for, and the first optimum found is kept.
//
// Why the cuts are sound: from any position, the rest of the game is a
// simple path b, x1, ..., xk in the grid, where b is the ball's cell and
// every xi is unvisited now, because a roll stops before visited cells
// and so never re-enters one. A complete game visits every unvisited
// cell, so {x1..xk} is exactly the unvisited set. Call a neighbour of an
// unvisited cell "open" if it is unvisited or is b. Then:
//
//  1. Connectivity. The xi are a path, so the unvisited cells must form a
//     single connected region (next to b). If they do not, no completion
//     exists. Checked by a bitset flood fill that adds whole runs of a
//     row at a time. The fill is skipped after a roll whose free side
//     neighbours all lie in one run of one adjacent row or column: the
//     region was connected before the roll and any path through the
//     rolled segment can detour along that run, so it still is. After
//     any other roll the region is still connected iff the segment's
//     side cells are all in one component, so the fill starts at one of
//     them and stops as soon as it has reached the others.
//
//  2. Dead ends. Every xi except the last has two path neighbours, both
//     open. So at most one unvisited cell may have fewer than two open
//     neighbours, and it must be where the game ends. At the root this is
//     the classic degree-1 rule: with more than two dead-end cells the
//     answer is -1 before any search, and with two the start must be
//     one of them.
//
//  3. Stop cells (the lower bound). If an unvisited cell has no pair of
//     opposite open neighbours (up and down, or left and right), the ball
//     cannot roll straight through it, so some roll ends there. Different
//     rolls end on different cells, so at least that many more rolls are
//     needed, and at least one while any cell is unvisited. Until a
//     first game is found there is nothing to bound, so only the dead
//     ends are counted, and the count stops at the second.
//
//  4. Parity. Colour the cells like a chessboard: a game's cells
//     alternate colours, so when one colour has one cell more the game
//     starts on it, and when it has more than one more there is no game.
//     The colour counts never change this verdict later in the game, so
//     it only prunes start cells.
//
//  5. Blocks. A graph with a Hamiltonian path has a block-cut tree that
//     is a path, and the path starts and ends in its two end blocks. So
//     once per board a depth-first search finds the blocks of the empty
//     cells (blocks.go): if the tree branches there is no game, and
//     otherwise only cells of the end blocks that are not cut vertices
//     are tried as starts.
//
//  6. Symmetry. A reflection or rotation of the rectangle that maps the
//     empty cells onto themselves maps any game onto a game of the same
//     length, so one start cell per orbit is enough.
//
//  7. Ordering. Dead-end start cells are tried first (a complete game
//     starts or ends at each of them), then cells that are stop cells
//     from the start, so that a good bound is found early.
//
// The dead-end count also covers the ball's free neighbours whose only
// other open neighbour is one free cell: each must be the next roll's
// first cell or the game's last, and only one can be first.
//
// The search is exact: it returns the same number of moves as plain
// backtracking from every start cell (reference_test.go checks this on
// thousands of random boards, with each pruning on and off).
//
// The solver does no I/O; ParseBOJ9944 and FormatBOJ9944 read and write
// the judge format for callers that need it.
package sweep
