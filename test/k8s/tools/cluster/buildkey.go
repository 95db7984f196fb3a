package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// A build's binaries are kept in the cache with a key: the hash of
// everything that decides them (the Go version, the driver's build code,
// and the files of the modules built). When the key in the cache matches,
// the build is skipped, so that a kept $PUZZLEQ_K8S_CACHE is enough for a
// quick start even when the Go build cache is empty (a fresh CI machine
// with the cluster cache restored); go build alone would compile
// Kubernetes again for that.

// buildInputs are the paths, relative to the tools directory, whose
// contents decide each build's binaries.
var buildInputs = map[string][]string{
	"kube": {"kube", "coredns", "pause", "cluster/build.go", "cluster/main.go"},
	"keda": {"keda", "cluster/build.go", "cluster/kedasrc.go", "cluster/main.go"},
}

// buildKey hashes the Go version and the files of the build's inputs.
func buildKey(ctx context.Context, e env, name string) (string, error) {
	gov, err := output(ctx, e.tools, "go", "version")
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", gov)
	for _, in := range buildInputs[name] {
		var files []string
		err := filepath.WalkDir(filepath.Join(e.tools, in), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		sort.Strings(files)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return "", err
			}
			rel, _ := filepath.Rel(e.tools, f)
			fmt.Fprintf(h, "%s %d\n", rel, len(b))
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (e env) keyFile(name string) string { return filepath.Join(e.cache, "bin", "."+name+".key") }

// cachedBuild runs build unless the cache holds the binaries of the same
// key, and records the key once build succeeds.
func cachedBuild(ctx context.Context, e env, name string, build func() error) error {
	key, err := buildKey(ctx, e, name)
	if err != nil {
		return err
	}
	if b, err := os.ReadFile(e.keyFile(name)); err == nil && string(b) == key {
		fmt.Printf("cluster: %s: the cache holds this build (key %.12s)\n", name, key)
		return nil
	}
	// A build that fails halfway must not leave the old key beside new
	// binaries.
	if err := os.Remove(e.keyFile(name)); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := build(); err != nil {
		return err
	}
	return os.WriteFile(e.keyFile(name), []byte(key), 0o644)
}
