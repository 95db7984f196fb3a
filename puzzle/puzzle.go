// Package puzzle is the one place that knows every puzzle kind: it decodes
// a request ({"kind", "puzzle", "options"}) strictly, validates it with the
// solvers' own validators, derives the canonical cache key, and dispatches
// Solve to the right solver.
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
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

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
	kind      Kind
	sliding   sliding.Puzzle
	slidingO  sliding.Options
	sweep     sweep.Puzzle
	sweepO    sweep.Options
	fill      fill.Puzzle
	fillO     fill.Options
	canonical []byte // JSON of kind, puzzle and the options that change the answer
	payload   []byte // JSON of the whole request, options included
}

// Kind returns the puzzle kind.
func (p *Parsed) Kind() Kind { return p.kind }

// Key is the cache key: a hash of the kind, the canonical puzzle and every
// option that changes the answer. Options that only bound the work (node
// budgets) are left out, since only successful answers are cached.
func (p *Parsed) Key() string {
	sum := sha256.Sum256(p.canonical)
	return hex.EncodeToString(sum[:])
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
func (p *Parsed) Cells() int {
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
	var (
		res any
		err error
	)
	switch p.kind {
	case KindSliding:
		res, err = sliding.Solve(ctx, p.sliding, p.slidingO)
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

// Decode parses one JSON request strictly (unknown fields, duplicate keys
// and trailing data are rejected) and validates it. Errors are
// *solvers.InputError with Field as a JSON path from the request root
// ("puzzle.board[2]").
func Decode(data []byte) (*Parsed, error) {
	var req Request
	if err := strictUnmarshal(data, &req); err != nil {
		return nil, err
	}
	if err := checkDuplicateKeys(data); err != nil {
		return nil, err
	}
	return Parse(req)
}

// DecodePayload is Decode for bytes already known to hold no duplicate
// keys, so they are not scanned again: an item of a batch whose whole body
// CheckDuplicateKeys has scanned, or a task payload built by Payload.
func DecodePayload(data []byte) (*Parsed, error) {
	var req Request
	if err := strictUnmarshal(data, &req); err != nil {
		return nil, err
	}
	return Parse(req)
}

// Parse validates an already-split request.
func Parse(req Request) (*Parsed, error) {
	p := &Parsed{kind: req.Kind}
	if len(bytes.TrimSpace(req.Puzzle)) == 0 || bytes.Equal(bytes.TrimSpace(req.Puzzle), []byte("null")) {
		if req.Kind == "" {
			return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "kind", Msg: "kind is required"}
		}
		return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "puzzle", Msg: "puzzle is required"}
	}
	var opts []byte = req.Options
	if len(bytes.TrimSpace(opts)) == 0 || bytes.Equal(bytes.TrimSpace(opts), []byte("null")) {
		opts = []byte("{}")
	}
	var (
		verr   error
		canonP any
		canonO any
		allO   any
	)
	switch req.Kind {
	case KindSliding:
		if err := decodePart(req.Puzzle, &p.sliding, "puzzle"); err != nil {
			return nil, err
		}
		if err := decodePart(opts, &p.slidingO, "options"); err != nil {
			return nil, err
		}
		if p.slidingO.MaxNodes < 0 {
			return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "options.max_nodes", Msg: "max_nodes must not be negative"}
		}
		verr = sliding.Validate(p.sliding)
		canonP, canonO, allO = p.sliding, struct{}{}, p.slidingO
	case KindSweep:
		if err := decodePart(req.Puzzle, &p.sweep, "puzzle"); err != nil {
			return nil, err
		}
		if err := decodePart(opts, &p.sweepO, "options"); err != nil {
			return nil, err
		}
		if p.sweepO.MaxNodes < 0 {
			return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "options.max_nodes", Msg: "max_nodes must not be negative"}
		}
		verr = sweep.Validate(p.sweep)
		canonP, canonO, allO = p.sweep, struct{}{}, p.sweepO
	case KindFill:
		if err := decodePart(req.Puzzle, &p.fill, "puzzle"); err != nil {
			return nil, err
		}
		if err := decodePart(opts, &p.fillO, "options"); err != nil {
			return nil, err
		}
		verr = fill.Validate(p.fill)
		canonP, canonO, allO = p.fill, p.fillO, p.fillO
	case "":
		return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "kind", Msg: "kind is required"}
	default:
		return nil, &solvers.InputError{Code: CodeInvalidRequest, Field: "kind",
			Msg: fmt.Sprintf("unknown kind %q, expected one of sliding, sweep, fill", truncate(string(req.Kind), 40))}
	}
	if verr != nil {
		return nil, prefixField(verr, "puzzle")
	}
	var err error
	if p.canonical, err = json.Marshal(struct {
		Kind    Kind `json:"kind"`
		Puzzle  any  `json:"puzzle"`
		Options any  `json:"options"`
	}{p.kind, canonP, canonO}); err != nil {
		return nil, fmt.Errorf("puzzle: canonical form: %w", err)
	}
	if p.payload, err = json.Marshal(struct {
		Kind    Kind `json:"kind"`
		Puzzle  any  `json:"puzzle"`
		Options any  `json:"options"`
	}{p.kind, canonP, allO}); err != nil {
		return nil, fmt.Errorf("puzzle: payload: %w", err)
	}
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
func (p *Parsed) SlidingPuzzle() sliding.Puzzle { return p.sliding }

