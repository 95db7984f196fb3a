package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/cli"
)

func run(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

const p84021Sample = `{"game_board":[[1,1,0,0,1,0],[0,0,1,0,1,0],[0,1,1,0,0,1],[1,1,0,1,1,1],[1,0,0,0,1,0],[0,1,1,1,0,0]],"table":[[1,0,0,1,1,0],[1,0,1,0,1,0],[0,1,1,0,1,1],[0,0,1,0,0,0],[1,1,0,1,1,0],[0,1,0,0,0,0]]}`

func TestLocalSolveJudgeFormats(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ format, in, want string }{
		{"boj1525", "1 0 3\n4 2 5\n7 8 6\n", "3\n"},
		{"boj1525", "3 6 0\n8 1 2\n7 4 5\n", "-1\n"},
		{"boj1525", "1 2 3\r\n4 5 6\r\n7 8 0\r\n", "0\n"},
		{"boj9944", "5 5\n**...\n.....\n....*\n..*..\n.....\n3 4\n****\n*...\n*..*\n", "Case 1: 10\nCase 2: 3\n"},
		{"boj9944", "1 1\n.\n", "Case 1: 0\n"},
		{"p84021", p84021Sample, "14\n"},
		{"p84021", `{"game_board":[[0,0,0],[1,1,0],[1,1,1]],"table":[[1,1,1],[1,0,0],[0,0,0]]}`, "0\n"},
		{"json", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}` + "\n\n" +
			`{"kind":"sweep","puzzle":{"board":["."]}}` + "\n" +
			`{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[0,1]]}}`,
			`{"moves":3,"solvable":true,"path":"DRD"}` + "\n" + `{"moves":0,"start":[0,0],"path":""}` + "\n" +
				`{"filled":1,"placements":[{"piece":[[0,1]],"hole":[[0,0]],"rotation":0}]}` + "\n"},
	} {
		code, out, errOut := run(t, tc.in, "solve", "--local", "--format", tc.format)
		if code != 0 || out != tc.want {
			t.Errorf("%s %q: exit %d, out %q (stderr %q), want %q", tc.format, tc.in, code, out, errOut, tc.want)
		}
	}
}

func TestBadInputExits2NamingTheLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args       []string
		in, errHas string
	}{
		{[]string{"solve", "--local", "--format", "boj1525"}, "1 0 3\n4 2\n7 8 6\n", "line 2"},
		{[]string{"solve", "--local", "--format", "boj1525"}, "1 0 3\n4 2 5\n7 8 8\n", "appears twice"},
		{[]string{"solve", "--local", "--format", "boj9944"}, "2 3\n...\n..x\n", "line 3"},
		{[]string{"solve", "--local", "--format", "p84021"}, `{"game_board":[[0]],"table":[[0,1]]}`, "game_board is 1x1 but table is 1x2"},
		{[]string{"solve", "--local", "--format", "json"}, `{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}` + "\n" + `{"kind":"nope","puzzle":{}}`, "line 2"},
		{[]string{"solve", "--local", "--format", "json"}, "{\n", "line 1"},
		{[]string{"solve", "--local", "--format", "xml"}, "", "unknown format"},
		{[]string{"solve", "--local", "--bogus"}, "", "unknown flag"},
		{[]string{"solve", "--local", "extra-arg"}, "", "unknown command"},
		{[]string{"frobnicate"}, "", "unknown command"},
	} {
		code, out, errOut := run(t, tc.in, tc.args...)
		if code != cli.ExitUsage || !strings.Contains(errOut, tc.errHas) || out != "" {
			t.Errorf("%v %q: exit %d, stdout %q, stderr %q; want exit 2 and %q on stderr", tc.args, tc.in, code, out, errOut, tc.errHas)
		}
	}
}

func TestHelpHasExamples(t *testing.T) {
	t.Parallel()
	code, out, _ := run(t, "", "solve", "--help")
	if code != 0 || !strings.Contains(out, "Examples:") || !strings.Contains(out, "boj9944") {
		t.Fatalf("help: %d %q", code, out)
	}
}

// TestSolveAndSubmitRefuseFoldedAndRepeatedNames: puzzlectl takes the API's
// decisions on names that encoding/json would fold or merge.
func TestSolveAndSubmitRefuseFoldedAndRepeatedNames(t *testing.T) {
	t.Parallel()
	const board = `{"board":[[1,0,3],[4,2,5],[7,8,6]]}`
	for _, tc := range []struct{ format, in, errHas string }{
		{"json", `{"kind":"sliding","KIND":"sweep","puzzle":` + board + `}`, `unknown field "KIND"`},
		{"json", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]],"Board":[[1,2,3],[4,5,6],[7,0,8]]}}`, `puzzle.Board`},
		{"json", `{"kind":"sliding","\u212aind":"sweep","puzzle":` + board + `}`, "unknown field \"\u212aind\""},
		{"json", `{"kind":"sweep","puzzle":{"board":["."]},"options":{"max_nodes":1,"max_nodes":2}}`, `"max_nodes" appears twice`},
		{"json", `{"tasks":[],"TASKS":[{"kind":"sweep","puzzle":{"board":["."]}}]}`, `unknown field "tasks"`},
		{"p84021", `{"game_board":[[0,1]],"TABLE":[[1,0]]}`, `unknown field "TABLE"`},
		{"p84021", `{"game_board":[[0,1]],"table":[[0,0]],"table":[[1,0]]}`, `"table" appears twice`},
	} {
		code, out, errOut := run(t, tc.in+"\n", "solve", "--local", "--format", tc.format)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, tc.errHas) {
			t.Errorf("%s %s: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.format, tc.in, code, out, errOut, tc.errHas)
		}
		// The remote modes validate with the same decoder before they
		// send anything: no server is listening on port 1.
		code, out, errOut = run(t, tc.in+"\n", "solve", "--server", "http://127.0.0.1:1", "--format", tc.format)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, tc.errHas) {
			t.Errorf("remote %s %s: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.format, tc.in, code, out, errOut, tc.errHas)
		}
		if tc.format != "json" {
			continue
		}
		items := filepath.Join(t.TempDir(), "jobs.jsonl")
		if err := os.WriteFile(items, []byte(`{"kind":"sweep","puzzle":{"board":["."]}}`+"\n"+tc.in+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		code, _, errOut = run(t, "", "submit", "--server", "http://127.0.0.1:1", "-f", items)
		if code != cli.ExitUsage || !strings.Contains(errOut, "line 2") || !strings.Contains(errOut, tc.errHas) {
			t.Errorf("submit %s: exit %d, stderr %q; want exit 2, line 2 and %q", tc.in, code, errOut, tc.errHas)
		}
	}
}

// TestSolveJSONTakesCustomIDAsSubmitDoes: solve --format json reads the
// lines submit reads. A custom_id names a request and changes nothing of
// its result, which comes in the order of the lines; a bad or repeated
// one fails as submit fails it, exit 2 naming the line and the field,
// before anything is sent.
func TestSolveJSONTakesCustomIDAsSubmitDoes(t *testing.T) {
	t.Parallel()
	const (
		slide = `"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}`
		sweep = `"kind":"sweep","puzzle":{"board":["**...",".....","....*","..*..","....."]}`
	)
	named := `{"kind":"sliding","custom_id":"a","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}` + "\n\n" +
		`{"custom_id":"b",` + sweep + "}\n" +
		`{` + slide + "}\n" +
		`{` + sweep + `,"custom_id":"` + strings.Repeat("z", 64) + `"}` + "\n"
	plain := `{` + slide + "}\n{" + sweep + "}\n{" + slide + "}\n{" + sweep + "}\n"
	code, out, errOut := run(t, named, "solve", "--local", "--format", "json")
	_, want, _ := run(t, plain, "solve", "--local", "--format", "json")
	if code != 0 || out != want || strings.Count(out, "\n") != 4 {
		t.Fatalf("custom_id lines: exit %d, out %q, stderr %q; want %q", code, out, errOut, want)
	}

	long := strings.Repeat("x", 65)
	for _, tc := range []struct{ name, in, errHas string }{
		{"65 bytes", `{` + slide + "}\n" + `{"custom_id":"` + long + `",` + slide + "}\n", "line 2: custom_id"},
		{"repeated", `{"custom_id":"a",` + slide + "}\n\n" + `{"custom_id":"a",` + sweep + "}\n", `line 3: custom_id "a" repeats line 1's`},
		{"empty", `{"custom_id":"",` + slide + "}\n", "line 1: custom_id must not be empty"},
		{"null", `{"custom_id":null,` + slide + "}\n", "line 1: custom_id"},
		{"number", `{"custom_id":7,` + slide + "}\n", "line 1: custom_id"},
		{"invalid UTF-8", "{\"custom_id\":\"\xff\"," + slide + "}\n", "line 1: custom_id"},
		{"twice", `{"custom_id":"a","custom_id":"b",` + slide + "}\n", `line 1: `},
	} {
		// In parallel: submit fails a bad line only once its upload,
		// which has nowhere to go, gave up.
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, args := range [][]string{
				{"solve", "--local", "--format", "json"},
				// No server listens on port 1: the lines are refused first.
				{"solve", "--server", "http://127.0.0.1:1", "--format", "json"},
				{"submit", "--server", "http://127.0.0.1:1", "-f", "-"},
			} {
				code, out, errOut := run(t, tc.in, args...)
				if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, tc.errHas) || !strings.Contains(errOut, "custom_id") {
					t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", args, code, out, errOut, tc.errHas)
				}
			}
		})
	}
}
