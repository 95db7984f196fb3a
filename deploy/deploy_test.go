package deploy_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestKustomizeOverlays renders the base and every overlay and checks
// them against the code.
func TestKustomizeOverlays(t *testing.T) {
	f := newFacts(t)
	for _, e := range overlays {
		t.Run(e.dir, func(t *testing.T) {
			objs, err := render(overlayDir(e.dir))
			if err != nil {
				t.Fatal(err)
			}
			if problems := checkK8s(f, e, objs); len(problems) > 0 {
				t.Errorf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
			}
		})
	}
}

// TestComposeFile loads docker-compose.yml with compose-go and checks it
// against the code.
func TestComposeFile(t *testing.T) {
	f := newFacts(t)
	if problems := checkCompose(f, filepath.Join(root, "docker-compose.yml")); len(problems) > 0 {
		t.Errorf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
	}
}
