package puzzle_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
)

// decodeAll reads every item of a {"tasks": [...]} body with the streaming
// decoder.
func decodeAll(body string, max int) ([]*puzzle.Parsed, []string, error) {
	d := puzzle.NewBatchDecoder(strings.NewReader(body), max)
	var (
		ps  []*puzzle.Parsed
		ids []string
	)
	for {
		p, id, err := d.Next()
		if err == io.EOF {
			return ps, ids, nil
		}
		if err != nil {
			return nil, nil, err
		}
		ps, ids = append(ps, p), append(ids, id)
	}
}

// An item is a request with an optional custom_id: the same rules hold
// for its names, and the custom_id is a short, non-empty string.
func TestDecodeItem(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 32) // 64 bytes
	for _, tc := range []struct {
		name, in, id, field string
	}{
		{"no custom_id", sweep1, "", ""},
		{"custom_id first", `{"custom_id":"row-1","kind":"sweep","puzzle":{"board":["."]}}`, "row-1", ""},
		{"custom_id last", `{"kind":"sweep","puzzle":{"board":["."]},"custom_id":"x"}`, "x", ""},
		{"64 bytes", `{"custom_id":"` + long + `","kind":"sweep","puzzle":{"board":["."]}}`, long, ""},
		{"65 bytes", `{"custom_id":"` + long + `a","kind":"sweep","puzzle":{"board":["."]}}`, "", "custom_id"},
		{"empty", `{"custom_id":"","kind":"sweep","puzzle":{"board":["."]}}`, "", "custom_id"},
		{"null", `{"custom_id":null,"kind":"sweep","puzzle":{"board":["."]}}`, "", "custom_id"},
		{"number", `{"custom_id":7,"kind":"sweep","puzzle":{"board":["."]}}`, "", "custom_id"},
		{"twice", `{"custom_id":"a","custom_id":"b","kind":"sweep","puzzle":{"board":["."]}}`, "", "custom_id"},
		{"folded", `{"Custom_ID":"a","kind":"sweep","puzzle":{"board":["."]}}`, "", "Custom_ID"},
		{"invalid UTF-8", "{\"custom_id\":\"\xff\",\"kind\":\"sweep\",\"puzzle\":{\"board\":[\".\"]}}", "", "custom_id"},
		{"bad puzzle", `{"custom_id":"a","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,"x"]]}}`, "", "puzzle.board[2][2]"},
	} {
		p, id, err := puzzle.DecodeItem([]byte(tc.in))
		if tc.field == "" {
			if err != nil || p == nil || id != tc.id {
				t.Errorf("%s: %v, id %q; want accepted with id %q", tc.name, err, id, tc.id)
			}
			continue
		}
		var ie *solvers.InputError
		if !errors.As(err, &ie) || ie.Field != tc.field || ie.Code == "" {
			t.Errorf("%s: %v (%T), want an InputError on %q", tc.name, err, err, tc.field)
		}
	}
	for _, c := range foldedNames {
		_, _, err := puzzle.DecodeItem([]byte(c.in))
		wantInvalidRequest(t, c.name+" (DecodeItem)", err, c.field)
	}
}

// The streaming decoder reads what DecodeBatch reads, and refuses what it
// refuses, naming the same place.
func TestBatchDecoder(t *testing.T) {
	t.Parallel()
	two := `{"tasks":[` + sweep1 + `,{"custom_id":"b","kind":"sliding","puzzle":` + board3 + `}]}`
	ps, ids, err := decodeAll(two, 2)
	if err != nil || len(ps) != 2 || ids[0] != "" || ids[1] != "b" || ps[1].Kind() != puzzle.KindSliding {
		t.Fatalf("two items: %v %v %v", ps, ids, err)
	}
	for _, tc := range []struct {
		name, in, field, code string
	}{
		{"empty body", "  ", "", puzzle.CodeInvalidRequest},
		{"not an object", `[]`, "", puzzle.CodeInvalidRequest},
		{"no tasks", `{}`, "tasks", puzzle.CodeInvalidRequest},
		{"tasks null", `{"tasks":null}`, "tasks", puzzle.CodeInvalidRequest},
		{"tasks a number", `{"tasks":1}`, "tasks", puzzle.CodeInvalidRequest},
		{"no items", `{"tasks":[]}`, "tasks", puzzle.CodeInvalidRequest},
		{"unknown before", `{"x":1,"tasks":[` + sweep1 + `]}`, "x", puzzle.CodeInvalidRequest},
		{"unknown after", `{"tasks":[` + sweep1 + `],"x":1}`, "x", puzzle.CodeInvalidRequest},
		{"tasks twice", `{"tasks":[` + sweep1 + `],"tasks":[]}`, "tasks", puzzle.CodeInvalidRequest},
		{"Tasks", `{"Tasks":[` + sweep1 + `]}`, "Tasks", puzzle.CodeInvalidRequest},
		{"trailing", `{"tasks":[` + sweep1 + `]} {}`, "", puzzle.CodeInvalidRequest},
		{"truncated", `{"tasks":[` + sweep1, "", puzzle.CodeInvalidRequest},
		{"bad item", `{"tasks":[` + sweep1 + `,{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,"x"]]}}]}`, "tasks[1].puzzle.board[2][2]", puzzle.CodeInvalidRequest},
		{"bad custom_id", `{"tasks":[{"custom_id":1,"kind":"sweep","puzzle":{"board":["."]}}]}`, "tasks[0].custom_id", puzzle.CodeInvalidRequest},
		{"item twice a name", `{"tasks":[{"kind":"sweep","kind":"sweep","puzzle":{"board":["."]}}]}`, "tasks[0].kind", puzzle.CodeInvalidRequest},
		{"too many", `{"tasks":[` + sweep1 + `,` + sweep1 + `,` + sweep1 + `]}`, "tasks", solvers.CodeTooLarge},
	} {
		_, _, err := decodeAll(tc.in, 2)
		var ie *solvers.InputError
		if !errors.As(err, &ie) || ie.Field != tc.field || ie.Code != tc.code || ie.Msg == "" {
			t.Errorf("%s: %v (%T), want %s on %q", tc.name, err, err, tc.code, tc.field)
		}
	}
	for _, c := range foldedNames {
		_, _, err := decodeAll(`{"tasks":[`+sweep1+`,`+c.in+`]}`, 0)
		wantInvalidRequest(t, c.name+" (BatchDecoder)", err, "tasks[1]."+c.field)
	}
}

