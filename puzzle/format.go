package puzzle

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/puzzleq/puzzleq/solvers"
	"github.com/puzzleq/puzzleq/solvers/fill"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/solvers/sweep"
)

// Format names an input format of puzzlectl solve and of
// POST /v1/batches?format=, and the output written back in it. The names
// are part of the public API and are stored with each batch.
type Format string

// The formats.
const (
	// FormatJSON is requests as JSON: one per line for puzzlectl, each
	// optionally named by a custom_id (ReadItems), the {"tasks": [...]}
	// body for the API (DecodeBatch). Results are written one JSON object
	// per line, in the order of the requests.
	FormatJSON Format = "json"
	// FormatBOJ1525 is Baekjoon 1525: one sliding board, a row per line;
	// the answer is the number of moves.
	FormatBOJ1525 Format = "boj1525"
	// FormatBOJ9944 is Baekjoon 9944: sweep cases "N M" and N rows until
	// EOF; the answer is "Case k: X" per case.
	FormatBOJ9944 Format = "boj9944"
	// FormatP84021 is Programmers 84021: one fill puzzle as the JSON
	// object {"game_board", "table"}; the answer is the cells filled.
	FormatP84021 Format = "p84021"
)

// Formats lists every format, in the order help texts name them.
var Formats = []Format{FormatBOJ1525, FormatBOJ9944, FormatP84021, FormatJSON}

// MaxJSONLine bounds one request line of FormatJSON, so that input with no
// newline cannot make a reader buffer all of it.
const MaxJSONLine = 16 << 20

// ParseFormat returns the format named s; "" means FormatJSON. An unknown
// name is an InputError on the field "format".
func ParseFormat(s string) (Format, error) {
	if s == "" {
		return FormatJSON, nil
	}
	for _, f := range Formats {
		if string(f) == s {
			return f, nil
		}
	}
	return "", inputErr(CodeInvalidRequest, "format",
		fmt.Sprintf("unknown format %q: expected boj1525, boj9944, p84021 or json", truncate(s, 20)))
}

// ReadRequests reads and validates every request of r in format f before
// any is solved, so that a bad case 9,000 fails at once rather than after
// minutes of work. FormatJSON reads one item per line as ReadItems does,
// and drops the custom_ids: the results are in the order of the lines.
// Errors are *solvers.InputError; Line is the 1-based line at fault, and
// Field is relative to the input ("board[1]", "case[2].board").
func ReadRequests(r io.Reader, f Format) ([]*Parsed, error) {
	switch f {
	case FormatBOJ1525:
		pz, err := sliding.ParseBOJ1525(r)
		if err != nil {
			return nil, err
		}
		p, err := FromSliding(pz, sliding.Options{})
		if err != nil {
			return nil, err
		}
		return []*Parsed{p}, nil
	case FormatP84021:
		data, err := io.ReadAll(io.LimitReader(r, fill.MaxInputBytes+1))
		if err != nil {
			return nil, fmt.Errorf("puzzle: read input: %w", err)
		}
		// The judge's parser gives the best messages (lines, null cells);
		// what it accepts is then held to the rules of every other JSON
		// input, which encoding/json does not apply: exact names, no
		// duplicate names, valid UTF-8.
		pz, err := fill.ParseP84021(bytes.NewReader(data))
		if err != nil {
			return nil, err
		}
		if err := DecodeStrict(data, &fill.Puzzle{}); err != nil {
			return nil, err
		}
		p, err := FromFill(pz, fill.Options{})
		if err != nil {
			return nil, err
		}
		return []*Parsed{p}, nil
	case FormatBOJ9944:
		pzs, err := sweep.ParseBOJ9944(r)
		if err != nil {
			return nil, err
		}
		out := make([]*Parsed, len(pzs))
		for i, pz := range pzs {
			if out[i], err = FromSweep(pz, sweep.Options{}); err != nil {
				err = prefixField(err, "case["+strconv.Itoa(i+1)+"]")
				var ie *solvers.InputError
				if errors.As(err, &ie) {
					ie.Msg = fmt.Sprintf("case %d: %s", i+1, ie.Msg)
				}
				return nil, err
			}
		}
		return out, nil
	case FormatJSON, "":
		reqs, _, err := ReadItems(r)
		return reqs, err
	}
	_, err := ParseFormat(string(f))
	return nil, err
}

