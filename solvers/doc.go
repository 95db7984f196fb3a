// Package solvers holds what the puzzle solvers share: the typed input
// error and the sentinel errors that callers map to task failure codes.
//
// The solvers themselves live in the subpackages sliding, sweep and fill.
// They are pure Go: no I/O, no Redis, no HTTP. Each exposes
//
//	Validate(Puzzle) error
//	Solve(ctx, Puzzle, Options) (Result, error)
//
// plus parse and format functions for its judge format. Every solver polls
// ctx inside its search loop, so a cancelled request stops quickly.
package solvers

import (
	"errors"
	"fmt"
)

// Error codes carried by InputError. They are part of the public HTTP
// contract (the "code" member of an error object), so they never change.
const (
	// CodeInvalidPuzzle marks input that is malformed or breaks a rule.
	CodeInvalidPuzzle = "invalid_puzzle"
	// CodeTooLarge marks input that is well formed but over a size limit.
	CodeTooLarge = "too_large"
)

// InputError reports input that can never be solved as given. Field is a
// JSON-style path relative to the puzzle object ("board", "board[2][1]",
// "game_board"), so that an API can prefix it with "puzzle." or
// "tasks[17].puzzle.". Line, when non-zero, is the 1-based input line of a
// judge-format parser.
type InputError struct {
	Code  string // CodeInvalidPuzzle or CodeTooLarge
	Field string // path inside the puzzle object; may be empty
	Line  int    // 1-based line of judge-format input; 0 when not from text
	Msg   string // human-readable, names the place: "row 3: expected 3 numbers, got 2"
}

func (e *InputError) Error() string {
	switch {
	case e.Line > 0:
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	default:
		return e.Msg
	}
}

// Invalid builds an InputError with CodeInvalidPuzzle.
func Invalid(field, format string, args ...any) *InputError {
	return &InputError{Code: CodeInvalidPuzzle, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// TooLarge builds an InputError with CodeTooLarge.
func TooLarge(field, format string, args ...any) *InputError {
	return &InputError{Code: CodeTooLarge, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// AtLine returns a copy of err with Line set, for judge-format parsers
// that validate a puzzle after reading it.
func AtLine(err error, line int) error {
	var ie *InputError
	if errors.As(err, &ie) {
		c := *ie
		c.Line = line
		return &c
	}
	return err
}

// ErrBudgetExceeded is returned (possibly wrapped) when a search runs past
// the node budget set in its Options. Retrying cannot help.
var ErrBudgetExceeded = errors.New("node budget exceeded")
