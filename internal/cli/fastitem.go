package cli

import (
	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/solvers/sliding"
)

// Bounds of the lines fastSliding reads; a larger board goes the full way
// (and is refused there: sliding takes at most 16 cells).
const (
	fastMaxRows  = 8
	fastMaxCells = 16
)

// fastSliding checks, without reflection, the shape bulk inputs have:
//
//	{["custom_id":"ID",]"kind":"sliding","puzzle":{"board":[[N,...],...]}}
//
// with no spaces, plain ASCII in ID (1 to apitype.MaxCustomIDBytes bytes,
// no escapes) and each N a small non-negative integer without leading
// zeros. ok reports that line has that shape and sliding.Validate takes
// the board, so that puzzle.Decode (the API's check) takes it too: it
// decodes those bytes to the same board, and the rest of its work (the
// payload, the cache key) cannot fail. Any other line, valid or not, is
// not ok and goes to decodeItem's full check, which words the errors: a
// FuzzFastSliding test holds the two together.
func fastSliding(line []byte) (customID string, has, ok bool) {
	p := line
	if p, ok = cutPrefix(p, `{"custom_id":"`); ok {
		end := 0
		for end < len(p) && p[end] != '"' {
			if c := p[end]; c < 0x20 || c > 0x7e || c == '\\' {
				return "", false, false
			}
			end++
		}
		if end == 0 || end == len(p) || end > apitype.MaxCustomIDBytes {
			return "", false, false
		}
		customID, has = string(p[:end]), true
		if p, ok = cutPrefix(p[end+1:], `,"kind":"sliding","puzzle":{"board":[`); !ok {
			return "", false, false
		}
	} else if p, ok = cutPrefix(line, `{"kind":"sliding","puzzle":{"board":[`); !ok {
		return "", false, false
	}
	var (
		cells [fastMaxCells]int
		rows  [fastMaxRows][]int
	)
	nr, nc := 0, 0
	for {
		if nr == fastMaxRows || len(p) == 0 || p[0] != '[' {
			return "", false, false
		}
		p = p[1:]
		start := nc
		for {
			d := 0
			for d < len(p) && d < 3 && p[d] >= '0' && p[d] <= '9' {
				d++
			}
			if d == 0 || d == 3 || (d > 1 && p[0] == '0') || nc == fastMaxCells {
				return "", false, false
			}
			v := int(p[0] - '0')
			if d == 2 {
				v = v*10 + int(p[1]-'0')
			}
			cells[nc], nc, p = v, nc+1, p[d:]
			if len(p) == 0 {
				return "", false, false
			}
			if p[0] == ',' {
				p = p[1:]
				continue
			}
			if p[0] != ']' {
				return "", false, false
			}
			p = p[1:]
			break
		}
		rows[nr], nr = cells[start:nc:nc], nr+1
		if len(p) == 0 {
			return "", false, false
		}
		if p[0] == ',' {
			p = p[1:]
			continue
		}
		break
	}
	if string(p) != "]}}" {
		return "", false, false
	}
	if sliding.Validate(sliding.Puzzle{Board: rows[:nr]}) != nil {
		return "", false, false
	}
	return customID, has, true
}

func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return b, false
	}
	return b[len(prefix):], true
}
