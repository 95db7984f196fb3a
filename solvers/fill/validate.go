package fill

import (
	"encoding/binary"
	"strconv"

	"github.com/puzzleq/puzzleq/solvers"
)

// MaxSide is the largest number of rows or columns a grid may have. It
// bounds the memory of a solve and keeps packed cell coordinates in 16 bits.
const MaxSide = 1000

// Validate reports whether p is a well-formed puzzle: two non-empty,
// rectangular grids of the same dimensions, at most MaxSide×MaxSide, with
// every value 0 or 1. The error is a *solvers.InputError whose Field is a
// path relative to the puzzle object ("game_board", "table[1][3]").
func Validate(p Puzzle) error {
	return validate(p, nil)
}

// validate checks p and, when s is non-nil, also copies both grids into
// s's padded buffers in the same pass, so that Solve reads the input once.
func validate(p Puzzle, s *solver) error {
	br, bc, err := gridShape("game_board", p.GameBoard)
	if err != nil {
		return err
	}
	tr, tc, err := gridShape("table", p.Table)
	if err != nil {
		return err
	}
	if br != tr || bc != tc {
		return solvers.Invalid("table", "game_board is %dx%d but table is %dx%d", br, bc, tr, tc)
	}
	var board, table []uint8
	wp := bc + 2
	if s != nil {
		s.reset(br, bc)
		board, table = s.board, s.table
	}
	// Holes are the 0s of the board and pieces the 1s of the table; the
	// buffers hold 1 for "cell still to be grouped" in both.
	if err := gridValues("game_board", p.GameBoard, board, wp, 0); err != nil {
		return err
	}
	return gridValues("table", p.Table, table, wp, 1)
}

// gridShape checks that g is non-empty, within MaxSide and rectangular.
func gridShape(name string, g [][]int) (rows, cols int, err error) {
	if len(g) == 0 {
		return 0, 0, solvers.Invalid(name, "%s is empty", name)
	}
	rows, cols = len(g), len(g[0])
	if cols == 0 {
		return 0, 0, solvers.Invalid(name+"[0]", "%s row 1 is empty", name)
	}
	if rows > MaxSide || cols > MaxSide {
		return 0, 0, solvers.TooLarge(name, "%s is %dx%d, the limit is %dx%d", name, rows, cols, MaxSide, MaxSide)
	}
	for i, row := range g {
		if len(row) != cols {
			return 0, 0, solvers.Invalid(fieldRow(name, i), "%s row %d has %d columns, expected %d", name, i+1, len(row), cols)
		}
	}
	return rows, cols, nil
}

// gridValues checks that every value is 0 or 1 and, when dst is non-nil,
// writes 1 into the padded buffer where the value equals want. The hot
// loop only ORs the values together (no branch per value); a bad row is
// searched again for the message.
func gridValues(name string, g [][]int, dst []uint8, wp int, want int) error {
	flip := 1 ^ want // v ^ flip is 1 exactly when v == want, for v in {0, 1}
	flip8 := uint64(flip) * 0x0101010101010101
	for i, row := range g {
		var acc uint
		if dst != nil {
			out := dst[(i+1)*wp+1:]
			out = out[:len(row)]
			// Eight cells per 64-bit store: the loads of the ints are
			// the cost, one byte store per cell would double it.
			j := 0
			for ; j+8 <= len(row); j += 8 {
				v := row[j : j+8 : j+8]
				acc |= uint(v[0] | v[1] | v[2] | v[3] | v[4] | v[5] | v[6] | v[7])
				w := uint64(uint8(v[0])) | uint64(uint8(v[1]))<<8 | uint64(uint8(v[2]))<<16 | uint64(uint8(v[3]))<<24 |
					uint64(uint8(v[4]))<<32 | uint64(uint8(v[5]))<<40 | uint64(uint8(v[6]))<<48 | uint64(uint8(v[7]))<<56
				binary.LittleEndian.PutUint64(out[j:], w^flip8)
			}
			for ; j < len(row); j++ {
				v := row[j]
				acc |= uint(v)
				out[j] = uint8(v ^ flip)
			}
		} else {
			for _, v := range row {
				acc |= uint(v)
			}
		}
		if acc <= 1 {
			continue
		}
		for j, v := range row {
			if uint(v) > 1 {
				return solvers.Invalid(fieldCell(name, i, j), "%s row %d, column %d: value %d is not 0 or 1", name, i+1, j+1, v)
			}
		}
	}
	return nil
}

func fieldRow(name string, i int) string {
	return name + "[" + strconv.Itoa(i) + "]"
}

func fieldCell(name string, i, j int) string {
	return name + "[" + strconv.Itoa(i) + "][" + strconv.Itoa(j) + "]"
}