// ReadItems reads FormatJSON input as the API reads the lines of an NDJSON
// batch: one item per non-blank line, {"custom_id"?, "kind", "puzzle",
// "options"?}, held to DecodeItem's rules, so that puzzlectl solve takes
// the lines puzzlectl submit takes. A custom_id is unique in the input,
// as in a batch. customIDs[i] is the custom_id of reqs[i], "" when its
// line has none. Errors are ReadRequests'.
func ReadItems(in io.Reader) (reqs []*Parsed, customIDs []string, err error) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), MaxJSONLine)
	seen := CustomIDs{}
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		p, id, err := DecodeItem(b)
		if err != nil {
			return nil, nil, LineError(err, line)
		}
		if id != "" {
			if err := seen.Add(id, line); err != nil {
				return nil, nil, err
			}
		}
		reqs = append(reqs, p)
		customIDs = append(customIDs, id)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			e := solvers.TooLarge("", "longer than %d bytes", MaxJSONLine)
			e.Line = line + 1
			return nil, nil, e
		}
		return nil, nil, fmt.Errorf("puzzle: read input: %w", err)
	}
	return reqs, customIDs, nil
}

// CustomIDs finds a custom_id that an input of lines repeats: the API
// refuses one within a batch, and puzzlectl within its whole input, so
// that each names one line. It maps a custom_id to the line that has it.
type CustomIDs map[string]int

// Add records that line has the custom_id id, or fails, naming both lines,
// when an earlier line has it.
func (c CustomIDs) Add(id string, line int) error {
	if first, ok := c[id]; ok {
		return &solvers.InputError{Code: CodeInvalidRequest, Field: "custom_id", Line: line,
			Msg: fmt.Sprintf("custom_id %q repeats line %d's", id, first)}
	}
	c[id] = line
	return nil
}

// LineError returns err, an error of one request line, as an InputError
// at that line whose message names the field.
func LineError(err error, line int) error {
	var ie *solvers.InputError
	if errors.As(err, &ie) {
		msg := ie.Msg
		if ie.Field != "" && !strings.Contains(msg, ie.Field) {
			msg = ie.Field + ": " + msg
		}
		return &solvers.InputError{Code: ie.Code, Field: ie.Field, Line: line, Msg: msg}
	}
	return fmt.Errorf("line %d: %w", line, err)
}

// WriteResults writes results (what Solve returned, in the order of the
// requests) as format f expects its answer: the judge's exact output, or
// for FormatJSON (and "", a JSON batch) one result object per line. It is
// the one renderer, so puzzlectl solve --local, puzzlectl solve through the
// API and GET /v1/batches/{id}/output print the same bytes.
func WriteResults(w io.Writer, f Format, results []json.RawMessage) error {
	switch f {
	case FormatBOJ1525:
		var r sliding.Result
		if err := oneResult(results, &r); err != nil {
			return err
		}
		return sliding.FormatBOJ1525(w, r)
	case FormatP84021:
		var r fill.Result
		if err := oneResult(results, &r); err != nil {
			return err
		}
		return fill.FormatP84021(w, r)
	case FormatBOJ9944:
		rs := make([]sweep.Result, len(results))
		for i, raw := range results {
			if err := json.Unmarshal(raw, &rs[i]); err != nil {
				return fmt.Errorf("puzzle: case %d: decode result: %w", i+1, err)
			}
		}
		return sweep.FormatBOJ9944(w, rs)
	case FormatJSON, "":
		bw := bufio.NewWriter(w)
		for _, raw := range results {
			bw.Write(raw)
			bw.WriteByte('\n')
		}
		return bw.Flush()
	}
	_, err := ParseFormat(string(f))
	return err
}

// oneResult decodes the only result of a one-case format.
func oneResult(results []json.RawMessage, v any) error {
	if len(results) != 1 {
		return fmt.Errorf("puzzle: the format holds one case, got %d results", len(results))
	}
	if err := json.Unmarshal(results[0], v); err != nil {
		return fmt.Errorf("puzzle: decode result: %w", err)
	}
	return nil
}
