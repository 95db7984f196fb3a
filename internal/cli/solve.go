package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/puzzleq/puzzleq/puzzle"
)

// maxJSONLine bounds one request line of the json format, so a file with
// no newlines cannot make puzzlectl buffer it whole.
const maxJSONLine = puzzle.MaxJSONLine

func newSolveCmd(g *globals) *cobra.Command {
	var (
		format  string
		local   bool
		webhook string
	)
	cmd := &cobra.Command{
		Use:   "solve --format FORMAT",
		Short: "Solve puzzles read from stdin in a judge format",
		Long: `Read puzzles from stdin in a judge format and write exactly the judge's
answer to stdout: in this process with --local, else through the API, with
byte-for-byte the same output. Up to 8 puzzles go as single tasks on the
interactive queue, each one request that waits for its answer; more go as one
batch, waiting for its results (its items carry their custom_id; a single
task takes none).

Formats:
  boj1525  Baekjoon 1525: a sliding board, one row per line; prints the moves
  boj9944  Baekjoon 9944: cases "N M" + N rows until EOF; prints "Case k: X"
  p84021   Programmers 84021: {"game_board": [[...]], "table": [[...]]}; prints the cells filled
  json     one request per line, {"kind": "...", "puzzle": {...}}, the lines submit takes:
           a line may name its request with "custom_id" (a string of at most 64 bytes,
           unique in the input); prints one result object per line, in the order of the
           lines, without the custom_id`,
		Example: `  printf '1 0 3\n4 2 5\n7 8 6\n' | puzzlectl solve --local --format boj1525
  puzzlectl solve --format boj9944 < cases.txt
  puzzlectl solve --local --format json < requests.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var s solver = localSolver{}
			switch {
			case local && webhook != "":
				return usagef("--webhook needs the API: it cannot be used with --local")
			case !local:
				s = remoteSolver{g: g, stderr: cmd.ErrOrStderr(), webhook: webhook}
			}
			return solveFormat(cmd, format, s)
		},
	}
	cmd.Flags().StringVarP(&format, "format", "f", string(puzzle.FormatJSON), "input format: boj1525, boj9944, p84021 or json")
	cmd.Flags().BoolVar(&local, "local", false, "solve in this process instead of through the API")
	cmd.Flags().StringVar(&webhook, "webhook", "", "completion webhook URL of each task or batch submitted (the server POSTs a signed event to it when it ends)")
	return cmd
}

// solver turns validated requests into their result JSON, in order. The
// local and remote modes differ only here, which is what keeps their
// output equal. customIDs[i], when customIDs is not nil, is the
// custom_id of reqs[i] ("" for none): it names the request to the API and
// never changes its result.
type solver interface {
	solveAll(cmd *cobra.Command, reqs []*puzzle.Parsed, customIDs []string) ([]json.RawMessage, error)
}

type localSolver struct{}

func (localSolver) solveAll(cmd *cobra.Command, reqs []*puzzle.Parsed, _ []string) ([]json.RawMessage, error) {
	usePDBDir(cmd.ErrOrStderr())
	out := make([]json.RawMessage, len(reqs))
	for i, r := range reqs {
		res, err := r.Solve(cmd.Context())
		if err != nil {
			return nil, fmt.Errorf("case %d: %w", i+1, err)
		}
		out[i] = res
	}
	return out, nil
}

// solveFormat reads every request in the format, solves them all, and
// writes the answers back in the same format. puzzle owns the formats, so
// the local and the remote mode (and the API's batch output) share them.
func solveFormat(cmd *cobra.Command, name string, s solver) error {
	f, err := puzzle.ParseFormat(name)
	if err != nil {
		return usageError{err}
	}
	var (
		reqs      []*puzzle.Parsed
		customIDs []string
	)
	if f == puzzle.FormatJSON {
		// Lines as submit takes them, custom_id and all: the output is
		// one result per line in their order, which is the correlation.
		reqs, customIDs, err = puzzle.ReadItems(cmd.InOrStdin())
	} else {
		reqs, err = puzzle.ReadRequests(cmd.InOrStdin(), f)
	}
	if err != nil {
		return err
	}
	raws, err := s.solveAll(cmd, reqs, customIDs)
	if err != nil {
		return err
	}
	return puzzle.WriteResults(cmd.OutOrStdout(), f, raws)
}
