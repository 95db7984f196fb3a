package puzzle_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
)

const (
	kelvin = "\u212a" // KELVIN SIGN: encoding/json folds it to k
	longS  = "\u017f" // LATIN SMALL LETTER LONG S: folds to s
	board3 = `{"board":[[1,0,3],[4,2,5],[7,8,6]]}`
	sweep1 = `{"kind":"sweep","puzzle":{"board":["."]}}`
)

// foldedNames are requests that encoding/json would read as something
// else than a reader that takes names as written: by folding case, by
// keeping the last of two equal names, or both. Each must be refused,
// naming the key at fault, whoever decodes it.
var foldedNames = []struct{ name, in, field string }{
	{"KIND beside kind", `{"kind":"sliding","KIND":"sweep","puzzle":` + board3 + `}`, "KIND"},
	{"KIND alone", `{"KIND":"sliding","puzzle":` + board3 + `}`, "KIND"},
	{"Kelvin-sign kind", `{"kind":"sliding","` + kelvin + `ind":"sweep","puzzle":` + board3 + `}`, kelvin + "ind"},
	{"escaped Kelvin-sign kind", `{"kind":"sliding","\u212Aind":"sweep","puzzle":` + board3 + `}`, kelvin + "ind"},
	{"long-s options", `{"kind":"sweep","puzzle":{"board":["."]},"option` + longS + `":{"max_nodes":1}}`, "option" + longS},
	{"Board beside board", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]],"Board":[[1,2,3],[4,5,6],[7,0,8]]}}`, "puzzle.Board"},
	{"MAX_NODES", `{"kind":"sweep","puzzle":{"board":["."]},"options":{"max_nodes":9,"MAX_NODES":1}}`, "options.MAX_NODES"},
	{"Allow_Flip", `{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[1,0]]},"options":{"Allow_Flip":true}}`, "options.Allow_Flip"},
	{"kind twice", `{"kind":"sliding","kind":"sweep","puzzle":` + board3 + `}`, "kind"},
	{"escaped kind twice", `{"kind":"sweep","k\u0069nd":"sweep","puzzle":{"board":["."]}}`, "kind"},
	{"puzzle twice", `{"kind":"sliding","puzzle":` + board3 + `,"puzzle":` + board3 + `}`, "puzzle"},
	{"board twice", `{"kind":"sweep","puzzle":{"board":["."],"board":[".."]}}`, "puzzle.board"},
	{"table twice", `{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[1,0]],"table":[[0,1]]}}`, "puzzle.table"},
	{"options twice", `{"kind":"sweep","puzzle":{"board":["."]},"options":{},"options":{"max_nodes":1}}`, "options"},
	{"max_nodes twice", `{"kind":"sweep","puzzle":{"board":["."]},"options":{"max_nodes":1,"max_nodes":2}}`, "options.max_nodes"},
}

func wantInvalidRequest(t *testing.T, what string, err error, field string) {
	t.Helper()
	var ie *solvers.InputError
	if !errors.As(err, &ie) {
		t.Errorf("%s: error %v (%T), want an InputError on %q", what, err, err, field)
		return
	}
	if ie.Code != puzzle.CodeInvalidRequest || ie.Field != field {
		t.Errorf("%s: code %q field %q (%s), want invalid_request on %q", what, ie.Code, ie.Field, ie.Msg, field)
	}
	last := field[strings.LastIndexAny(field, ".]")+1:]
	if !strings.Contains(ie.Msg, `"`+last+`"`) {
		t.Errorf("%s: message %q does not name %q", what, ie.Msg, last)
	}
}

// TestNamesAreExactAndUnique holds every request decoder (a task and a
// task payload's request, both Decode; an item of a batch; a line of
// puzzlectl's json format) to the same decision on every folded or
// repeated name.
func TestNamesAreExactAndUnique(t *testing.T) {
	t.Parallel()
	for _, tc := range foldedNames {
		_, err := puzzle.Decode([]byte(tc.in))
		wantInvalidRequest(t, tc.name+" (Decode)", err, tc.field)
		_, err = puzzle.DecodeBatch([]byte(`{"tasks":[`+sweep1+`,`+tc.in+`]}`), 0)
		wantInvalidRequest(t, tc.name+" (DecodeBatch)", err, "tasks[1]."+tc.field)
		_, err = puzzle.ReadRequests(strings.NewReader(sweep1+"\n"+tc.in+"\n"), puzzle.FormatJSON)
		wantInvalidRequest(t, tc.name+" (ReadRequests)", err, tc.field)
		var ie *solvers.InputError
		if errors.As(err, &ie) && ie.Line != 2 {
			t.Errorf("%s (ReadRequests): line %d, want 2", tc.name, ie.Line)
		}
	}
	for _, tc := range []struct{ name, in, field string }{
		{"TASKS beside tasks", `{"tasks":[],"TASKS":[` + sweep1 + `]}`, "TASKS"},
		{"Tasks alone", `{"Tasks":[` + sweep1 + `]}`, "Tasks"},
		{"long-s tasks", `{"tasks":[],"ta` + longS + `ks":[` + sweep1 + `]}`, "ta" + longS + "ks"},
		{"tasks twice", `{"tasks":[` + sweep1 + `],"tasks":[` + sweep1 + `,` + sweep1 + `]}`, "tasks"},
	} {
		_, err := puzzle.DecodeBatch([]byte(tc.in), 0)
		wantInvalidRequest(t, tc.name, err, tc.field)
	}
	for _, tc := range []struct{ name, in, field string }{
		{"TABLE", `{"game_board":[[0,1]],"TABLE":[[1,0]]}`, "TABLE"},
		{"table twice", `{"game_board":[[0,1]],"table":[[0,0]],"table":[[1,0]]}`, "table"},
	} {
		_, err := puzzle.ReadRequests(strings.NewReader(tc.in), puzzle.FormatP84021)
		wantInvalidRequest(t, tc.name+" (p84021)", err, tc.field)
	}
}

func TestBatchErrorsNameTheItem(t *testing.T) {
	t.Parallel()
	var items []string
	for range 17 {
		items = append(items, sweep1)
	}
	items = append(items, `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,"6"]]}}`)
	_, err := puzzle.DecodeBatch([]byte(`{"tasks":[`+strings.Join(items, ",")+`]}`), 0)
	var ie *solvers.InputError
	if !errors.As(err, &ie) || ie.Field != "tasks[17].puzzle.board[2][2]" || !strings.HasPrefix(ie.Msg, "tasks[17].puzzle.board[2][2]: ") {
		t.Fatalf("error %#v, want one on tasks[17].puzzle.board[2][2]", err)
	}
	_, err = puzzle.DecodeBatch([]byte(`{"tasks":[`+sweep1+`,`+sweep1+`]}`), 1)
	if !errors.As(err, &ie) || ie.Code != solvers.CodeTooLarge || ie.Field != "tasks" {
		t.Fatalf("over maxItems: %v", err)
	}
	for _, in := range []string{`{}`, `{"tasks":null}`} {
		if _, err := puzzle.DecodeBatch([]byte(in), 0); !errors.As(err, &ie) || ie.Field != "tasks" {
			t.Errorf("%s: %v, want tasks is required", in, err)
		}
	}
	reqs, err := puzzle.DecodeBatch([]byte(`{"tasks":[`+sweep1+`,{"kind":"sliding","puzzle":`+board3+`}]}`), 2)
	if err != nil || len(reqs) != 2 || reqs[1].Kind() != puzzle.KindSliding {
		t.Fatalf("valid batch: %v %v", reqs, err)
	}
}

// TestErrorsStayBounded: whatever the body, the field and the message
// echoed back stay small and valid UTF-8.
func TestErrorsStayBounded(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		strings.Repeat(`{"kind":`, 50000),
		strings.Repeat(`[`, 50000),
		`{"kind":"sweep","puzzle":{"board":["."]},"` + strings.Repeat(kelvin, 1000) + `":1}`,
		`{"tasks":[` + strings.Repeat(`[`, 20000) + `]}`,
	} {
		_, err := puzzle.Decode([]byte(in))
		var ie *solvers.InputError
		if !errors.As(err, &ie) || len(ie.Field) > 300 || len(ie.Msg) > 400 ||
			!utf8.ValidString(ie.Field+ie.Msg) {
			t.Errorf("%.40s...: unbounded or invalid error %#v", in, err)
		}
	}
}

func TestUnknownKindIsAnError(t *testing.T) {
	t.Parallel()
	for _, k := range puzzle.Kinds {
		if s, err := puzzle.SpecOf(k); err != nil || s.TaskType == "" {
			t.Errorf("%s: %+v %v", k, s, err)
		}
	}
	if _, err := puzzle.SpecOf("tetris"); !errors.Is(err, puzzle.ErrUnknownKind) {
		t.Errorf("SpecOf(tetris): %v, want ErrUnknownKind", err)
	}
	if _, err := puzzle.SpecOf(""); !errors.Is(err, puzzle.ErrUnknownKind) {
		t.Errorf("SpecOf(\"\"): %v, want ErrUnknownKind", err)
	}
}

// TestNumericNamesAreNamesNotIndexes: a member named "0" is reported as
// a name, not as element 0 of an array.
func TestNumericNamesAreNamesNotIndexes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, field string }{
		{`{"kind":"sweep","puzzle":{"board":["."]},"0":1}`, "0"},
		{`{"kind":"sweep","puzzle":{"board":["."],"7":1}}`, "puzzle.7"},
		{`{"kind":"sweep","puzzle":{"board":["."],"x":{"1":1,"1":2}}}`, "puzzle.x.1"},
	} {
		_, err := puzzle.Decode([]byte(tc.in))
		var ie *solvers.InputError
		if !errors.As(err, &ie) || ie.Field != tc.field {
			t.Errorf("%s: %#v, want field %q", tc.in, err, tc.field)
		}
	}
	_, err := puzzle.DecodeBatch([]byte(`{"tasks":[`+sweep1+`,{"kind":"sweep","puzzle":{"board":["."]},"2":0}]}`), 0)
	var ie *solvers.InputError
	if !errors.As(err, &ie) || ie.Field != "tasks[1].2" {
		t.Errorf("batch: %#v, want field tasks[1].2", err)
	}
}

// nullValues are requests with a null where a number, boolean or string
// is expected. The decoder's default reads null as the zero value, so
// [[1,null,3],...] would be solved as [[1,0,3],...] under that request's
// cache key; each must be refused, naming the place, by every decoder.
var nullValues = []struct{ name, in, field string }{
	{"sliding cell", `{"kind":"sliding","puzzle":{"board":[[1,null,3],[4,2,5],[7,8,6]]}}`, "puzzle.board[0][1]"},
	{"sliding max_nodes", `{"kind":"sliding","puzzle":` + board3 + `,"options":{"max_nodes":null}}`, "options.max_nodes"},
	{"sweep row", `{"kind":"sweep","puzzle":{"board":[".",null]}}`, "puzzle.board[1]"},
	{"sweep max_nodes", `{"kind":"sweep","puzzle":{"board":["."]},"options":{"max_nodes":null}}`, "options.max_nodes"},
	{"fill game_board cell", `{"kind":"fill","puzzle":{"game_board":[[0,null]],"table":[[1,0]]}}`, "puzzle.game_board[0][1]"},
	{"fill table cell", `{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[null,0]]}}`, "puzzle.table[0][0]"},
	{"fill allow_flip", `{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[1,0]]},"options":{"allow_flip":null}}`, "options.allow_flip"},
}

func TestNullIsRefusedWhereAValueIsExpected(t *testing.T) {
	t.Parallel()
	for _, tc := range nullValues {
		for what, err := range map[string]error{
			"Decode": func() error { _, err := puzzle.Decode([]byte(tc.in)); return err }(),
			"DecodeItem": func() error {
				_, _, err := puzzle.DecodeItem([]byte(tc.in))
				return err
			}(),
			"ReadRequests": func() error {
				_, err := puzzle.ReadRequests(strings.NewReader(tc.in+"\n"), puzzle.FormatJSON)
				return err
			}(),
		} {
			var ie *solvers.InputError
			if !errors.As(err, &ie) || ie.Code != puzzle.CodeInvalidRequest || ie.Field != tc.field || !strings.Contains(ie.Msg, "null") {
				t.Errorf("%s (%s): %#v, want invalid_request on %s saying null", tc.name, what, err, tc.field)
			}
		}
		_, err := puzzle.DecodeBatch([]byte(`{"tasks":[`+sweep1+`,`+tc.in+`]}`), 0)
		var ie *solvers.InputError
		if !errors.As(err, &ie) || ie.Field != "tasks[1]."+tc.field {
			t.Errorf("%s (DecodeBatch): %#v, want tasks[1].%s", tc.name, err, tc.field)
		}
	}
	// A null options object is no options, as documented.
	if _, err := puzzle.Decode([]byte(`{"kind":"sliding","puzzle":` + board3 + `,"options":null}`)); err != nil {
		t.Fatalf("null options: %v", err)
	}
}