// SweepPuzzle returns the board of a KindSweep request.
func (p *Parsed) SweepPuzzle() sweep.Puzzle { return p.sweep }

// FillPuzzle returns the fill puzzle of a KindFill request.
func (p *Parsed) FillPuzzle() fill.Puzzle { return p.fill }

// decodePart decodes one member of the request strictly and turns
// encoding/json's errors into InputErrors that name the field.
func decodePart(data []byte, v any, field string) error {
	if err := strictUnmarshal(data, v); err != nil {
		var ie *solvers.InputError
		if errors.As(err, &ie) {
			return prefixField(ie, field)
		}
		return err
	}
	return nil
}

// strictUnmarshal decodes exactly one JSON value, rejecting unknown fields
// (a misspelt "optoins" must not be silently ignored) and trailing data.
// Duplicate keys are checked once per request, by Decode, over the whole
// request; the parts it decodes are not scanned again.
func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &solvers.InputError{Code: CodeInvalidRequest, Msg: "unexpected data after the JSON value"}
	}
	return nil
}

// CheckDuplicateKeys rejects JSON with a key repeated in one object, for
// callers that decode their own envelopes (a batch's {"tasks": [...]}).
func CheckDuplicateKeys(data []byte) error { return checkDuplicateKeys(data) }

func inputErr(code, field, msg string) *solvers.InputError {
	return &solvers.InputError{Code: code, Field: field, Msg: msg}
}

// DecodeError turns an encoding/json error into an InputError with a
// field path, for callers that decode their own envelopes.
func DecodeError(err error) error { return jsonError(err) }

// jsonError maps an encoding/json error to an InputError with a field.
func jsonError(err error) error {
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &syn):
		return &solvers.InputError{Code: CodeInvalidRequest, Msg: fmt.Sprintf("malformed JSON at byte %d: %v", syn.Offset, syn)}
	case errors.As(err, &typ):
		return &solvers.InputError{Code: CodeInvalidRequest, Field: typ.Field,
			Msg: fmt.Sprintf("%s: expected %s, got %s", orRoot(typ.Field), jsonKind(typ.Type), jsonValue(typ.Value))}
	case errors.Is(err, io.EOF):
		return &solvers.InputError{Code: CodeInvalidRequest, Msg: "empty body: expected a JSON object"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &solvers.InputError{Code: CodeInvalidRequest, Msg: "truncated JSON"}
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		f = strings.Trim(f, `"`)
		return &solvers.InputError{Code: CodeInvalidRequest, Field: f, Msg: fmt.Sprintf("unknown field %q", truncate(f, 40))}
	}
	return &solvers.InputError{Code: CodeInvalidRequest, Msg: "invalid JSON: " + truncate(strings.TrimPrefix(msg, "json: "), 200)}
}

// jsonKind names a Go type in JSON's terms: clients never see Go names.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer within range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "another type"
}

// jsonValue describes what encoding/json found ("number 1e400").
func jsonValue(v string) string {
	if strings.HasPrefix(v, "number") {
		return truncate(v, 40)
	}
	return "a JSON " + truncate(v, 40)
}

func orRoot(f string) string {
	if f == "" {
		return "value"
	}
	return f
}

// prefixField returns err with its Field moved under prefix.
func prefixField(err error, prefix string) error {
	var ie *solvers.InputError
	if !errors.As(err, &ie) {
		return err
	}
	c := *ie
	switch {
	case c.Field == "":
		c.Field = prefix
	case strings.HasPrefix(c.Field, "["):
		c.Field = prefix + c.Field
	default:
		c.Field = prefix + "." + c.Field
	}
	return &c
}

// PrefixField is prefixField for callers that nest requests, such as a
// batch naming "tasks[17]".
func PrefixField(err error, prefix string) error { return prefixField(err, prefix) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
