package puzzle

import (
	"strconv"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/solvers/sliding"
)

// The fast path. Most requests are small sliding boards in one spelling:
// the payloads the API stores (which the worker decodes again) and the
// lines clients write with a JSON encoder. Reading those with the
// reflective decoder and encoding their payload back costs several
// microseconds an item, more than solving an 8-puzzle by table. So
// DecodeItem and Decode first try fastSliding, a scanner of exactly that
// spelling, and take the general path for anything else:
//
//	{["custom_id":"<printable ASCII, no \ or ">",]"kind":"sliding","puzzle":{"board":[[<int>,...],...]}[,"options":{} | ,"options":{"max_nodes":<int>}]}
//
// with no whitespace, integers without sign, fraction or leading zero,
// and only boards that sliding.Validate accepts. It never reports an
// error: whatever it does not take (another member order, an escape, a
// bad board) goes to the general decoder, so every error, and every
// rule of strict, is that decoder's. What it takes, the general path
// would take and decode to the same Parsed, payload bytes included:
// FuzzFastSliding holds it to that.

// maxFastSide bounds the rows and columns the fast path reads; sliding
// boards are at most 16 cells, so a side above 8 is never valid.
const maxFastSide = 8

// fastScan reads a fixed spelling from data.
type fastScan struct {
	data []byte
	pos  int
}

// lit consumes s if data continues with it.
func (s *fastScan) lit(lit string) bool {
	if len(s.data)-s.pos < len(lit) || string(s.data[s.pos:s.pos+len(lit)]) != lit {
		return false
	}
	s.pos += len(lit)
	return true
}

// uint reads a JSON integer of at most maxDigits digits with no sign,
// fraction, exponent or leading zero.
func (s *fastScan) uint(maxDigits int) (int64, bool) {
	start := s.pos
	var v int64
	for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
		v = v*10 + int64(s.data[s.pos]-'0')
		s.pos++
	}
	n := s.pos - start
	if n == 0 || n > maxDigits || (n > 1 && s.data[start] == '0') {
		return 0, false
	}
	return v, true
}

// customID reads a custom_id of plain ASCII: 1 to MaxCustomIDBytes
// printable bytes without an escape, which decodes to itself.
func (s *fastScan) customID() (string, bool) {
	if !s.lit(`"`) {
		return "", false
	}
	start := s.pos
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		if c == '"' {
			break
		}
		if c < 0x20 || c > 0x7e || c == '\\' {
			return "", false
		}
		s.pos++
	}
	n := s.pos - start
	if n == 0 || n > apitype.MaxCustomIDBytes || !s.lit(`"`) {
		return "", false
	}
	return string(s.data[start : start+n]), true
}

// slidingScan is what scanSliding read of a sliding request: the tiles
// row by row, the options and the custom_id.
type slidingScan struct {
	tiles         [maxFastSide * maxFastSide]int
	n, rows, cols int
	o             sliding.Options
	customID      string
}

// scanSliding reads data into sc when it is a sliding request in the fast
// path's spelling (see above), with a custom_id first when withID; it
// reports false for anything else. It does not check the board.
func scanSliding(data []byte, withID bool, sc *slidingScan) bool {
	s := fastScan{data: data}
	if !s.lit(`{`) {
		return false
	}
	if withID && s.lit(`"custom_id":`) {
		var ok bool
		if sc.customID, ok = s.customID(); !ok || !s.lit(`,`) {
			return false
		}
	}
	if !s.lit(`"kind":"sliding","puzzle":{"board":[`) {
		return false
	}
	sc.cols = -1
	for {
		if sc.rows == maxFastSide || !s.lit(`[`) {
			return false
		}
		c := 0
		for {
			if c == maxFastSide {
				return false
			}
			v, ok := s.uint(2)
			if !ok {
				return false
			}
			sc.tiles[sc.n] = int(v)
			sc.n, c = sc.n+1, c+1
			if !s.lit(`,`) {
				break
			}
		}
		if !s.lit(`]`) || (sc.cols >= 0 && c != sc.cols) {
			return false
		}
		sc.cols = c
		sc.rows++
		if !s.lit(`,`) {
			break
		}
	}
	if !s.lit(`]}`) {
		return false
	}
	if s.lit(`,"options":{`) {
		if s.lit(`"max_nodes":`) {
			v, ok := s.uint(18)
			if !ok {
				return false
			}
			sc.o.MaxNodes = v
		}
		if !s.lit(`}`) {
			return false
		}
	}
	return s.lit(`}`) && s.pos == len(data)
}

// valid reports whether sliding.Validate takes the scanned board, read
// in place: rows of sc's own array, no allocation.
func (sc *slidingScan) valid() bool {
	var rows [maxFastSide][]int
	for i := range sc.rows {
		rows[i] = sc.tiles[i*sc.cols : (i+1)*sc.cols : (i+1)*sc.cols]
	}
	return sliding.Validate(sliding.Puzzle{Board: rows[:sc.rows]}) == nil
}

// fastSliding decodes data when it is a sliding request in the fast
// path's spelling (see above), with a custom_id first when withID; ok is
// false for anything else, which the caller decodes the general way.
func fastSliding(data []byte, withID bool) (p *Parsed, customID string, ok bool) {
	var sc slidingScan
	if !scanSliding(data, withID, &sc) || !sc.valid() {
		return nil, "", false // the general path says what is wrong
	}
	n, rows, cols, o := sc.n, sc.rows, sc.cols, sc.o
	flat := make([]int, n)
	copy(flat, sc.tiles[:n])
	board := make([][]int, rows)
	for i := range board {
		board[i] = flat[i*cols : (i+1)*cols : (i+1)*cols]
	}
	pz := sliding.Puzzle{Board: board}
	// The payload as encoding/json writes it for parse: the same bytes.
	buf := make([]byte, 0, 48+4*n)
	buf = appendBoardJSON(append(buf, `{"kind":"sliding","puzzle":{"board":`...), board)
	buf = append(buf, `},"options":{`...)
	if o.MaxNodes != 0 {
		buf = append(buf, `"max_nodes":`...)
		buf = strconv.AppendInt(buf, o.MaxNodes, 10)
	}
	buf = append(buf, `}}`...)
	return &Parsed{kind: KindSliding, sliding: pz, slidingO: o, payload: buf, cells: n}, sc.customID, true
}
