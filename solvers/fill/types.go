package fill

// Puzzle holds two R×C grids of 0/1 with the same dimensions. Pieces are
// 4-connected groups of 1s in Table; holes are 4-connected groups of 0s in
// GameBoard.
type Puzzle struct {
	GameBoard [][]int `json:"game_board"`
	Table     [][]int `json:"table"`
}

// Options tunes a solve. The zero value is the default.
type Options struct {
	// AllowFlip lets a piece be mirrored as well as rotated. Default false,
	// as in the original problem.
	AllowFlip bool `json:"allow_flip,omitempty"`
}

// Result is the answer to a fill puzzle.
type Result struct {
	// Filled is the largest total number of board cells that pieces fill.
	Filled int `json:"filled"`
	// Placements lists one entry per piece placed.
	Placements []Placement `json:"placements"`
}

// Placement says which piece went into which hole and how. Piece[i] lands
// on Hole[i]: a checker can verify the placement cell by cell.
type Placement struct {
	// Piece is the piece's cells in the table, as [row, col]. Coordinates
	// are below MaxSide, and int32 halves the memory of a large result.
	Piece [][2]int32 `json:"piece"`
	// Hole is the hole's cells in the game board, as [row, col].
	Hole [][2]int32 `json:"hole"`
	// Rotation is the clockwise rotation applied to the piece, in degrees:
	// 0, 90, 180 or 270. When Flipped is set the piece is mirrored
	// left-to-right first.
	Rotation int `json:"rotation"`
	// Flipped reports a mirrored placement (only with AllowFlip).
	Flipped bool `json:"flipped,omitempty"`
}
