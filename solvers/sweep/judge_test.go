package sweep

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/solvers"
)

const officialSample = `5 5
**...
.....
....*
..*..
.....
3 4
****
*...
*..*
`

func TestOfficialSample(t *testing.T) {
	ps, err := ParseBOJ9944(strings.NewReader(officialSample))
	if err != nil {
		t.Fatal(err)
	}
	var rs []Result
	for _, p := range ps {
		r, err := Solve(context.Background(), p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	var out bytes.Buffer
	if err := FormatBOJ9944(&out, rs); err != nil {
		t.Fatal(err)
	}
	// The issue gives the answers 10 and 3. The second board here is
	// reconstructed from that answer (the judge's statement was not at
	// hand): start at its top right, roll L, D, R.
	if got, want := out.String(), "Case 1: 10\nCase 2: 3\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	for i, p := range ps {
		if m, _ := refSolve(p.Board, 0); m != rs[i].Moves {
			t.Fatalf("case %d: got %d, reference %d", i+1, rs[i].Moves, m)
		}
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name  string
		board []string
		code  string
		field string
		msg   string
	}{
		{"ok", []string{".*", "**"}, "", "", ""},
		{"no rows", nil, solvers.CodeInvalidPuzzle, "board", "board has no rows"},
		{"too many rows", make31(31, 5), solvers.CodeTooLarge, "board", "board is 31x5, the limit is 30x30"},
		{"too many columns", []string{strings.Repeat(".", 31)}, solvers.CodeTooLarge, "board", "board is 1x31, the limit is 30x30"},
		{"empty row", []string{""}, solvers.CodeInvalidPuzzle, "board[0]", "row 1 is empty"},
		{"bad char", []string{".....", "...x."}, solvers.CodeInvalidPuzzle, "board[1]", "row 2, column 4: unexpected character 'x'"},
		{"ragged", []string{".....", ".....", "...."}, solvers.CodeInvalidPuzzle, "board[2]", "row 3 has 4 columns, expected 5"},
		{"long row", []string{"..", strings.Repeat(".", 40)}, solvers.CodeTooLarge, "board[1]", "row 2 has 40 columns, the limit is 30"},
		{"no empty", []string{"**", "**"}, solvers.CodeInvalidPuzzle, "board", "board has no empty cell ('.')"},
		{"unicode", []string{"..", ".é"}, solvers.CodeInvalidPuzzle, "board[1]", "row 2, column 2: unexpected character 'é'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(Puzzle{Board: tc.board})
			if tc.code == "" {
				if err != nil {
					t.Fatalf("unexpected %v", err)
				}
				return
			}
			var ie *solvers.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("got %v, want an InputError", err)
			}
			if ie.Code != tc.code || ie.Field != tc.field || ie.Msg != tc.msg || ie.Line != 0 {
				t.Fatalf("got %+v, want code %s field %s msg %q", ie, tc.code, tc.field, tc.msg)
			}
			// Solve validates too.
			if _, err := Solve(context.Background(), Puzzle{Board: tc.board}, Options{}); !errors.As(err, &ie) {
				t.Fatalf("Solve: got %v", err)
			}
		})
	}
}

func make31(n, m int) []string {
	b := make([]string, n)
	for i := range b {
		b[i] = strings.Repeat(".", m)
	}
	return b
}

