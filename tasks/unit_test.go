package tasks

import (
	"testing"
	"time"
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
