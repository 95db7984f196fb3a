// Package cli implements puzzlectl's commands. main only wires the process
// to Run, so tests drive exactly the code users run.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/puzzleq/puzzleq/solvers"
)

// Exit statuses, following the conventions of kubectl and gh.
const (
	ExitOK          = 0 // success
	ExitFailed      = 1 // a task failed (budget, timeout, internal error)
	ExitUsage       = 2 // bad flags or bad input
	ExitUnreachable = 3 // the server cannot be reached
)

// usageError marks errors that are the caller's fault: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// Run executes puzzlectl with args and returns the process exit status.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(stdin, stdout, stderr)
	// Cobra reports unknown commands and bad arguments as plain errors
	// before any command runs; those are usage errors (exit 2), unlike an
	// error from a command that ran.
	started := false
	root.PersistentPreRun = func(*cobra.Command, []string) { started = true }
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	if !started {
		err = usageError{err}
	}
	fmt.Fprintf(stderr, "puzzlectl: %v\n", err)
	return exitCode(err)
}

func exitCode(err error) int {
	var (
		ue usageError
		ie *solvers.InputError
	)
	switch {
	case errors.As(err, &ue), errors.As(err, &ie):
		return ExitUsage
	default:
		return ExitFailed
	}
}

func newRoot(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "puzzlectl",
		Short: "Solve grid puzzles locally or through a puzzleq server",
		Long: `puzzlectl solves sliding-tile, sweep (board completion) and fill (puzzle
pieces) puzzles, either in this process (--local) or through a puzzleq API.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Flag errors are usage errors: exit 2, not 1.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newSolveCmd())
	return root
}
