package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/puzzle"
)

// decodeItem accepts a custom_id wherever it is in the object and holds
// the rest of the line to puzzle.Decode's rules.
func TestDecodeItem(t *testing.T) {
	t.Parallel()
	const req = `"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}`
	long := strings.Repeat("x", 65)
	for _, tc := range []struct {
		line, customID string
		has            bool
		errHas         string
	}{
		{line: `{` + req + `}`},
		{line: `{"custom_id":"a",` + req + `}`, customID: "a", has: true},
		{line: `{` + req + `,"custom_id":"b"}`, customID: "b", has: true},
		{line: `{"kind":"sliding","custom_id":"c","puzzle":{"board":[[1,0],[3,2]]}}`, customID: "c", has: true},
		{line: `{"custom\u005fid":"esc",` + req + `}`, customID: "esc", has: true},
		{line: `{"custom_id":"",` + req + `}`, errHas: "custom_id must not be empty"},
		{line: `{"custom_id":"` + long[:64] + `",` + req + `}`, customID: long[:64], has: true},
		{line: `{"custom_id":"` + long + `",` + req + `}`, errHas: "65 bytes"},
		{line: `{"custom_id":7,` + req + `}`, errHas: "custom_id must be a string, got number"},
		{line: `{"custom_id":null,` + req + `}`, errHas: "custom_id must be a string"},
		{line: `{"custom_id":"a","custom_id":"b",` + req + `}`, errHas: `"custom_id" appears twice`},
		{line: `{"custom_id":"a",` + req + `,"kind":"sweep"}`, errHas: `"kind" appears twice`},
		{line: `{"custom_id":"a","KIND":"sweep",` + req + `}`, errHas: `unknown field "KIND"`},
		{line: `{"custom_id":"a",` + req + `} {}`, errHas: "after the request"},
		{line: `{"custom_id":"a","kind":"sliding","puzzle":{"board":[[1,2],[3,3]]}}`, errHas: "tile 3 appears twice"},
		{line: `["custom_id"]`, errHas: "expected an object"},
		{line: `{"custom_id":"a",` + req + `,}`, errHas: "invalid"},
		{line: `{"custom_id":"a",` + "\xff" + `}`, errHas: "invalid"},
		{line: `{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]},"options":{"note":"a\"b"}}`, errHas: `unknown field "note"`},
	} {
		id, has, err := decodeItem([]byte(tc.line))
		switch {
		case tc.errHas != "":
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("%s: err %v, want one with %q", tc.line, err, tc.errHas)
			}
		case err != nil || id != tc.customID || has != tc.has:
			t.Errorf("%s: %q, %v, %v; want %q, %v", tc.line, id, has, err, tc.customID, tc.has)
		}
	}
}

// FuzzDecodeItem holds decodeItem to puzzle.Decode: a line with no
// custom_id is accepted by one exactly when by the other, and a line with
// one is accepted exactly when the same object without it is, its ID
// within the bound. Seeds are in testdata/fuzz/FuzzDecodeItem too.
func FuzzDecodeItem(f *testing.F) {
	const req = `"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}`
	for _, s := range []string{
		`{` + req + `}`,
		`{"custom_id":"a",` + req + `}`,
		`{` + req + `,"custom_id":"z"}`,
		`{"custom\u005fid":"e",` + req + `}`,
		`{"custom_id":"a","custom_id":"a",` + req + `}`,
		`{"custom_id":1,` + req + `}`,
		`{"custom_id":"a",` + req + `,"kind":"sweep"}`,
		`{"kind":"sweep","puzzle":{"board":["."]},"options":{"max_nodes":3},"custom_id":"\ud83d\ude00"}`,
		`{"custom_id":"a"}`, `{`, `"custom_id"`, `[]`, "{\"custom_id\":\"\xff\"," + req + "}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		id, has, err := decodeItem(line)
		_, perr := puzzle.Decode(line)
		if !has && err == nil && perr != nil {
			t.Fatalf("%q: accepted without a custom_id, but puzzle.Decode says %v", line, perr)
		}
		if perr == nil && (err != nil || has) {
			t.Fatalf("%q: puzzle.Decode accepts it, decodeItem = %q, %v, %v", line, id, has, err)
		}
		if !has || err != nil {
			return
		}
		if len(id) > apitype.MaxCustomIDBytes {
			t.Fatalf("%q: custom_id of %d bytes accepted", line, len(id))
		}
		rest, id2, has2, rerr := withoutCustomID(line)
		if rerr != nil || id2 != id || !has2 {
			t.Fatalf("%q: withoutCustomID = %q, %v, %v", line, id2, has2, rerr)
		}
		if _, err := puzzle.Decode(rest); err != nil {
			t.Fatalf("%q: accepted, but without its custom_id (%s) puzzle.Decode says %v", line, rest, err)
		}
	})
}

