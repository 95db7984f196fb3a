package apitype

import "testing"

func TestItemID(t *testing.T) {
	const b = "0123456789abcdef0123456789abcdef"
	for _, i := range []int{0, 1, 9, 10, 63, 999999} {
		gb, gi, ok := ParseItemID(ItemID(b, i))
		if !ok || gb != b || gi != i {
			t.Errorf("ParseItemID(ItemID(b, %d)) = %q, %d, %v", i, gb, gi, ok)
		}
	}
	for _, bad := range []string{b, b + "-", b + "-01", b + "-+1", b + "--1", b + "-1x", b + "-1234567890",
		"0123456789ABCDEF0123456789abcdef-1", "abc-1", "-1", ""} {
		if _, _, ok := ParseItemID(bad); ok {
			t.Errorf("ParseItemID(%q) accepted", bad)
		}
	}
}
