package sweep

// Puzzle is an N×M board of '.' (empty) and '*' (obstacle), one string per
// row, with 1..30 rows and columns and at least one empty cell.
type Puzzle struct {
	Board []string `json:"board"`
}

// Options tunes a solve. The zero value is the default.
type Options struct {
	// MaxNodes caps the number of search nodes. 0 means DefaultMaxNodes.
	// Exceeding it makes Solve return ErrBudgetExceeded.
	MaxNodes int64 `json:"max_nodes,omitempty"`
}

// Result is the answer to a board.
type Result struct {
	// Moves is the fewest rolls that visit every empty cell, or -1.
	Moves int `json:"moves"`
	// Start is the start cell as [row, col] counted from 0; nil when Moves
	// is -1.
	Start []int `json:"start"`
	// Path gives the roll directions (U, D, L, R). Replaying it from Start
	// visits every empty cell.
	Path string `json:"path"`
}
