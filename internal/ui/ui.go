// Package ui is puzzleq's dashboard: one HTML page, a script and a style
// sheet, embedded in the API binary and served at /ui/. The page talks to
// the v1 API like any client (with the session cookie of internal/api's
// session.go when API keys are set), so it needs no build step, loads
// nothing from other origins, and shows only what the signed-in key may
// see.
package ui

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"path"
	"sort"
)

//go:embed static
var static embed.FS

// Path is where the dashboard is served; "/" redirects here.
const Path = "/ui/"

// File is one file of the dashboard.
type File struct {
	// Name is its path under Path; the page itself is "index.html".
	Name string
	// ContentType is its media type, from its extension.
	ContentType string
	// ETag is a strong validator of Body, so a browser revalidates it
	// cheaply and never keeps a stale script after an upgrade.
	ETag string
	Body []byte
}

// Files returns the dashboard's files, sorted by name.
func Files() []File {
	var out []File
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ct := mime.TypeByExtension(path.Ext(p))
		if ct == "" {
			ct = "application/octet-stream"
		}
		out = append(out, File{Name: p[len("static/"):], ContentType: ct,
			ETag: `"` + hex.EncodeToString(sum[:8]) + `"`, Body: b})
		return nil
	})
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
