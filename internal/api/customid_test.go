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
// across chunk groups and pages, with a state, no match, and bad input.
func TestItemsByCustomID(t *testing.T) {
	const alice, bob = "alice-key-0123456789", "bob-key-0123456789ab"
	// Chunks of 1 item: 103 items are 103 chunks, several groups of
	// custom_id lists (store.customIDGroup) and more than one page's scan
	// (customIDScanChunks, 64).
	s := stacktest.StartWith(t, 1, map[string]string{"API_KEYS": "alice:" + alice + ",bob:" + bob,
		"KEY_PREFIX": "customid:", "CHUNK_SIZE": "1"})
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
	// search follows the cursors of a custom_id search to its end, as a
	// client does, and returns what it found and the pages it took.
	search := func(query string) (found []int, pages int) {
		t.Helper()
		cursor := ""
		for pages < 10 {
			pages++
			l := items(query+cursor, 200)
			found = append(found, indexes(l)...)
			if l.NextCursor == nil {
				return found, pages
			}
			if len(l.Tasks) != 0 {
				t.Fatalf("%s%s: a match with a next cursor: %+v", query, cursor, l)
			}
			cursor = "&cursor=" + *l.NextCursor
		}
		t.Fatalf("%s: no end after %d pages", query, pages)
		return nil, 0
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
		// Past the first page's scan: an empty page with a cursor, then
		// the match.
		if got, pages := search("custom_id=" + url.QueryEscape(odd)); len(got) != 1 || got[0] != 100 || pages != 2 {
			t.Errorf("custom_id=%q: items %v in %d pages, want [100] in 2", odd, got, pages)
		}
		if got, _ := search("custom_id=too-hard&state=failed"); len(got) != 1 || got[0] != 102 {
			t.Errorf("custom_id=too-hard&state=failed: items %v, want [102]", got)
		}
		if got, _ := search("custom_id=too-hard&state=completed"); len(got) != 0 {
			t.Errorf("custom_id=too-hard&state=completed: items %v, want none", got)
		}
		// A cursor past the match finds nothing; from 43 the rest of
		// the batch, 60 chunks, is one page's scan.
		if l := items("custom_id=c-42&cursor=43", 200); len(l.Tasks) != 0 || l.NextCursor != nil {
			t.Errorf("custom_id=c-42 from 43: %+v, want an empty list", l)
		}
	})

	t.Run("no match", func(t *testing.T) {
		for _, v := range []string{"C-42", "c-4200", "c-420", "c-42 ", "c-42\"", "c-13", "nothing"} {
			// One page reads 64 chunks' lists at most: the first page is
			// empty and sends the client on from item 64.
			l := items("custom_id="+url.QueryEscape(v), 200)
			if len(l.Tasks) != 0 || l.Tasks == nil || l.NextCursor == nil || *l.NextCursor != "64" {
				t.Errorf("custom_id=%q: %+v, want an empty page with next_cursor 64", v, l)
			}
			if got, pages := search("custom_id=" + url.QueryEscape(v)); len(got) != 0 || pages != 2 {
				t.Errorf("custom_id=%q: items %v in %d pages, want none in 2", v, got, pages)
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
