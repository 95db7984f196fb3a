package fill

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/puzzleq/puzzleq/solvers"
)

// MaxInputBytes caps what ParseP84021 reads. Two 1000×1000 grids written
// as "0," take about 4 MB; the cap leaves room for whitespace while
// bounding the memory a hostile input can make the decoder use.
const MaxInputBytes = 16 << 20

// ParseP84021 reads one JSON object {"game_board": [[...]], "table":
// [[...]]} (the arguments of the Programmers 84021 solution function) and
// validates it. Unknown members and anything but whitespace after the
// object are rejected. Every error is a *solvers.InputError; syntax errors
// carry the line (in Line) and byte offset.
func ParseP84021(r io.Reader) (Puzzle, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxInputBytes+1))
	if err != nil {
		return Puzzle{}, solvers.Invalid("", "reading input: %v", err)
	}
	if len(data) > MaxInputBytes {
		return Puzzle{}, solvers.TooLarge("", "input is larger than %d bytes", MaxInputBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return Puzzle{}, solvers.Invalid("", "input is empty, expected a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p Puzzle
	if err := dec.Decode(&p); err != nil {
		return Puzzle{}, jsonError(data, err)
	}
	off := int(dec.InputOffset())
	if rest := bytes.TrimLeft(data[off:], " \t\r\n"); len(rest) > 0 {
		at := len(data) - len(rest)
		e := solvers.Invalid("", "unexpected data after the JSON object at byte offset %d", at)
		e.Line = lineAt(data, at)
		return Puzzle{}, e
	}
	// encoding/json decodes null as 0, which would silently turn a null
	// cell into a hole or an empty table cell. Only inputs that contain
	// the word pay for the check.
	if bytes.Contains(data, []byte("null")) {
		if e := findNull(data); e != nil {
			return Puzzle{}, e
		}
	}
	if err := Validate(p); err != nil {
		return Puzzle{}, err
	}
	return p, nil
}

// findNull reports the first null cell value, if any.
func findNull(data []byte) *solvers.InputError {
	var raw struct {
		GameBoard json.RawMessage `json:"game_board"`
		Table     json.RawMessage `json:"table"`
	}
	if json.Unmarshal(data, &raw) != nil {
		return nil
	}
	for _, g := range []struct {
		name string
		data json.RawMessage
	}{{"game_board", raw.GameBoard}, {"table", raw.Table}} {
		var rows []json.RawMessage
		if json.Unmarshal(g.data, &rows) != nil {
			continue
		}
		for i, row := range rows {
			var vals []json.RawMessage
			if json.Unmarshal(row, &vals) != nil {
				continue
			}
			for j, v := range vals {
				if string(bytes.TrimSpace(v)) == "null" {
					return solvers.Invalid(fieldCell(g.name, i, j), "%s row %d, column %d: value null is not 0 or 1", g.name, i+1, j+1)
				}
			}
		}
	}
	return nil
}

// jsonError turns an encoding/json error into an InputError that names
// the place.
func jsonError(data []byte, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		e := solvers.Invalid("", "invalid JSON at byte offset %d: %s", syn.Offset, strings.TrimPrefix(syn.Error(), "json: "))
		e.Line = lineAt(data, int(syn.Offset))
		return e
	case errors.As(err, &typ):
		if e := locate(data, typ.Field); e != nil {
			e.Line = lineAt(data, int(typ.Offset))
			return e
		}
		field := jsonPath(typ.Field)
		what := "the puzzle"
		if field != "" {
			what = field
		}
		e := solvers.Invalid(field, "%s: JSON %s at byte offset %d cannot be %s", what, typ.Value, typ.Offset, goTypeName(typ.Type.String()))
		e.Line = lineAt(data, int(typ.Offset))
		return e
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		e := solvers.Invalid("", "unexpected end of JSON input at byte offset %d", len(data))
		e.Line = lineAt(data, len(data))
		return e
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return solvers.Invalid("", "unknown field %s, expected only \"game_board\" and \"table\"", name)
	default:
		return solvers.Invalid("", "invalid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
}

// locate finds the row and column of a value of the wrong type, which
// encoding/json does not report for nested arrays. It runs only on the
// error path, re-reading the offending grid as raw JSON.
func locate(data []byte, field string) *solvers.InputError {
	name, _, _ := strings.Cut(field, ".")
	var raw struct {
		GameBoard json.RawMessage `json:"game_board"`
		Table     json.RawMessage `json:"table"`
	}
	if json.Unmarshal(data, &raw) != nil {
		return nil
	}
	grid := raw.GameBoard
	if name == "table" {
		grid = raw.Table
	} else if name != "game_board" {
		return nil
	}
	var rows []json.RawMessage
	if json.Unmarshal(grid, &rows) != nil {
		return solvers.Invalid(name, "%s is not an array of rows", name)
	}
	for i, row := range rows {
		var vals []json.RawMessage
		if json.Unmarshal(row, &vals) != nil {
			return solvers.Invalid(fieldRow(name, i), "%s row %d is not an array of numbers", name, i+1)
		}
		for j, v := range vals {
			var x int
			if json.Unmarshal(v, &x) != nil {
				return solvers.Invalid(fieldCell(name, i, j), "%s row %d, column %d: value %s is not 0 or 1", name, i+1, j+1, clip(string(v)))
			}
		}
	}
	return nil
}

// clip shortens a quoted value so that an error message stays small.
func clip(s string) string {
	if len(s) > 40 {
		return s[:37] + "..."
	}
	return s
}

// jsonPath turns encoding/json's "game_board.2.3" into "game_board[2][3]".
func jsonPath(f string) string {
	if f == "" {
		return ""
	}
	parts := strings.Split(f, ".")
	var b strings.Builder
	b.WriteString(parts[0])
	for _, p := range parts[1:] {
		b.WriteString("[" + p + "]")
	}
	return b.String()
}

func goTypeName(t string) string {
	switch t {
	case "int":
		return "an integer"
	case "[]int":
		return "a row (an array of integers)"
	case "[][]int":
		return "a grid (an array of rows)"
	case "fill.Puzzle":
		return "the puzzle object"
	}
	return "a " + t
}

// lineAt is the 1-based line holding byte offset off.
func lineAt(data []byte, off int) int {
	off = min(max(off, 0), len(data))
	return 1 + bytes.Count(data[:off], []byte{'\n'})
}

// FormatP84021 writes the judge's answer: the number of filled cells and
// a newline.
func FormatP84021(w io.Writer, res Result) error {
	_, err := fmt.Fprintf(w, "%d\n", res.Filled)
	return err
}
