package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// decodeItem accepts a custom_id wherever it is in the object and holds
// the rest of the line to the API's rules, with the API's messages.
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
		{line: `{"custom_id":"` + long + `",` + req + `}`, errHas: "at most 64 bytes, got 65"},
		{line: `{"custom_id":7,` + req + `}`, errHas: "custom_id: expected a string, got number"},
		{line: `{"custom_id":null,` + req + `}`, errHas: "custom_id: expected a string, got null"},
		{line: `{"custom_id":"a","custom_id":"b",` + req + `}`, errHas: `"custom_id" appears twice`},
		{line: `{"custom_id":"a",` + req + `,"kind":"sweep"}`, errHas: `"kind" appears twice`},
		{line: `{"custom_id":"a","KIND":"sweep",` + req + `}`, errHas: `unknown field "KIND"`},
		{line: `{"custom_id":"a",` + req + `} {}`, errHas: "unexpected data after"},
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

// BenchmarkReadJobs measures puzzlectl's local validation of 10,000
// lines, without and with a custom_id on each, compared in one run.
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