// A read error of the body (a limit, a cut connection) is the caller's to
// answer, not a JSON error.
func TestBatchDecoderPassesReadErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, head := range []string{`{"tasks":[` + sweep1 + `,`, `{"tasks":[` + sweep1 + `,{"kind":"swe`, `{"ta`} {
		r := io.MultiReader(strings.NewReader(head), &failReader{boom})
		d := puzzle.NewBatchDecoder(r, 0)
		var err error
		for range 3 {
			if _, _, err = d.Next(); err != nil {
				break
			}
		}
		var ie *solvers.InputError
		if !errors.Is(err, boom) || errors.As(err, &ie) {
			t.Errorf("read error after %q became %v (%T)", head, err, err)
		}
	}
}

type failReader struct{ err error }

func (f *failReader) Read([]byte) (int, error) { return 0, f.err }

// puzzlectl's json format takes the lines of an NDJSON batch: a request
// may carry a custom_id, held to DecodeItem's rules and unique in the
// input, and an error names its line and the field. ReadRequests reads
// the same lines.
func TestReadItems(t *testing.T) {
	t.Parallel()
	const (
		slide = `"kind":"sliding","puzzle":` + board3
		sweep = `"kind":"sweep","puzzle":{"board":["."]}`
	)
	in := `{"custom_id":"row-1",` + slide + "}\n\n" +
		`{` + sweep + `}` + "\n" +
		`{` + sweep + `,"custom_id":"row-\u00e9"}` + "\r\n" +
		` {"custom_id":"` + strings.Repeat("x", 64) + `",` + slide + "} \n"
	reqs, ids, err := puzzle.ReadItems(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	wantIDs := []string{"row-1", "", "row-\u00e9", strings.Repeat("x", 64)}
	if len(reqs) != 4 || strings.Join(ids, ",") != strings.Join(wantIDs, ",") {
		t.Fatalf("ids %q, %d requests; want %q", ids, len(reqs), wantIDs)
	}
	plain, err := puzzle.ReadRequests(strings.NewReader(in), puzzle.FormatJSON)
	if err != nil || len(plain) != 4 {
		t.Fatalf("ReadRequests: %d requests, %v", len(plain), err)
	}
	for i, want := range []string{`{` + slide + `}`, `{` + sweep + `}`, `{` + sweep + `}`, `{` + slide + `}`} {
		p, err := puzzle.Decode([]byte(want))
		if err != nil {
			t.Fatal(err)
		}
		if reqs[i].Key() != p.Key() || plain[i].Key() != p.Key() || !bytes.Equal(reqs[i].Payload(), p.Payload()) {
			t.Errorf("request %d is not %s: its custom_id must not change it", i, want)
		}
	}

	for _, tc := range []struct {
		name, in string
		line     int
		msgHas   string
	}{
		{"65 bytes", `{` + sweep + "}\n" + `{"custom_id":"` + strings.Repeat("x", 65) + `",` + slide + "}\n", 2, "at most 64 bytes, got 65"},
		{"repeated", `{"custom_id":"a",` + slide + "}\n\n" + `{` + sweep + "}\n" + `{"custom_id":"a",` + sweep + "}\n", 4, `custom_id "a" repeats line 1's`},
		{"empty", `{"custom_id":"",` + slide + "}\n", 1, "must not be empty"},
		{"null", `{"custom_id":null,` + slide + "}\n", 1, "expected a string, got null"},
		{"number", `{` + sweep + "}\n" + `{"custom_id":7,` + slide + "}\n", 2, "expected a string"},
		{"invalid UTF-8", "{\"custom_id\":\"\xff\"," + slide + "}\n", 1, "UTF-8"},
		{"twice in a line", `{"custom_id":"a","custom_id":"b",` + slide + "}\n", 1, `"custom_id" appears twice`},
	} {
		_, _, err := puzzle.ReadItems(strings.NewReader(tc.in))
		_, rerr := puzzle.ReadRequests(strings.NewReader(tc.in), puzzle.FormatJSON)
		for what, err := range map[string]error{"ReadItems": err, "ReadRequests": rerr} {
			var ie *solvers.InputError
			if !errors.As(err, &ie) || ie.Code != puzzle.CodeInvalidRequest || ie.Field != "custom_id" || ie.Line != tc.line ||
				!strings.HasPrefix(err.Error(), fmt.Sprintf("line %d: ", tc.line)) || !strings.Contains(ie.Msg, "custom_id") ||
				!strings.Contains(ie.Msg, tc.msgHas) {
				t.Errorf("%s (%s): %#v; want invalid_request on custom_id at line %d saying %q", tc.name, what, err, tc.line, tc.msgHas)
			}
		}
	}
}
