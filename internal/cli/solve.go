package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
	"github.com/puzzleq/puzzleq/solvers/fill"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/solvers/sweep"
)

// Input formats accepted by solve.
const (
	formatBOJ1525 = "boj1525"
	formatBOJ9944 = "boj9944"
	formatP84021  = "p84021"
	formatJSON    = "json"
)

// maxJSONLine bounds one request line of the json format, so a file with
// no newlines cannot make puzzlectl buffer it whole.
const maxJSONLine = 16 << 20

func newSolveCmd(g *globals) *cobra.Command {
	var (
		format string
		local  bool
	)
	cmd := &cobra.Command{
		Use:   "solve --format FORMAT",
		Short: "Solve puzzles read from stdin in a judge format",
		Long: `Read puzzles from stdin in a judge format and write exactly the judge's
answer to stdout: in this process with --local, else through the API (as one
batch, waiting for its results), with byte-for-byte the same output.

Formats:
  boj1525  Baekjoon 1525: a sliding board, one row per line; prints the moves
  boj9944  Baekjoon 9944: cases "N M" + N rows until EOF; prints "Case k: X"
  p84021   Programmers 84021: {"game_board": [[...]], "table": [[...]]}; prints the cells filled
  json     one request per line, {"kind": "...", "puzzle": {...}}; prints one result object per line`,
		Example: `  printf '1 0 3\n4 2 5\n7 8 6\n' | puzzlectl solve --local --format boj1525
  puzzlectl solve --format boj9944 < cases.txt
  puzzlectl solve --local --format json < requests.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var s solver = localSolver{}
			if !local {
				s = remoteSolver{g: g, stderr: cmd.ErrOrStderr()}
			}
			return solveFormat(cmd, format, s)
		},
	}
	cmd.Flags().StringVarP(&format, "format", "f", formatJSON, "input format: boj1525, boj9944, p84021 or json")
	cmd.Flags().BoolVar(&local, "local", false, "solve in this process instead of through the API")
	return cmd
}

// solver turns a validated request into the result JSON. The local and
// remote modes differ only here, which is what keeps their output equal.
type solver interface {
	solveAll(cmd *cobra.Command, reqs []*puzzle.Parsed) ([]json.RawMessage, error)
}

type localSolver struct{}

func (localSolver) solveAll(cmd *cobra.Command, reqs []*puzzle.Parsed) ([]json.RawMessage, error) {
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

func solveFormat(cmd *cobra.Command, format string, s solver) error {
	in, out := cmd.InOrStdin(), cmd.OutOrStdout()
	switch format {
	case formatBOJ1525:
		pz, err := sliding.ParseBOJ1525(in)
		if err != nil {
			return err
		}
		res, err := solveOne[sliding.Result](cmd, s, func() (*puzzle.Parsed, error) { return puzzle.FromSliding(pz, sliding.Options{}) })
		if err != nil {
			return err
		}
		return sliding.FormatBOJ1525(out, res)
	case formatP84021:
		pz, err := fill.ParseP84021(in)
		if err != nil {
			return err
		}
		res, err := solveOne[fill.Result](cmd, s, func() (*puzzle.Parsed, error) { return puzzle.FromFill(pz, fill.Options{}) })
		if err != nil {
			return err
		}
		return fill.FormatP84021(out, res)
	case formatBOJ9944:
		pzs, err := sweep.ParseBOJ9944(in)
		if err != nil {
			return err
		}
		reqs := make([]*puzzle.Parsed, len(pzs))
		for i, pz := range pzs {
			if reqs[i], err = puzzle.FromSweep(pz, sweep.Options{}); err != nil {
				return fmt.Errorf("case %d: %w", i+1, err)
			}
		}
		raws, err := s.solveAll(cmd, reqs)
		if err != nil {
			return err
		}
		results := make([]sweep.Result, len(raws))
		for i, raw := range raws {
			if err := json.Unmarshal(raw, &results[i]); err != nil {
				return fmt.Errorf("case %d: decode result: %w", i+1, err)
			}
		}
		return sweep.FormatBOJ9944(out, results)
	case formatJSON:
		reqs, err := readJSONLines(in)
		if err != nil {
			return err
		}
		raws, err := s.solveAll(cmd, reqs)
		if err != nil {
			return err
		}
		w := bufio.NewWriter(out)
		for _, raw := range raws {
			w.Write(raw)
			w.WriteByte('\n')
		}
		return w.Flush()
	default:
		return usagef("unknown format %q: expected boj1525, boj9944, p84021 or json", format)
	}
}

func solveOne[R any](cmd *cobra.Command, s solver, build func() (*puzzle.Parsed, error)) (R, error) {
	var res R
	req, err := build()
	if err != nil {
		return res, err
	}
	raws, err := s.solveAll(cmd, []*puzzle.Parsed{req})
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal(raws[0], &res); err != nil {
		return res, fmt.Errorf("decode result: %w", err)
	}
	return res, nil
}

// readJSONLines reads and validates every request before solving any, so
// a bad line 9,000 fails fast instead of after minutes of work.
func readJSONLines(in io.Reader) ([]*puzzle.Parsed, error) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), maxJSONLine)
	var reqs []*puzzle.Parsed
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		p, err := puzzle.Decode(b)
		if err != nil {
			return nil, lineError(err, line)
		}
		reqs = append(reqs, p)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, usagef("line %d: longer than %d bytes", line+1, maxJSONLine)
		}
		return nil, fmt.Errorf("read input: %w", err)
	}
	return reqs, nil
}

func lineError(err error, line int) error {
	var ie *solvers.InputError
	if errors.As(err, &ie) {
		msg := ie.Msg
		if ie.Field != "" && !bytes.Contains([]byte(msg), []byte(ie.Field)) {
			msg = ie.Field + ": " + msg
		}
		return &solvers.InputError{Code: ie.Code, Field: ie.Field, Line: line, Msg: msg}
	}
	return fmt.Errorf("line %d: %w", line, err)
}
