package ui_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/internal/ui"
)

// The page loads nothing from another origin: every src and href of the
// HTML is a path on this server, and neither the script nor the style
// sheet names a URL with a scheme or a protocol-relative one (but the SVG
// namespace, which is a name).
func TestFilesAreSelfContained(t *testing.T) {
	want := map[string]string{"index.html": "text/html", "app.js": "javascript", "draw.js": "javascript", "chart.js": "javascript", "style.css": "text/css", "favicon.svg": "image/svg+xml"}
	ref := regexp.MustCompile(`(?:src|href)="([^"]*)"`)
	external := regexp.MustCompile(`(?i)(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	for _, f := range ui.Files() {
		ct, ok := want[f.Name]
		if !ok {
			t.Errorf("unexpected file %s", f.Name)
			continue
		}
		delete(want, f.Name)
		if !strings.Contains(f.ContentType, ct) || f.ETag == "" || len(f.Body) == 0 {
			t.Errorf("%s: content type %q, ETag %q, %d bytes", f.Name, f.ContentType, f.ETag, len(f.Body))
		}
		if f.Name == "index.html" {
			for _, m := range ref.FindAllStringSubmatch(string(f.Body), -1) {
				if u := m[1]; !strings.HasPrefix(u, "/") && !strings.HasPrefix(u, "#") || strings.HasPrefix(u, "//") {
					t.Errorf("index.html refers to %q, not a path on this server", u)
				}
			}
		}
		// The SVG namespace is a name that createElementNS needs, never
		// fetched; it is the one URL a file may hold.
		body := strings.ReplaceAll(string(f.Body), `"http://www.w3.org/2000/svg"`, "")
		if m := external.FindString(body); m != "" {
			t.Errorf("%s names another origin: %q", f.Name, m)
		}
	}
	for name := range want {
		t.Errorf("%s is not embedded", name)
	}
}
