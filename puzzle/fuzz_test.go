package puzzle_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/puzzleq/puzzleq/apitype"
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
	for _, c := range nullValues {
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
	for _, c := range nullValues {
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

// FuzzDecodeItem holds the batch-item decoder to Decode: whatever the
// bytes, DecodeItem returns an item or an InputError with a code; a
// request Decode accepts is an item without a custom_id, with the same
// key; and an accepted item's custom_id is a valid one that survives a
// round trip beside its payload; CheckItem gives DecodeItem's answer.
func FuzzDecodeItem(f *testing.F) {
	f.Add([]byte(`{"custom_id":"a","kind":"sliding","puzzle":{"board":[[1,0],[3,2]]},"options":{"max_nodes":5}}`))
	f.Add([]byte(`{"kind":"sliding","puzzle":{"board":[[1,2],[3,3]]}}`))
	f.Add([]byte(sweep1))
	f.Add([]byte(`{"custom_id":"row-1","kind":"sliding","puzzle":` + board3 + `}`))
	f.Add([]byte(`{"kind":"sweep","puzzle":{"board":["."]},"custom_id":"` + strings.Repeat("x", 65) + `"}`))
	f.Add([]byte(`{"custom_id":null,"kind":"sweep","puzzle":{"board":["."]}}`))
	f.Add([]byte(`{"custom_id":"a","custom_id":"a","kind":"sweep","puzzle":{"board":["."]}}`))
	f.Add([]byte("{\"custom_id\":\"\xff\",\"kind\":\"sweep\",\"puzzle\":{\"board\":[\".\"]}}"))
	for _, c := range foldedNames {
		f.Add([]byte(c.in))
	}
	for _, c := range nullValues {
		f.Add([]byte(c.in))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, id, err := puzzle.DecodeItem(data)
		// CheckItem is DecodeItem without the request: the same answer.
		if cid, cerr := puzzle.CheckItem(data); cid != id || (cerr == nil) != (err == nil) || (err != nil && cerr.Error() != err.Error()) {
			t.Fatalf("%q: CheckItem %q, %v; DecodeItem %q, %v", data, cid, cerr, id, err)
		}
		q, qerr := puzzle.Decode(data)
		if err != nil {
			var ie *solvers.InputError
			if !errors.As(err, &ie) || ie.Code == "" || ie.Error() == "" {
				t.Fatalf("error without a code: %v (%T)", err, err)
			}
			if qerr == nil {
				t.Fatalf("Decode accepts %q, DecodeItem refuses it: %v", data, err)
			}
			return
		}
		if len(id) > apitype.MaxCustomIDBytes || !utf8.ValidString(id) {
			t.Fatalf("accepted custom_id %q", id)
		}
		if id == "" && (qerr != nil || q.Key() != p.Key()) {
			t.Fatalf("item %q without a custom_id is not the request Decode reads: %v", data, qerr)
		}
		var req map[string]json.RawMessage
		if err := json.Unmarshal(p.Payload(), &req); err != nil {
			t.Fatal(err)
		}
		if id != "" {
			req["custom_id"], _ = json.Marshal(id)
		}
		again, _ := json.Marshal(req)
		p2, id2, err := puzzle.DecodeItem(again)
		if err != nil || id2 != id || p2.Key() != p.Key() {
			t.Fatalf("item %q does not round-trip as %q: %v", data, again, err)
		}
	})
}

// FuzzBatchDecoder holds the streaming batch decoder to DecodeBatch: for
// items without a custom_id, a body of the items a and b is accepted by
// one exactly when by the other, with the same keys.
func FuzzBatchDecoder(f *testing.F) {
	f.Add([]byte(sweep1), []byte(`{"kind":"sliding","puzzle":`+board3+`}`))
	f.Add([]byte(sweep1), []byte(`{"kind":"sweep","KIND":"fill","puzzle":{"board":["."]}}`))
	f.Add([]byte(`{"tasks":[`), []byte(`]}`))
	for _, c := range foldedNames {
		f.Add([]byte(sweep1), []byte(c.in))
	}
	for _, c := range nullValues {
		f.Add([]byte(sweep1), []byte(c.in))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		body := `{"tasks":[` + string(a) + `,` + string(b) + `]}`
		want, werr := puzzle.DecodeBatch([]byte(body), 2)
		d := puzzle.NewBatchDecoder(strings.NewReader(body), 2)
		var got []*puzzle.Parsed
		var err error
		for range 4 {
			var p *puzzle.Parsed
			if p, _, err = d.Next(); err != nil {
				break
			}
			got = append(got, p)
		}
		if err == io.EOF {
			err = nil
		}
		if err != nil {
			var ie *solvers.InputError
			if !errors.As(err, &ie) || ie.Code == "" || ie.Msg == "" {
				t.Fatalf("error without a code: %v (%T)", err, err)
			}
		}
		if werr == nil && err != nil && !bytes.Contains([]byte(body), []byte("custom_id")) {
			t.Fatalf("DecodeBatch accepts %q, the stream refuses it: %v", body, err)
		}
		if err == nil && werr == nil {
			if len(got) != len(want) {
				t.Fatalf("%d items streamed, %d decoded", len(got), len(want))
			}
			for i := range got {
				if got[i].Key() != want[i].Key() {
					t.Fatalf("item %d differs", i)
				}
			}
		}
		if err == nil && werr != nil && !bytes.Contains([]byte(body), []byte("custom_id")) {
			t.Fatalf("the stream accepts %q, DecodeBatch refuses it: %v", body, werr)
		}
	})
}

