package api_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// GET /v1/batches/{id}/items?custom_id= on a real stack: exact matches
// across chunk groups, with a state, no match, and bad input.
func TestItemsByCustomID(t *testing.T) {
	const alice, bob = "alice-key-0123456789", "bob-key-0123456789ab"
	// Chunks of 4 items: 103 items are 26 chunks, more than one group of
	// custom_id lists (store.customIDGroup).
	s := stacktest.StartWith(t, 1, map[string]string{"API_KEYS": "alice:" + alice + ",bob:" + bob,
		"KEY_PREFIX": "customid:", "CHUNK_SIZE": "4"})
	const odd = "é \"quoted\" \\ <&>" // one spelling as JSON, however it was sent
	var lines []string
	for i := range 100 {
		id := fmt.Sprintf("c-%d", i)
		if i == 13 {
			id = "" // an item without one
		}
		line := `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`
		if id != "" {
			line = `{"custom_id":"` + id + `",` + line[1:]
		}
		lines = append(lines, line)
	}
	lines = append(lines, `{"custom_id":"\u00e9 \"quoted\" \\ \u003c&>","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`,
		`{"custom_id":"c-42x","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`,
		`{"custom_id":"too-hard",`+overBudget[1:])
	code, b, _ := s.DoAs(alice, "POST", "/v1/batches", strings.Join(lines, "\n")+"\n", "Content-Type", "application/x-ndjson")
	if code != http.StatusAccepted {
		t.Fatalf("submit: %d %s", code, b)
	}
	id := stacktest.Decode[apitype.BatchCreated](t, b).ID
	getAs[apitype.Batch](t, s, alice, "/v1/batches/"+id+"?wait=30s", 200)
	items := func(query string, want int) apitype.TaskList {
		t.Helper()
		return getAs[apitype.TaskList](t, s, alice, "/v1/batches/"+id+"/items?"+query, want)
	}
	indexes := func(l apitype.TaskList) []int {
		var out []int
		for _, tk := range l.Tasks {
			_, i, ok := apitype.ParseItemID(tk.ID)
			if !ok {
				t.Fatalf("item ID %q", tk.ID)
			}
			out = append(out, i)
		}
		return out
	}

	t.Run("match", func(t *testing.T) {
		l := items("custom_id=c-42", 200)
		if len(l.Tasks) != 1 || l.Tasks[0].ID != apitype.ItemID(id, 42) || l.Tasks[0].CustomID == nil ||
			*l.Tasks[0].CustomID != "c-42" || l.Tasks[0].State != apitype.TaskStateCompleted || l.Tasks[0].Result == nil || l.NextCursor != nil {
			t.Fatalf("custom_id=c-42: %+v", l)
		}
		// A custom_id is unique in its batch, so a match ends the list,
		// whatever the limit: no cursor sends a client on through the
		// rest of the batch.
		if l := items("custom_id=c-42&limit=1", 200); len(l.Tasks) != 1 || l.NextCursor != nil {
			t.Fatalf("custom_id=c-42&limit=1: %+v; want the item and no next cursor", l)
		}
		if got := indexes(items("custom_id="+url.QueryEscape(odd), 200)); len(got) != 1 || got[0] != 100 {
			t.Errorf("custom_id=%q: items %v, want [100]", odd, got)
		}
		if got := indexes(items("custom_id=too-hard&state=failed", 200)); len(got) != 1 || got[0] != 102 {
			t.Errorf("custom_id=too-hard&state=failed: items %v, want [102]", got)
		}
		if got := indexes(items("custom_id=too-hard&state=completed", 200)); len(got) != 0 {
			t.Errorf("custom_id=too-hard&state=completed: items %v, want none", got)
		}
	})

	t.Run("no match", func(t *testing.T) {
		for _, v := range []string{"C-42", "c-4200", "c-420", "c-42 ", "c-42\"", "c-13", "nothing"} {
			l := items("custom_id="+url.QueryEscape(v), 200)
			if len(l.Tasks) != 0 || l.Tasks == nil || l.NextCursor != nil {
				t.Errorf("custom_id=%q: %+v, want an empty list", v, l)
			}
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, v := range []string{strings.Repeat("x", apitype.MaxCustomIDBytes+1), strings.Repeat("é", 33), ""} {
			code, b, _ := s.DoAs(alice, "GET", "/v1/batches/"+id+"/items?custom_id="+url.QueryEscape(v), nil)
			eb := stacktest.Decode[apitype.ErrorBody](t, b)
			if code != 400 || eb.Error.Code != apitype.CodeInvalidRequest || eb.Error.Field != "custom_id" || eb.Error.Message == "" {
				t.Errorf("custom_id of %d bytes: %d %s", len(v), code, b)
			}
		}
		// 64 bytes is a custom_id's most, so it is searched for.
		items("custom_id="+strings.Repeat("x", apitype.MaxCustomIDBytes), 200)
		// Another key's batch is not found, whatever the filter.
		getAs[apitype.ErrorBody](t, s, bob, "/v1/batches/"+id+"/items?custom_id=c-42", 404)
	})
}
