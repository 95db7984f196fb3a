package puzzle_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
)

func TestDecodeErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, code, field, msg string
	}{
		{`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2],[7,8,6]]}}`, "invalid_puzzle", "puzzle.board[1]", "expected 3 numbers, got 2"},
		{`{"kind":"sliding","puzzle":{"board":"x"}}`, "invalid_request", "puzzle.board", "expected"},
		{`{"kind":"sweep","puzzle":{"board":["..","..."]}}`, "invalid_puzzle", "puzzle.board[1]", ""},
		{`{"kind":"fill","puzzle":{"game_board":[[0]],"table":[[0,1]]}}`, "invalid_puzzle", "puzzle", ""},
		{`{"kind":"fill","puzzle":{"game_board":[[0]],"table":[[1]]},"options":{"allow_flip":"yes"}}`, "invalid_request", "options.allow_flip", ""},
		{`{"kind":"fill","puzzle":{"game_board":[[0]],"table":[[1]],"extra":1}}`, "invalid_request", "puzzle.extra", "unknown field"},
		{`{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]},"options":{"max_nodes":-5}}`, "invalid_request", "options.max_nodes", ""},
		{`{"kind":"tetris","puzzle":{}}`, "invalid_request", "kind", "unknown kind"},
		{`{"kind":7,"puzzle":{}}`, "invalid_request", "kind", ""},
		{`{"puzzle":{"board":[[1]]}}`, "invalid_request", "kind", "required"},
		{`{"kind":"sweep"}`, "invalid_request", "puzzle", "required"},
		{`{"kind":"sweep","puzzle":null}`, "invalid_request", "puzzle", "required"},
		{`{"kind":"sweep","puzzle":{"board":["."]}} {}`, "invalid_request", "", "after the JSON value"},
		{`{"kind":"sweep",`, "invalid_request", "", "truncated"},
		{``, "invalid_request", "", "empty"},
		{`[]`, "invalid_request", "", ""},
		{`{"kind":"sliding","puzzle":{"board":[[1e99,0],[3,2]]}}`, "invalid_request", "puzzle.board", ""},
	} {
		_, err := puzzle.Decode([]byte(tc.in))
		var ie *solvers.InputError
		if !errors.As(err, &ie) {
			t.Errorf("%s: error %v (%T), want an InputError", tc.in, err, err)
			continue
		}
		if ie.Code != tc.code || !strings.HasPrefix(ie.Field, tc.field) || (tc.field == "" && ie.Field != "") || !strings.Contains(ie.Msg, tc.msg) {
			t.Errorf("%s: got code %q field %q msg %q; want %q %q ~%q", tc.in, ie.Code, ie.Field, ie.Msg, tc.code, tc.field, tc.msg)
		}
	}
}

func TestKeyIsCanonical(t *testing.T) {
	t.Parallel()
	key := func(s string) string {
		t.Helper()
		p, err := puzzle.Decode([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		return p.Key()
	}
	base := key(`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`)
	for _, same := range []string{
		`{"puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"kind":"sliding"}`,
		`{ "kind" : "sliding", "puzzle" : { "board" : [ [1,0,3], [4,2,5], [7,8,6] ] }, "options": {} }`,
		`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"max_nodes":5}}`,
	} {
		if key(same) != base {
			t.Errorf("same puzzle, different key: %s", same)
		}
	}
	if key(`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,0,5],[7,8,6]]}}`) == base {
		t.Error("different boards share a key")
	}
	f := `{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[1,0]]}}`
	if key(f) == key(strings.Replace(f, `}}`, `},"options":{"allow_flip":true}}`, 1)) {
		t.Error("allow_flip changes the answer and must change the key")
	}
	if key(`{"kind":"sweep","puzzle":{"board":["."]}}`) == key(`{"kind":"sweep","puzzle":{"board":[".*"]}}`) {
		t.Error("different sweep boards share a key")
	}
}

func TestWithMaxNodesOnlyLowers(t *testing.T) {
	t.Parallel()
	p, err := puzzle.Decode([]byte(`{"kind":"sweep","puzzle":{"board":["....","...."]},"options":{"max_nodes":50}}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.WithMaxNodes(1000).MaxNodes() != 50 || p.WithMaxNodes(10).MaxNodes() != 10 || p.WithMaxNodes(0).MaxNodes() != 50 {
		t.Fatal("a request may lower the server's budget, never raise it")
	}
	q, _ := puzzle.Decode([]byte(`{"kind":"sweep","puzzle":{"board":["."]}}`))
	if q.WithMaxNodes(99).MaxNodes() != 99 {
		t.Fatal("no requested budget means the server's")
	}
}

func TestPayloadRoundTrips(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"kind":"sliding","puzzle":{"board":[[2,1],[3,0]]},"options":{"max_nodes":9}}`,
		`{"kind":"sweep","puzzle":{"board":["..*",".. "]}}`,
		`{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[1,0]]},"options":{"allow_flip":true}}`,
	} {
		p, err := puzzle.Decode([]byte(in))
		if err != nil {
			if strings.Contains(in, `".. "`) {
				continue // invalid on purpose: a space is not a cell
			}
			t.Fatal(err)
		}
		q, err := puzzle.Decode(p.Payload())
		if err != nil || q.Key() != p.Key() || q.MaxNodes() != p.MaxNodes() {
			t.Fatalf("payload %s does not round-trip: %v", p.Payload(), err)
		}
		a, err1 := p.Solve(context.Background())
		b, err2 := q.Solve(context.Background())
		if err1 != nil || err2 != nil || string(a) != string(b) {
			t.Fatalf("results differ: %s %s %v %v", a, b, err1, err2)
		}
	}
}

func TestDuplicateKeysAreRejected(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in  string
		dup string
	}{
		{`{"kind":"sliding","kind":"sweep","puzzle":{"board":["."]}}`, "kind"},
		{`{"kind":"sweep","puzzle":{"board":["."],"board":[".."]}}`, "puzzle.board"},
		{`{"kind":"sweep","puzzle":{"board":["."]},"options":{"max_nodes":1,"max_nodes":2}}`, "options.max_nodes"},
		{`{"kind":"sweep","k\u0069nd":"sweep","puzzle":{"board":["."]}}`, "kind"},
		{`{"kind":"sweep","puzzle":{"board":["\",\"board"]}}`, ""}, // a key-like string inside a value
		{`{"kind":"fill","puzzle":{"game_board":[[0]],"table":[[1]]},"options":{}}`, ""},
	} {
		_, err := puzzle.Decode([]byte(tc.in))
		var ie *solvers.InputError
		gotDup := errors.As(err, &ie) && strings.Contains(ie.Msg, "appears twice")
		if tc.dup == "" && gotDup {
			t.Errorf("%s: false duplicate: %v", tc.in, err)
		}
		if tc.dup != "" && (!gotDup || ie.Field != tc.dup) {
			t.Errorf("%s: error %v, want duplicate %q", tc.in, err, tc.dup)
		}
	}
	// A batch envelope names the item.
	_, err := puzzle.DecodeBatch([]byte(`{"tasks":[{"kind":"x"},{"kind":"x","kind":"y"}]}`), 0)
	var ie *solvers.InputError
	if !errors.As(err, &ie) || ie.Field != "tasks[1].kind" {
		t.Errorf("batch duplicate: %v", err)
	}
}
