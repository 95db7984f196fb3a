package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoPath matches what a page names as a file or directory of the
// repository: a top-level directory of the project, then a path, in
// backticks or as a link target.
var repoPath = regexp.MustCompile("(?:`|\\]\\()(?:\\.\\./)*((?:apitype|client|cmd|deploy|docs|internal|puzzle|scripts|solvers|tasks|test|webhook)/[A-Za-z0-9_./*-]*)")

// TestDocsNameFilesThatExist holds every page to the tree: a file or
// directory that the README, SECURITY.md, CHANGELOG.md's top or a page
// under docs/ names is in the repository, so a move of code shows up as
// a failing test rather than as a page that sends readers nowhere.
func TestDocsNameFilesThatExist(t *testing.T) {
	pages := []string{"README.md", "SECURITY.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		rel, _ := filepath.Rel(root, m)
		pages = append(pages, rel)
	}
	checked := 0
	for _, page := range pages {
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range repoPath.FindAllStringSubmatch(line, -1) {
				p := strings.TrimRight(m[1], ".,:;")
				p, _, _ = strings.Cut(p, "#")
				// A glob or a placeholder is not one file.
				if strings.ContainsAny(p, "*<>{}") || strings.Contains(p, "...") {
					continue
				}
				checked++
				if _, err := os.Stat(filepath.Join(root, p)); err != nil {
					t.Errorf("%s:%d names %s, which is not in the repository", page, i+1, p)
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d paths found in the pages: the pattern no longer matches how they name files", checked)
	}
}
