package tasks

import (
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/puzzle"
)

func TestUnitNames(t *testing.T) {
	r := UnitRef{BatchID: "0123456789abcdef0123456789abcdef", Unit: ChunkUnit(12), Timeout: 90 * time.Second}
	got, err := ParseMember(r.Member())
	if err != nil || got != r {
		t.Fatalf("ParseMember(Member()) = %+v, %v; want %+v", got, err, r)
	}
	if c, n, err := ParseUnit(OwnUnit(7)); err != nil || c || n != 7 {
		t.Errorf("ParseUnit(x7) = %v %d %v", c, n, err)
	}
	for _, bad := range []string{"", "c", "y1", "c-1", "c01", "x1a"} {
		if _, _, err := ParseUnit(bad); err == nil {
			t.Errorf("ParseUnit(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"a/c1", "a/c1/0", "a/z1/5", "a/c1/5/6"} {
		if _, err := ParseMember(bad); err == nil {
			t.Errorf("ParseMember(%q) accepted", bad)
		}
	}
}

// A chunk's unit, whose items are all cheap, runs in the cheap lane; an
// item's own unit, and a unit name that cannot be read, on the solvers'.
// A single cheap puzzle goes to the cheap lane, a search to interactive.
func TestLanes(t *testing.T) {
	for unit, want := range map[string]string{ChunkUnit(0): QueueCheapBulk, ChunkUnit(41): QueueCheapBulk,
		OwnUnit(3): QueueBulk, "c": QueueBulk, "": QueueBulk} {
		if got := UnitQueue(unit); got != want {
			t.Errorf("UnitQueue(%q) = %s, want %s", unit, got, want)
		}
	}
	for req, want := range map[string]string{
		`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`:                       QueueCheap,
		`{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}`:                                   QueueCheap,
		`{"kind":"sliding","puzzle":{"board":[[1,2,3,4],[5,6,7,8],[9,10,11,12],[13,14,0,15]]}}`: QueueInteractive,
		`{"kind":"sweep","puzzle":{"board":["..","*."]}}`:                                       QueueInteractive,
	} {
		p, err := puzzle.Decode([]byte(req))
		if err != nil {
			t.Fatalf("%s: %v", req, err)
		}
		if got := SingleQueue(p); got != want {
			t.Errorf("SingleQueue(%s) = %s, want %s", req, got, want)
		}
	}
}
