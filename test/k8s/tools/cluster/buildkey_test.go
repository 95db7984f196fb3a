package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

func TestCachedBuildSkipsAKeptBuildAndRebuildsWhenAnInputChanges(t *testing.T) {
	tools, cache := t.TempDir(), t.TempDir()
	for _, f := range []string{"keda/go.mod", "cluster/build.go", "cluster/kedasrc.go", "cluster/main.go"} {
		if err := os.MkdirAll(filepath.Join(tools, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tools, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(cache, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	e := env{tools: tools, cache: cache}
	builds := 0
	b := func() error { builds++; return nil }
	ctx := context.Background()
	for range 2 {
		if err := cachedBuild(ctx, e, "keda", b); err != nil {
			t.Fatal(err)
		}
	}
	if builds != 1 {
		t.Fatalf("two builds with the same inputs ran %d times, want 1", builds)
	}
	if err := os.WriteFile(filepath.Join(tools, "keda/go.mod"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cachedBuild(ctx, e, "keda", b); err != nil {
		t.Fatal(err)
	}
	if builds != 2 {
		t.Fatalf("a changed go.mod ran the build %d times in all, want 2", builds)
	}
}
