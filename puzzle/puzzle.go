// Package puzzle is the one place that knows every puzzle kind: it decodes
// a request ({"kind", "puzzle", "options"}) strictly, validates it with the
// solvers' own validators, derives the canonical cache key, and dispatches
// Solve to the right solver. It also owns what differs by kind elsewhere
// (the task type, in Spec) and the judge formats (ReadRequests and
// WriteResults), so that adding a kind touches this package and its solver,
// and the binaries' configuration only for the kind's deadline setting.
//
// The CLI, the HTTP API and the worker all go through this package, so a
// puzzle that the API accepts is exactly one that the worker can solve, and
// a result solved locally is byte-for-byte the result served remotely.
package puzzle

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/solvers"
	"github.com/puzzleq/puzzleq/solvers/fill"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/solvers/sweep"
)

// Kind names a puzzle type. The strings are part of the public API.
type Kind string

// The puzzle kinds.
const (
	KindSliding Kind = "sliding"
	KindSweep   Kind = "sweep"
	KindFill    Kind = "fill"
)

// Kinds lists every kind, in a stable order.
var Kinds = []Kind{KindSliding, KindSweep, KindFill}

// CodeInvalidRequest marks a request that is not even well-formed: bad
// JSON, an unknown kind, an unknown field. It is the wire contract's code.
const CodeInvalidRequest = apitype.CodeInvalidRequest

// Request is the wire form of one solve request.
type Request struct {
	Kind    Kind            `json:"kind"`
	Puzzle  json.RawMessage `json:"puzzle"`
	Options json.RawMessage `json:"options,omitempty"`
}

// Parsed is a decoded and validated request, ready to solve. It is
// immutable and safe to share.
type Parsed struct {
	kind     Kind
	sliding  sliding.Puzzle
	slidingO sliding.Options
	sweep    sweep.Puzzle
	sweepO   sweep.Options
	fill     fill.Puzzle
	fillO    fill.Options
	payload  []byte // JSON of the whole request, options included
	cells    int    // cells of the board (the game board for fill)
	// compact marks a Parsed that has dropped its solver's input
	// (see Compact); Solve and the accessors decode the payload again.
	compact bool
}

// Kind returns the puzzle kind.
func (p *Parsed) Kind() Kind { return p.kind }

// Key is the cache key: the hex SHA-256 of the canonical JSON of the kind,
// the puzzle and every option that changes the answer. Options that only
// bound the work (node budgets) are left out, since only successful
// answers are cached.
//
// It is computed at each call, not at decoding: most items are cheap and
// never cached (docs/batches.md), and an ingest of a million of them
// would hash a million keys that nobody reads. Its callers (a single
// task, an expensive batch item) ask once or twice per request.
func (p *Parsed) Key() string {
	// Fill's options all change the answer, so its canonical form is its
	// payload: one encoding of a large board, not two. The others' is the
	// payload without the options that only bound the work, which are all
	// of them.
	canonical := p.payload
	switch p.kind {
	case KindSliding:
		// Every single task hashes its key; encoding the board by
		// reflection costs a tenth of the API's own CPU on a cache hit.
		// appendSlidingCanonical writes the same bytes
		// (TestSlidingCanonicalMatchesEncodingJSON).
		var buf [160]byte
		canonical = appendSlidingCanonical(buf[:0], p.sliding.Board)
	case KindSweep:
		canonical = canonicalJSON(p.kind, p.sweep)
	}
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

// canonicalJSON is the form Key hashes: the request without the options
// that only bound the work (all of sliding's and sweep's).
func canonicalJSON(kind Kind, pz any) []byte {
	b, err := json.Marshal(struct {
		Kind    Kind     `json:"kind"`
		Puzzle  any      `json:"puzzle"`
		Options struct{} `json:"options"`
	}{kind, pz, struct{}{}})
	if err != nil {
		// The same values were encoded into the payload by parse.
		panic(fmt.Sprintf("puzzle: canonical form of a %s request: %v", kind, err))
	}
	return b
}

// appendSlidingCanonical appends canonicalJSON(KindSliding,
// sliding.Puzzle{Board: board}) without reflection.
func appendSlidingCanonical(b []byte, board [][]int) []byte {
	b = appendBoardJSON(append(b, `{"kind":"sliding","puzzle":{"board":`...), board)
	return append(b, `},"options":{}}`...)
}

// appendBoardJSON appends a board as encoding/json writes a [][]int:
// integers need no escaping, and a nil board or row is null.
func appendBoardJSON(b []byte, board [][]int) []byte {
	if board == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, row := range board {
		if i > 0 {
			b = append(b, ',')
		}
		if row == nil {
			b = append(b, "null"...)
			continue
		}
		b = append(b, '[')
		for j, v := range row {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(v), 10)
		}
		b = append(b, ']')
	}
	return append(b, ']')
}

