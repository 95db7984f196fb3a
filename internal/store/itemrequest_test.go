package store_test

import (
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
)

// ItemRequest gives back each item's request as staged, whether it
// shares its chunk's unit or runs in its own, at any offset of its
// chunk; an index beyond the batch, or a batch gone, is ErrNotFound.
func TestItemRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Hour, time.Hour)
	id := bid("itemreq")
	items := []store.StagedItem{cheap(`{"p":0}`), own(`{"p":1}`), cheap(`{"p":2}`),
		{Kind: puzzle.KindFill, Request: []byte(`{"p":3}`), Timeout: time.Second}, own("{\n\"p\":4}"),
		cheap(`{"p":5}`), cheap(`{"p":6}`)}
	b := e.commit(t, store.CommitBatch{ID: id, Owner: "alice"}, 3, items)
	for i, it := range items {
		got, err := e.s.ItemRequest(e.ctx, b, i)
		if err != nil || string(got) != string(it.Request) {
			t.Errorf("item %d: %q, %v; want %q", i, got, err, it.Request)
		}
	}
	for _, i := range []int{-1, len(items), len(items) + 5} {
		if got, err := e.s.ItemRequest(e.ctx, b, i); err != store.ErrNotFound {
			t.Errorf("item %d: %q, %v; want ErrNotFound", i, got, err)
		}
	}
	// A batch record whose requests expired answers not found, not an
	// empty request.
	if err := e.rdb.Del(e.ctx, e.prefix+"batch:"+id+":req").Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := e.s.ItemRequest(e.ctx, b, 0); err != store.ErrNotFound {
		t.Errorf("after the requests expired: %q, %v; want ErrNotFound", got, err)
	}
}
