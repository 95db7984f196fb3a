package api

import (
	"bytes"
	"testing"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
)

// resultLineSeeds are custom IDs that encoding/json writes with escapes
// (quotes, HTML, control bytes, U+2028, invalid UTF-8) and without.
var resultLineSeeds = []string{"", "job-7", `a"b`, "<x>&", "\x00\x1f", "tab\there", "\u2028", "\xff", "é"}

// TestAppendResultLineAsJSON: the reflection-free line is byte for byte
// the line encoding/json writes, for every state, with and without a
// custom ID, and an error line takes encoding/json's path.
func TestAppendResultLineAsJSON(t *testing.T) {
	const batch = "0123456789abcdef0123456789abcdef"
	result := `{"solvable":true,"moves":2,"path":"LU"}`
	states := []apitype.TaskState{apitype.TaskStatePending, apitype.TaskStateActive, apitype.TaskStateCompleted,
		apitype.TaskStateFailed, apitype.TaskStateCanceled}
	for _, st := range states {
		for _, cid := range append([]*string{nil}, ptrs(resultLineSeeds)...) {
			for _, withErr := range []bool{false, true} {
				in := &store.ChunkInfo{Index: 12345, State: st, CustomID: cid}
				if withErr {
					in.Error = &apitype.TaskError{Code: "timeout", Message: "took <too> long"}
				}
				checkResultLine(t, batch, in, result)
			}
		}
	}
}

// FuzzAppendResultLine: for any custom ID, index and batch ID, the fast
// line is encoding/json's.
func FuzzAppendResultLine(f *testing.F) {
	for i, s := range resultLineSeeds {
		f.Add("0123456789abcdef0123456789abcdef", s, i, true)
	}
	f.Fuzz(func(t *testing.T, batch, cid string, index int, hasID bool) {
		in := &store.ChunkInfo{Index: index, State: apitype.TaskStateCompleted}
		if hasID {
			in.CustomID = &cid
		}
		checkResultLine(t, batch, in, `{"x":1}`)
	})
}

func checkResultLine(t *testing.T, batch string, in *store.ChunkInfo, result string) {
	t.Helper()
	got, err := appendResultLine(nil, batch, in, result)
	want, werr := appendResultLineJSON(nil, batch, in, result)
	if (err == nil) != (werr == nil) || !bytes.Equal(got, want) {
		t.Fatalf("appendResultLine(%q, %+v):\n got %q (%v)\nwant %q (%v)", batch, in, got, err, want, werr)
	}
}

func ptrs(ss []string) []*string {
	out := make([]*string, len(ss))
	for i := range ss {
		out[i] = &ss[i]
	}
	return out
}
