package puzzle_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
)

// FuzzDecode drives the decoding path of every HTTP request: whatever the
// bytes, Decode returns a request or an InputError with a code, never
// panics, and a request it accepts round-trips through its payload and
// solves (or fails cleanly) within a bounded time.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`,
		`{"kind":"sweep","puzzle":{"board":["**...",".....","....*","..*..","....."]}}`,
		`{"kind":"fill","puzzle":{"game_board":[[0,0,0],[1,1,0],[1,1,1]],"table":[[1,1,1],[1,0,0],[0,0,0]]},"options":{"allow_flip":true}}`,
		`{"kind":"sweep","puzzle":{"board":["."]},"options":{"max_nodes":3}}`,
		`{"kind":"sliding","puzzle":{"board":[[1,0],[3]]}}`,
		`{"kind":"x"}`, `{`, `null`, `[]`, `{"kind":"sliding","puzzle":{"board":[[1e400]]}}`,
		"{\"kind\":\"sweep\",\"puzzle\":{\"board\":[\"\xff\"]}}",
	} {
		f.Add([]byte(s))
	}
	for _, c := range foldedNames {
		f.Add([]byte(c.in))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := puzzle.Decode(data)
		if err != nil {
			var ie *solvers.InputError
			if !errors.As(err, &ie) || ie.Code == "" || ie.Error() == "" {
				t.Fatalf("error without a code: %v (%T)", err, err)
			}
			return
		}
		q, err := puzzle.Decode(p.Payload())
		if err != nil || q.Key() != p.Key() {
			t.Fatalf("accepted request does not round-trip: %s: %v", p.Payload(), err)
		}
		// A request we accept must mean the same to a lenient reader:
		// encoding/json folds case and keeps the last duplicate, so had
		// we let through a folded or repeated name, it would see another
		// kind, puzzle or options here.
		var lax puzzle.Request
		if err := json.Unmarshal(data, &lax); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", data, err)
		}
		if r, err := puzzle.Parse(lax); err != nil || r.Key() != p.Key() || r.MaxNodes() != p.MaxNodes() {
			t.Fatalf("accepted %q, which encoding/json reads differently: %v", data, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := p.WithMaxNodes(1_000_000).Solve(ctx); err != nil &&
			!errors.Is(err, solvers.ErrBudgetExceeded) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("valid request failed to solve: %s: %v", p.Payload(), err)
		}
	})
}

// FuzzDecodeBatch holds the batch decoder to Decode: a batch of the items
// a and b is accepted exactly when each item is, with the same keys, and
// an item's error names it.
func FuzzDecodeBatch(f *testing.F) {
	f.Add([]byte(sweep1), []byte(`{"kind":"sliding","puzzle":`+board3+`}`))
	f.Add([]byte(sweep1), []byte(`{"kind":"sweep","KIND":"fill","puzzle":{"board":["."]}}`))
	for _, c := range foldedNames {
		f.Add([]byte(sweep1), []byte(c.in))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if !json.Valid(a) || !json.Valid(b) {
			return // "[a,b]" could split elsewhere than between a and b
		}
		reqs, err := puzzle.DecodeBatch([]byte(`{"tasks":[`+string(a)+`,`+string(b)+`]}`), 2)
		pa, errA := puzzle.Decode(a)
		pb, errB := puzzle.Decode(b)
		if err != nil {
			var ie *solvers.InputError
			if !errors.As(err, &ie) || ie.Code == "" {
				t.Fatalf("error without a code: %v (%T)", err, err)
			}
			if errA == nil && errB == nil && strings.HasPrefix(ie.Field, "tasks[") {
				t.Fatalf("items %q and %q each decode, but not as a batch: %v", a, b, err)
			}
			return
		}
		if errA != nil || errB != nil {
			t.Fatalf("batch of %q and %q accepted, though an item is not: %v / %v", a, b, errA, errB)
		}
		if len(reqs) != 2 || reqs[0].Key() != pa.Key() || reqs[1].Key() != pb.Key() {
			t.Fatalf("batch decodes differently from its items")
		}
	})
}