// Compact returns p without its solver's input, when that input is much
// larger than the payload (a fill puzzle's two grids take 16 bytes a cell
// as [][]int, against 2 in the payload): Kind, Key, Payload, Cells and
// Cheap are unchanged, and Solve and the puzzle accessors decode the
// payload again. The API keeps batch items compact between decoding and
// enqueueing, so a 12 MB body of 1000x1000 fills holds 12 MB of payloads
// rather than 60 MB of grids.
func (p *Parsed) Compact() *Parsed {
	if p.kind != KindFill || p.compact {
		return p
	}
	c := *p
	c.fill, c.compact = fill.Puzzle{}, true
	return &c
}

// full returns p with its solver's input, decoding the payload again for
// a compact one. The payload was made by parse from a valid request, so
// decoding it cannot fail short of memory corruption.
func (p *Parsed) full() *Parsed {
	if !p.compact {
		return p
	}
	q, err := Decode(p.payload)
	if err != nil {
		panic(fmt.Sprintf("puzzle: the payload of a compact %s request does not decode: %v", p.kind, err))
	}
	return q
}

// Payload is the canonical JSON encoding of the whole request; Decode of
// it yields an equal Parsed. Tasks carry it.
func (p *Parsed) Payload() []byte { return p.payload }

// MaxNodes returns the node budget the request asked for (0 = default).
func (p *Parsed) MaxNodes() int64 {
	switch p.kind {
	case KindSliding:
		return p.slidingO.MaxNodes
	case KindSweep:
		return p.sweepO.MaxNodes
	}
	return 0
}

// WithMaxNodes returns a copy whose node budget is at most limit; a
// request can lower the server's budget but never raise it. limit <= 0
// leaves the request unchanged.
func (p *Parsed) WithMaxNodes(limit int64) *Parsed {
	if limit <= 0 {
		return p
	}
	c := *p
	clamp := func(n int64) int64 {
		if n <= 0 || n > limit {
			return limit
		}
		return n
	}
	switch c.kind {
	case KindSliding:
		c.slidingO.MaxNodes = clamp(c.slidingO.MaxNodes)
	case KindSweep:
		c.sweepO.MaxNodes = clamp(c.sweepO.MaxNodes)
	}
	return &c
}

// WithProgress returns a copy whose search reports to fn: the current
// bound and the nodes searched. Only sliding boards solved by search (more
// than 9 cells) report; for other requests it changes nothing.
func (p *Parsed) WithProgress(fn func(bound int, nodes int64)) *Parsed {
	if p.kind != KindSliding {
		return p
	}
	c := *p
	c.slidingO.Progress = fn
	return &c
}

// Cells is the number of cells of the puzzle's board (the game board for
// fill).
func (p *Parsed) Cells() int { return p.cells }

func cellsOf(p *Parsed) int {
	switch p.kind {
	case KindSliding:
		return len(p.sliding.Board) * len(p.sliding.Board[0])
	case KindSweep:
		return len(p.sweep.Board) * len(p.sweep.Board[0])
	default:
		return len(p.fill.GameBoard) * len(p.fill.GameBoard[0])
	}
}

// Solve runs the solver for the request. The result is the solver's
// Result encoded as compact JSON, identical to what the API serves.
func (p *Parsed) Solve(ctx context.Context) (json.RawMessage, error) {
	p = p.full()
	var (
		res any
		err error
	)
	switch p.kind {
	case KindSliding:
		r, err := sliding.Solve(ctx, p.sliding, p.slidingO)
		if err != nil {
			return nil, err
		}
		if b, ok := appendSlidingResult(nil, r); ok {
			return b, nil
		}
		res = r
	case KindSweep:
		res, err = sweep.Solve(ctx, p.sweep, p.sweepO)
	case KindFill:
		res, err = fill.Solve(ctx, p.fill, p.fillO)
	default:
		return nil, fmt.Errorf("puzzle: unknown kind %q", p.kind)
	}
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("puzzle: encode %s result: %w", p.kind, err)
	}
	return b, nil
}

// Parse validates an already-split request.
func Parse(req Request) (*Parsed, error) { return parse(req.Kind, req.Puzzle, req.Options) }

