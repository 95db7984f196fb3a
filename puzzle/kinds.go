package puzzle

import (
	"errors"
	"fmt"
)

// Task type strings of the single-request task of each kind. They are
// stored in Redis with every queued task, so they never change and are
// never derived from Go names.
const (
	TaskTypeSliding = "solve:sliding"
	TaskTypeSweep   = "solve:sweep"
	TaskTypeFill    = "solve:fill"
)

// Spec is what the queue needs to know about a kind.
type Spec struct {
	// TaskType is the asynq type of a task holding one request of the
	// kind (TaskTypeSliding, ...).
	TaskType string
}

// specs holds every kind's Spec; Kinds lists the same keys.
var specs = map[Kind]Spec{
	KindSliding: {TaskType: TaskTypeSliding},
	KindSweep:   {TaskType: TaskTypeSweep},
	KindFill:    {TaskType: TaskTypeFill},
}

// ErrUnknownKind is wrapped by every error about a kind this package does
// not know. There is no default kind: guessing one would solve the wrong
// puzzle.
var ErrUnknownKind = errors.New("unknown puzzle kind")

// SpecOf returns the Spec of k, or an error wrapping ErrUnknownKind.
func SpecOf(k Kind) (Spec, error) {
	s, ok := specs[k]
	if !ok {
		return Spec{}, fmt.Errorf("puzzle: %w %q", ErrUnknownKind, truncate(string(k), 40))
	}
	return s, nil
}

// Cheap reports whether the request is cheap enough to share a task with
// others: table lookups (sliding boards of up to 9 cells) and linear
// matches (fill), not searches (sweep, and the 15-puzzle and other large
// sliding boards, which can take minutes).
func (p *Parsed) Cheap() bool {
	switch p.kind {
	case KindFill:
		return true
	case KindSliding:
		return p.Cells() <= 9
	}
	return false
}
