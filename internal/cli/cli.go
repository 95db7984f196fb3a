// Package cli implements puzzlectl's commands. main only wires the process
// to Run, so tests drive exactly the code users run.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/solvers"
)

// Exit statuses, following the conventions of kubectl and gh; each cause
// has its own, so scripts can branch on them.
const (
	ExitOK          = 0   // success
	ExitFailed      = 1   // a task failed (budget, timeout, internal error), or the server is not healthy
	ExitUsage       = 2   // bad flags or bad input
	ExitUnreachable = 3   // the server cannot be reached
	ExitNotFound    = 4   // no such task or batch, or the API key is refused (401, 403, 404)
	ExitTimeout     = 5   // a --wait or --watch ran out of its --timeout before the work ended
	ExitConflict    = 6   // the request conflicts with the work's state (409): a cancel after it ended, an Idempotency-Key in use
	ExitInterrupted = 130 // interrupted (Ctrl-C, SIGTERM): 128 + SIGINT, as shells report it
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
	root, g := newRoot(stdin, stdout, stderr)
	defer g.close()
	// Cobra reports unknown commands and bad arguments as plain errors
	// before any command runs; those are usage errors (exit 2), unlike an
	// error from a command that ran.
	started := false
	root.PersistentPreRun = func(*cobra.Command, []string) { started = true }
	root.SetArgs(args)
	err := root.ExecuteContext(envTrace(ctx))
	if err == nil {
		return ExitOK
	}
	if !started {
		err = usageError{err}
	}
	if ctx.Err() != nil {
		// Interrupted: whatever the command made of the cancel, the
		// cause is the signal.
		fmt.Fprintf(stderr, "puzzlectl: interrupted: %v\n", err)
		return ExitInterrupted
	}
	fmt.Fprintf(stderr, "puzzlectl: %v%s\n", err, hint(err))
	return exitCode(err)
}

// hint says which flag or environment variable a failure points at.
func hint(err error) string {
	var ae *client.Error
	switch {
	case errors.As(err, &ae) && ae.StatusCode == 401:
		return "\n  the server wants an API key: pass --api-key KEY or set PUZZLEQ_API_KEY"
	case errors.As(err, &ae) && ae.StatusCode == 404 && ae.Code == "not_found":
		return "\n  check the ID, and that --server (PUZZLEQ_URL) and --api-key (PUZZLEQ_API_KEY) are the ones it was created with: another key's tasks and batches are not found"
	case errors.Is(err, client.ErrUnreachable):
		return "\n  is the server running? Set --server URL or PUZZLEQ_URL (default " + defaultServer + ")"
	case errors.Is(err, errWaitTimeout):
		return "\n  wait longer with a larger --timeout, or without it"
	}
	return ""
}

func exitCode(err error) int {
	var (
		ue usageError
		ie *solvers.InputError
		ae *client.Error
	)
	switch {
	case errors.As(err, &ue), errors.As(err, &ie):
		return ExitUsage
	case errors.Is(err, client.ErrUnreachable):
		return ExitUnreachable
	case errors.Is(err, errWaitTimeout):
		return ExitTimeout
	case errors.As(err, &ae) && ae.StatusCode == 409:
		return ExitConflict
	case errors.As(err, &ae) && (ae.StatusCode == 401 || ae.StatusCode == 403 || ae.StatusCode == 404):
		return ExitNotFound
	case errors.As(err, &ae) && (ae.StatusCode == 400 || ae.StatusCode == 413 || ae.StatusCode == 422):
		// The server rejected the input: the caller's fault, as locally.
		return ExitUsage
	default:
		return ExitFailed
	}
}

func newRoot(stdin io.Reader, stdout, stderr io.Writer) (*cobra.Command, *globals) {
	root := &cobra.Command{
		Use:   "puzzlectl",
		Short: "Solve grid puzzles locally or through a puzzleq server",
		Long: `puzzlectl solves sliding-tile, sweep (board completion) and fill (puzzle
pieces) puzzles, either in this process (--local) or through a puzzleq API,
and submits and inspects tasks and batches of the API.

The server is --server, else $PUZZLEQ_URL, else the config file's context
(puzzlectl config), else http://localhost:8080; the API key is --api-key,
else $PUZZLEQ_API_KEY, else the context's. --context NAME picks a context
over the environment. "puzzlectl completion bash|zsh|fish|powershell"
writes a shell's completion script; it completes flag values and the IDs
of the newest tasks and batches.

Exit status:
  0    success
  1    a task failed or was canceled (or, for health, the server is not healthy)
  2    bad flags or input
  3    the server cannot be reached (after retries)
  4    no such task or batch, or the API key is refused (401, 403, 404)
  5    a --wait or --watch ran out of --timeout before the work ended
  6    a conflict with the work's state (409): cancel of a task or batch
       that has ended, an Idempotency-Key whose first request still runs
  130  interrupted (Ctrl-C)

Output (-o): table for people; json and yaml print one document (a list is
one array), ndjson one object per line (the default of submit and results,
whose output is a stream).`,
		Example: `  printf '1 0 3\n4 2 5\n7 8 6\n' | puzzlectl solve --format boj1525
  puzzlectl submit -f jobs.jsonl --wait --out results.jsonl
  puzzlectl batch 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f --watch
  puzzlectl results 9a1b3c5d7e9f0a1b5c0d8f0e2b6a4e7f --state failed
  puzzlectl list batches --state failed
  puzzlectl health --server http://puzzleq:8080`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Flag errors are usage errors: exit 2, not 1.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	g := &globals{}
	g.bind(root)
	root.Version = Version
	root.SetVersionTemplate("puzzlectl {{.Version}}\n")
	root.AddCommand(newSolveCmd(g), newSubmitCmd(g), newGetCmd(g), newCancelCmd(g), newDeleteCmd(g), newRetryCmd(g), newBatchCmd(g), newHealthCmd(g),
		newResultsCmd(g), newListCmd(g), newConfigCmd(g), newPDBCmd(), newVersionCmd())
	registerFlagCompletions(root)
	return root, g
}