func TestParse(t *testing.T) {
	cases := []struct {
		name  string
		in    string
		want  [][]string
		code  string
		line  int
		field string
		msg   string
	}{
		{name: "sample", in: officialSample, want: [][]string{
			{"**...", ".....", "....*", "..*..", "....."}, {"****", "*...", "*..*"}}},
		{name: "empty input", in: "", want: nil},
		{name: "crlf, trailing blanks, blank lines", in: "\r\n2 2  \r\n.* \r\n..\t\r\n\r\n\r\n1 1\r\n.\r\n\n",
			want: [][]string{{".*", ".."}, {"."}}},
		{name: "no final newline", in: "1 3\n*.*", want: [][]string{{"*.*"}}},
		{name: "short row", in: "2 5\n.....\n....\n", code: solvers.CodeInvalidPuzzle, line: 3, field: "board[1]",
			msg: "expected 5 characters, got 4"},
		{name: "long row", in: "1 2\n...\n", code: solvers.CodeInvalidPuzzle, line: 2, field: "board[0]",
			msg: "expected 2 characters, got 3"},
		{name: "bad char", in: "1 1\n.\n2 2\n..\n.x\n", code: solvers.CodeInvalidPuzzle, line: 5, field: "board[1]",
			msg: "column 2: unexpected character 'x'"},
		{name: "bad header", in: "5\n", code: solvers.CodeInvalidPuzzle, line: 1, field: "board",
			msg: `expected a header "N M", got "5"`},
		{name: "word header", in: "\n\nfive 5\n", code: solvers.CodeInvalidPuzzle, line: 3, field: "board",
			msg: `expected a header "N M", got "five 5"`},
		{name: "three numbers", in: "1 2 3\n", code: solvers.CodeInvalidPuzzle, line: 1, field: "board",
			msg: `expected a header "N M", got "1 2 3"`},
		{name: "zero", in: "0 5\n", code: solvers.CodeInvalidPuzzle, line: 1, field: "board",
			msg: "board is 0x5, each side must be at least 1"},
		{name: "too large", in: "31 5\n", code: solvers.CodeTooLarge, line: 1, field: "board",
			msg: "board is 31x5, the limit is 30x30"},
		{name: "huge", in: "99999999999999999999 1\n", code: solvers.CodeInvalidPuzzle, line: 1, field: "board",
			msg: `expected a header "N M", got "99999999999999999999 1"`},
		{name: "missing rows", in: "1 1\n.\n3 2\n..\n", code: solvers.CodeInvalidPuzzle, line: 5, field: "board",
			msg: "expected 3 rows after the header on line 3, input ends after 1"},
		{name: "all obstacles", in: "1 1\n.\n2 2\n**\n**\n", code: solvers.CodeInvalidPuzzle, line: 3, field: "board",
			msg: "board has no empty cell ('.')"},
		{name: "absurd line", in: "1 1\n" + strings.Repeat(".", 10000) + "\n", code: solvers.CodeTooLarge, line: 2,
			msg: "line is longer than 4096 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ps, err := ParseBOJ9944(strings.NewReader(tc.in))
			if tc.code == "" {
				if err != nil {
					t.Fatalf("unexpected %v", err)
				}
				var got [][]string
				for _, p := range ps {
					got = append(got, p.Board)
				}
				if !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("got %q, want %q", got, tc.want)
				}
				return
			}
			var ie *solvers.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("got %v (%d puzzles), want an InputError", err, len(ps))
			}
			if ie.Code != tc.code || ie.Line != tc.line || ie.Field != tc.field || ie.Msg != tc.msg {
				t.Fatalf("got %+v, want code %s line %d field %q msg %q", ie, tc.code, tc.line, tc.field, tc.msg)
			}
		})
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestFormat(t *testing.T) {
	var out bytes.Buffer
	if err := FormatBOJ9944(&out, []Result{{Moves: 10}, {Moves: -1}, {Moves: 0}}); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "Case 1: 10\nCase 2: -1\nCase 3: 0\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if err := FormatBOJ9944(failWriter{}, []Result{{Moves: 1}}); err == nil {
		t.Fatal("write error was lost")
	}
}

// openBoard is a fully open square: no dead ends and no stop cells but
// the corners, so the bounds are weak and the search is long.
func openBoard(n int) Puzzle { return Puzzle{Board: make31(n, n)} }

func TestCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Solve(ctx, openBoard(30), Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: got %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	// With the prunings off this board takes the plain search minutes,
	// so only the deadline can end it.
	_, err := solve(ctx, slowBoard(), Options{}, unpruned)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: got %v after %v", err, time.Since(t0))
	}
	// How soon it is noticed is counted in nodes, which a loaded machine
	// does not stretch (its wall clock took 308 ms for a 30 ms deadline
	// under go test -race ./...): a context that ends at its fourth look
	// stops the search within four polls.
	const looks = 4
	ends := &endsAtLook{Context: context.Background(), at: looks}
	_, nodes, err := solveCount(ends, slowBoard(), Options{}, unpruned)
	if !errors.Is(err, context.DeadlineExceeded) || ends.n != looks {
		t.Fatalf("a context that ends at look %d: %v after %d looks", looks, err, ends.n)
	}
	if nodes > looks*pollEvery {
		t.Fatalf("stopped after %d nodes, want at most %d: ctx is looked at every %d nodes", nodes, looks*pollEvery, pollEvery)
	}
}

// endsAtLook is a context whose Err reports DeadlineExceeded from its
// at-th call on, so that a test counts when a search notices its end.
type endsAtLook struct {
	context.Context
	at, n int
}

func (c *endsAtLook) Err() error {
	c.n++
	if c.n >= c.at {
		return context.DeadlineExceeded
	}
	return nil
}

func TestBudget(t *testing.T) {
	_, err := Solve(context.Background(), openBoard(30), Options{MaxNodes: 100})
	if !errors.Is(err, solvers.ErrBudgetExceeded) {
		t.Fatalf("got %v", err)
	}
	// The budget is exact, not rounded to the polling interval: the open
	// 4x4 board needs 44 nodes.
	if _, err := Solve(context.Background(), openBoard(4), Options{MaxNodes: 43}); !errors.Is(err, solvers.ErrBudgetExceeded) {
		t.Fatalf("43 nodes: got %v", err)
	}
	if r, err := Solve(context.Background(), openBoard(4), Options{MaxNodes: 44}); err != nil || r.Moves != 7 {
		t.Fatalf("44 nodes: got %+v, %v", r, err)
	}
	// A generous budget on an easy board still answers.
	r, err := Solve(context.Background(), Puzzle{Board: []string{"...."}}, Options{MaxNodes: 5000})
	if err != nil || r.Moves != 1 {
		t.Fatalf("got %+v, %v", r, err)
	}
}

var unpruned = tuning{noConnectivity: true, noDeadEnds: true, noBound: true, noParity: true, noBlocks: true}

func slowBoard() Puzzle {
	return Puzzle{Board: hardBoard(rand.New(rand.NewSource(1)), 30, 30, 0.1)}
}