// FuzzReadItems holds puzzlectl's json format to the batch item decoder:
// an input of the lines a and b is read exactly when each is blank or an
// item DecodeItem takes, and their custom_ids differ, giving the same
// requests and custom_ids in order; else the error is an InputError at
// the first line at fault. ReadRequests reads the same requests.
func FuzzReadItems(f *testing.F) {
	const slide = `"kind":"sliding","puzzle":` + board3
	f.Add([]byte(`{"custom_id":"a",`+slide+`}`), []byte(`{"custom_id":"b",`+slide+`}`))
	f.Add([]byte(`{"custom_id":"a",`+slide+`}`), []byte(`{"kind":"sweep","puzzle":{"board":["."]},"custom_id":"a"}`))
	f.Add([]byte(`{"custom_id":"a",`+slide+`}`), []byte(`{"custom_\u0069d":"a",`+slide+`}`))
	f.Add([]byte(sweep1), []byte(`{"custom_id":"`+strings.Repeat("x", 65)+`",`+slide+`}`))
	f.Add([]byte(" "), []byte(`{"custom_id":"",`+slide+`}`))
	f.Add([]byte(`{"custom_id":null,`+slide+`}`), []byte(sweep1))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if bytes.IndexByte(a, '\n') >= 0 || bytes.IndexByte(b, '\n') >= 0 {
			return // the input would have other lines than a and b
		}
		in := string(a) + "\n" + string(b) + "\n"
		reqs, ids, err := puzzle.ReadItems(strings.NewReader(in))
		var (
			want    []*puzzle.Parsed
			wantIDs []string
			badLine int
		)
		for i, l := range [][]byte{a, b} {
			l = bytes.TrimSpace(l)
			if len(l) == 0 {
				continue
			}
			p, id, err := puzzle.DecodeItem(l)
			if err != nil || id != "" && len(wantIDs) > 0 && wantIDs[0] == id {
				badLine = i + 1
				break
			}
			want, wantIDs = append(want, p), append(wantIDs, id)
		}
		if badLine > 0 {
			var ie *solvers.InputError
			if !errors.As(err, &ie) || ie.Code == "" || ie.Line != badLine || ie.Msg == "" {
				t.Fatalf("%q: %v (%T), want an InputError at line %d", in, err, err, badLine)
			}
			return
		}
		if err != nil || len(reqs) != len(want) || len(ids) != len(want) {
			t.Fatalf("%q: %d requests, %v; want %d", in, len(reqs), err, len(want))
		}
		plain, err := puzzle.ReadRequests(strings.NewReader(in), puzzle.FormatJSON)
		if err != nil || len(plain) != len(want) {
			t.Fatalf("%q: ReadRequests: %d requests, %v; want %d", in, len(plain), err, len(want))
		}
		for i := range want {
			if reqs[i].Key() != want[i].Key() || plain[i].Key() != want[i].Key() || ids[i] != wantIDs[i] {
				t.Fatalf("%q: item %d is %q %s, want %q %s", in, i, ids[i], reqs[i].Payload(), wantIDs[i], want[i].Payload())
			}
		}
	})
}