// parse decodes the parts of a request by its kind and validates them.
func parse(kind Kind, puzzle, options []byte) (*Parsed, error) {
	p := &Parsed{kind: kind}
	if len(bytes.TrimSpace(puzzle)) == 0 || bytes.Equal(bytes.TrimSpace(puzzle), []byte("null")) {
		if kind == "" {
			return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "kind", Msg: "kind is required"}
		}
		return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "puzzle", Msg: "puzzle is required"}
	}
	opts := options
	if len(bytes.TrimSpace(opts)) == 0 || bytes.Equal(bytes.TrimSpace(opts), []byte("null")) {
		opts = []byte("{}")
	}
	var (
		verr   error
		canonP any
		allO   any
	)
	switch kind {
	case KindSliding:
		if err := decodePart(puzzle, &p.sliding, "puzzle"); err != nil {
			return nil, err
		}
		if err := decodePart(opts, &p.slidingO, "options"); err != nil {
			return nil, err
		}
		if p.slidingO.MaxNodes < 0 {
			return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "options.max_nodes", Msg: "max_nodes must not be negative"}
		}
		verr = sliding.Validate(p.sliding)
		canonP, allO = p.sliding, p.slidingO
	case KindSweep:
		if err := decodePart(puzzle, &p.sweep, "puzzle"); err != nil {
			return nil, err
		}
		if err := decodePart(opts, &p.sweepO, "options"); err != nil {
			return nil, err
		}
		if p.sweepO.MaxNodes < 0 {
			return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "options.max_nodes", Msg: "max_nodes must not be negative"}
		}
		verr = sweep.Validate(p.sweep)
		canonP, allO = p.sweep, p.sweepO
	case KindFill:
		if err := decodePart(puzzle, &p.fill, "puzzle"); err != nil {
			return nil, err
		}
		if err := decodePart(opts, &p.fillO, "options"); err != nil {
			return nil, err
		}
		verr = fill.Validate(p.fill)
		canonP, allO = p.fill, p.fillO
	case "":
		return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "kind", Msg: "kind is required"}
	default:
		return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "kind",
			Msg: fmt.Sprintf("unknown kind %q, expected one of sliding, sweep, fill", truncate(string(kind), 40))}
	}
	if verr != nil {
		return nil, prefixField(verr, "puzzle")
	}
	var err error
	if p.payload, err = json.Marshal(struct {
		Kind    Kind `json:"kind"`
		Puzzle  any  `json:"puzzle"`
		Options any  `json:"options"`
	}{p.kind, canonP, allO}); err != nil {
		return nil, fmt.Errorf("puzzle: payload: %w", err)
	}
	p.cells = cellsOf(p)
	return p, nil
}

// FromSliding, FromSweep and FromFill build a Parsed from puzzles already
// in memory (the judge-format parsers), validating them as Decode does.
func FromSliding(pz sliding.Puzzle, o sliding.Options) (*Parsed, error) {
	return fromValue(KindSliding, pz, o)
}

// FromSweep builds a Parsed for a sweep board; see FromSliding.
func FromSweep(pz sweep.Puzzle, o sweep.Options) (*Parsed, error) {
	return fromValue(KindSweep, pz, o)
}

// FromFill builds a Parsed for a fill puzzle; see FromSliding.
func FromFill(pz fill.Puzzle, o fill.Options) (*Parsed, error) {
	return fromValue(KindFill, pz, o)
}

func fromValue(k Kind, pz, o any) (*Parsed, error) {
	pb, err := json.Marshal(pz)
	if err != nil {
		return nil, fmt.Errorf("puzzle: encode %s puzzle: %w", k, err)
	}
	ob, err := json.Marshal(o)
	if err != nil {
		return nil, fmt.Errorf("puzzle: encode %s options: %w", k, err)
	}
	return Parse(Request{Kind: k, Puzzle: pb, Options: ob})
}

// SlidingPuzzle returns the sliding puzzle of a KindSliding request.
func (p *Parsed) SlidingPuzzle() sliding.Puzzle { return p.full().sliding }

// SweepPuzzle returns the board of a KindSweep request.
func (p *Parsed) SweepPuzzle() sweep.Puzzle { return p.full().sweep }

// FillPuzzle returns the fill puzzle of a KindFill request.
func (p *Parsed) FillPuzzle() fill.Puzzle { return p.full().fill }

// appendSlidingResult appends r as encoding/json encodes it, without
// reflection (the encoding was a third of an 8-puzzle's solve). It
// declines (false) a path holding anything but the letters UDLR, which
// would need escaping; the caller encodes those with encoding/json.
func appendSlidingResult(b []byte, r sliding.Result) ([]byte, bool) {
	for i := 0; i < len(r.Path); i++ {
		switch r.Path[i] {
		case 'U', 'D', 'L', 'R':
		default:
			return nil, false
		}
	}
	b = append(b, `{"moves":`...)
	b = strconv.AppendInt(b, int64(r.Moves), 10)
	b = append(b, `,"solvable":`...)
	b = strconv.AppendBool(b, r.Solvable)
	b = append(b, `,"path":"`...)
	b = append(b, r.Path...)
	return append(b, `"}`...), true
}
