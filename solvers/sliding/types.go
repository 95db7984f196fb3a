package sliding

// Puzzle is a sliding-tile board, row-major. Each tile 0..R*C-1 appears
// exactly once and 0 is the blank. The goal is 1, 2, ..., R*C-1 with the
// blank last.
type Puzzle struct {
	Board [][]int `json:"board"`
}

// Options tunes a solve. The zero value is the default.
type Options struct {
	// MaxNodes caps the number of search nodes for boards solved by search
	// rather than by table lookup. 0 means DefaultMaxNodes.
	MaxNodes int64 `json:"max_nodes,omitempty"`
	// Progress, when not nil, is called by the search (boards of more than
	// 9 cells) from the solving goroutine: once at each new IDA* bound and
	// about every 1 M nodes, with the current bound and the nodes searched
	// so far. It must be quick; it is never called for table lookups.
	Progress func(bound int, nodes int64) `json:"-"`
}

// Result is the answer to a sliding puzzle.
type Result struct {
	// Moves is the minimum number of moves, or -1 when the goal cannot be
	// reached.
	Moves int `json:"moves"`
	// Solvable reports whether the goal can be reached.
	Solvable bool `json:"solvable"`
	// Path names the direction the blank moves at each step (U, D, L, R).
	// Replaying it from the start reaches the goal. Empty when unsolvable.
	Path string `json:"path"`
}
