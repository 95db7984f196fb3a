package deploy_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// TestSettingChangeRollsPods: changing a shared setting in the base (one
// that no overlay overrides) changes the pod template of every workload
// that reads it, in every overlay, so `kubectl apply` rolls those pods
// onto the new value instead of leaving them on the old one until
// something else restarts them.
func TestSettingChangeRollsPods(t *testing.T) {
	const old, changed = "TASK_TTL=24h", "TASK_TTL=12h"
	edited := copyTree(t, filepath.Join(root, "deploy", "k8s"), func(path string, b []byte) []byte {
		if filepath.ToSlash(path) != "base/kustomization.yaml" {
			return b
		}
		if !strings.Contains(string(b), old) {
			t.Fatalf("base/kustomization.yaml does not set %s; this test edits it", old)
		}
		return []byte(strings.Replace(string(b), old, changed, 1))
	})
	for _, e := range overlays {
		if len(e.components) > 0 {
			continue // the same ConfigMap and references as without them
		}
		t.Run(e.dir, func(t *testing.T) {
			before, err := render(overlayDir(e.dir))
			if err != nil {
				t.Fatal(err)
			}
			k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
			rm, err := k.Run(edited, "/"+strings.TrimPrefix(e.dir, "deploy/k8s/"))
			if err != nil {
				t.Fatal(err)
			}
			var after []map[string]any
			for _, r := range rm.Resources() {
				m, err := r.Map()
				if err != nil {
					t.Fatal(err)
				}
				after = append(after, m)
			}
			for _, d := range []string{"api", "worker"} {
				if reflect.DeepEqual(dig(find(before, "Deployment", d), "spec", "template"),
					dig(find(after, "Deployment", d), "spec", "template")) {
					t.Errorf("Deployment/%s: pod template unchanged by %s -> %s: its pods would keep the old setting", d, old, changed)
				}
			}
		})
	}
}

// copyTree copies the files under dir into an in-memory file system at
// "/", passing each file's contents (by its path relative to dir) through
// edit.
func copyTree(t *testing.T, dir string, edit func(rel string, b []byte) []byte) filesys.FileSystem {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return mem.WriteFile("/"+filepath.ToSlash(rel), edit(rel, b))
	})
	if err != nil {
		t.Fatal(err)
	}
	return mem
}