// BenchmarkReadJobs measures what the custom_id stand-in costs puzzlectl's
// local validation: the same 10,000 lines without and with a custom_id
// on each (the second pass of decodeItem), compared in one run.
func BenchmarkReadJobs(b *testing.B) {
	const board = `"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}`
	for _, bc := range []struct{ name, prefix string }{
		{"plain", `{`},
		{"custom_id", `{"custom_id":"job-%d",`},
	} {
		var in strings.Builder
		for i := range 10000 {
			p := bc.prefix
			if strings.Contains(p, "%d") {
				p = strings.Replace(p, "%d", strconv.Itoa(i), 1)
			}
			in.WriteString(p + board + "}\n")
		}
		data := in.String()
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				items, err := readItems(strings.NewReader(data))
				if err != nil || len(items) != 10000 {
					b.Fatal(len(items), err)
				}
			}
		})
	}
}

// TestWriteJSONStringIsMarshal: the output's strings are json.Marshal's,
// byte for byte, whether or not they take the plain path.
func TestWriteJSONStringIsMarshal(t *testing.T) {
	for _, s := range []string{"", "abc-17", "job 1", `a"b`, `a\b`, "<x>&", "tab\t", "café", "\xff", "\u2028", "~\x7f"} {
		var buf bytes.Buffer
		w := bufio.NewWriter(&buf)
		writeJSONString(w, s)
		w.Flush()
		want, _ := json.Marshal(s)
		if buf.String() != string(want) {
			t.Errorf("%q: wrote %s, json.Marshal %s", s, buf.Bytes(), want)
		}
	}
}

// FuzzFastSliding holds the fast path to the full check and to the API's
// (puzzle.DecodeItem): whatever it takes, they take, with the same
// custom_id. Lines it does not take go the full way, so only its yes
// needs holding.
func FuzzFastSliding(f *testing.F) {
	for _, s := range []string{
		`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`,
		`{"custom_id":"job-1","kind":"sliding","puzzle":{"board":[[1,2,3,4],[5,6,7,8],[9,10,11,12],[13,14,15,0]]}}`,
		`{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}`,
		`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,8]]}}`,
		`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,06]]}}`,
		`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"max_nodes":5}}`,
		`{"custom_id":"","kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}`,
		`{"custom_id":"a\"b","kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}`,
		`{"kind":"sliding","puzzle":{"board":[[1,0,2,3,4,5,6,7]]}}`,
		`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		id, has, ok := fastSliding(line)
		if !ok {
			return
		}
		fid, fhas, err := decodeItemFull(line)
		if err != nil || fid != id || fhas != has {
			t.Fatalf("%q: fast path takes it (%q, %v), the full check: %q, %v, %v", line, id, has, fid, fhas, err)
		}
		_, aid, err := puzzle.DecodeItem(line)
		if err != nil || aid != id {
			t.Fatalf("%q: fast path takes it (%q), puzzle.DecodeItem: %q, %v", line, id, aid, err)
		}
	})
}

// TestFastSlidingTakesBulkLines: the lines of a bulk run of 8- and
// 15-puzzles take the fast path; a bad one does not.
func TestFastSlidingTakesBulkLines(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
	}{
		{`{"kind":"sliding","puzzle":{"board":[[8,6,7],[2,5,4],[3,0,1]]}}`, true},
		{`{"custom_id":"r-9","kind":"sliding","puzzle":{"board":[[1,2,3,4],[5,6,7,8],[9,10,11,12],[13,14,0,15]]}}`, true},
		{`{"kind":"sliding","puzzle":{"board":[[8,6,7],[2,5,4],[3,0,3]]}}`, false},
		{`{"kind":"sliding", "puzzle":{"board":[[8,6,7],[2,5,4],[3,0,1]]}}`, false},
	} {
		if _, _, ok := fastSliding([]byte(tc.line)); ok != tc.ok {
			t.Errorf("%s: fast path %v, want %v", tc.line, ok, tc.ok)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want bool
	}{
		{"http://localhost:8080", true},
		{"http://127.0.0.1:35000", true},
		{"http://127.9.9.9", true},
		{"http://[::1]:8080/", true},
		{"https://puzzleq.example:443", false},
		{"http://10.0.0.7:8080", false},
		{"http://localhost.example", false},
	} {
		if got := isLoopback(tc.url); got != tc.want {
			t.Errorf("isLoopback(%q) = %v, want %v", tc.url, got, tc.want)
		}
	}
}
