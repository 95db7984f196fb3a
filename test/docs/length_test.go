package docs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestPagesStayShort holds the pages a newcomer reads first to the length
// they are kept at: each says what is true now, and its history is in
// git log. A page that outgrows it is cut, not raised.
func TestPagesStayShort(t *testing.T) {
	for _, page := range []string{"README.md", "docs/guarantees.md", "docs/performance.md"} {
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(b, []byte("\n")); n > 300 || n < 50 {
			t.Errorf("%s has %d lines; it is kept at 300 at most", page, n)
		}
	}
}
