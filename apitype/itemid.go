package apitype

import (
	"strconv"
	"strings"
)

// MaxCustomIDBytes bounds an item's custom_id.
const MaxCustomIDBytes = 64

// ItemID is the ID of the item at index (0-based, in submission order) of
// batch batchID: "<batch_id>-<index>", the index in decimal without
// leading zeros. Item IDs are derived rather than stored, so a batch of a
// million items needs no list of them.
func ItemID(batchID string, index int) string {
	return batchID + "-" + strconv.Itoa(index)
}

// ParseItemID splits an item ID made by ItemID. ok is false for anything
// else, including a single task's ID (which has no '-') and an index with
// a sign or leading zeros, so that each item has exactly one ID.
func ParseItemID(id string) (batchID string, index int, ok bool) {
	b, n, found := strings.Cut(id, "-")
	if !found || !IsID(b) || n == "" || len(n) > 9 || (len(n) > 1 && n[0] == '0') {
		return "", 0, false
	}
	for i := 0; i < len(n); i++ {
		if n[i] < '0' || n[i] > '9' {
			return "", 0, false
		}
	}
	index, err := strconv.Atoi(n)
	if err != nil {
		return "", 0, false
	}
	return b, index, true
}

// IsID reports whether s has the form of a single task's or a batch's ID:
// 32 lowercase hex digits.
func IsID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
