package puzzle_test

import (
	"context"
	"errors"
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
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := p.WithMaxNodes(1_000_000).Solve(ctx); err != nil &&
			!errors.Is(err, solvers.ErrBudgetExceeded) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("valid request failed to solve: %s: %v", p.Payload(), err)
		}
	})
}
