package puzzle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"

	"github.com/puzzleq/puzzleq/solvers/sliding"
)

// DecodePayload decodes a request that is expected to be a Payload this
// package wrote (a worker reading a batch item the API validated). It
// returns exactly what Decode returns for the same bytes: a payload in
// the canonical form of a sliding board is read by a small parser that
// accepts only that exact form, byte for byte, and is then validated as
// Decode validates it; anything else, including bytes that changed in
// Redis, goes through Decode, with its strict rules and its errors.
//
// Decode's cost on a canonical 8-puzzle (a strict reflective decode and
// two re-encodings) is several times the table lookup that solves it.
func DecodePayload(data []byte) (*Parsed, error) {
	if p := decodeCanonicalSliding(data); p != nil {
		return p, nil
	}
	return Decode(data)
}

const (
	slidingHead = `{"kind":"sliding","puzzle":{"board":[`
	slidingOpts = `]},"options":{`
	maxNodesKey = `"max_nodes":`
	// maxCanonicalCells bounds the boards the fast path takes, above
	// sliding's limit of cells; a larger board falls back to Decode, which
	// rejects it with its own error.
	maxCanonicalCells = 16
)

// decodeCanonicalSliding parses data when it is the canonical payload of
// a valid sliding request:
//
//	{"kind":"sliding","puzzle":{"board":[[t,...],...]},"options":{}}
//	{"kind":"sliding","puzzle":{"board":[[t,...],...]},"options":{"max_nodes":n}}
//
// with every tile a non-negative integer of at most two digits and n a
// positive integer, both without leading zeros, and no white space. Those
// are exactly the bytes parse writes for the board and options it reads,
// so the payload is data itself. It returns nil for anything else, and
// for a board sliding.Validate rejects, so that Decode reports it.
func decodeCanonicalSliding(data []byte) *Parsed {
	rest, ok := bytes.CutPrefix(data, []byte(slidingHead))
	if !ok {
		return nil
	}
	var (
		cells   [maxCanonicalCells]int
		rowEnds [maxCanonicalCells]int
		n, nrow int
	)
	for {
		if len(rest) == 0 || rest[0] != '[' || nrow == maxCanonicalCells {
			return nil
		}
		rest = rest[1:]
		for {
			v, r, ok := smallUint(rest)
			if !ok || n == maxCanonicalCells {
				return nil
			}
			cells[n], n, rest = v, n+1, r
			if len(rest) == 0 {
				return nil
			}
			if rest[0] == ']' {
				rest = rest[1:]
				break
			}
			if rest[0] != ',' {
				return nil
			}
			rest = rest[1:]
		}
		rowEnds[nrow], nrow = n, nrow+1
		if len(rest) == 0 {
			return nil
		}
		if rest[0] == ',' {
			rest = rest[1:]
			continue
		}
		break
	}
	rest, ok = bytes.CutPrefix(rest, []byte(slidingOpts))
	if !ok {
		return nil
	}
	optsAt := len(data) - len(rest) // just after the options' '{'
	var o sliding.Options
	if r, ok := bytes.CutPrefix(rest, []byte(maxNodesKey)); ok {
		v, r, ok := positiveInt(r)
		if !ok {
			return nil
		}
		o.MaxNodes, rest = v, r
	}
	if !bytes.Equal(rest, []byte("}}")) {
		return nil
	}
	// One allocation for the tiles, one for the rows.
	board := make([]int, n)
	copy(board, cells[:n])
	rows := make([][]int, nrow)
	for i, start := 0, 0; i < nrow; i++ {
		rows[i], start = board[start:rowEnds[i]:rowEnds[i]], rowEnds[i]
	}
	pz := sliding.Puzzle{Board: rows}
	if sliding.Validate(pz) != nil {
		return nil
	}
	p := &Parsed{kind: KindSliding, sliding: pz, slidingO: o, payload: bytes.Clone(data)}
	// The cache key hashes the canonical form, whose options are always
	// {} for sliding (none changes the answer).
	canonical := p.payload
	if o.MaxNodes != 0 {
		canonical = append(append(make([]byte, 0, optsAt+2), data[:optsAt]...), "}}"...)
	}
	sum := sha256.Sum256(canonical)
	p.key = hex.EncodeToString(sum[:])
	p.cells = n
	return p
}

// smallUint reads a tile at the start of b: "0", or one or two digits
// without a leading zero.
func smallUint(b []byte) (int, []byte, bool) {
	if len(b) == 0 || b[0] < '0' || b[0] > '9' {
		return 0, b, false
	}
	v := int(b[0] - '0')
	if v == 0 || len(b) == 1 || b[1] < '0' || b[1] > '9' {
		return v, b[1:], true
	}
	v = v*10 + int(b[1]-'0')
	if len(b) > 2 && b[2] >= '0' && b[2] <= '9' {
		return 0, b, false // three digits: no tile of a valid board
	}
	return v, b[2:], true
}

// positiveInt reads a positive integer of at most 18 digits (so that it
// cannot overflow an int64) without a leading zero at the start of b.
func positiveInt(b []byte) (int64, []byte, bool) {
	if len(b) == 0 || b[0] < '1' || b[0] > '9' {
		return 0, b, false
	}
	var v int64
	i := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if i == 18 {
			return 0, b, false
		}
		v = v*10 + int64(b[i]-'0')
	}
	return v, b[i:], true
}
