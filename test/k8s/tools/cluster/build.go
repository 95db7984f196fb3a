package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// kubeCommands are the Kubernetes programs the cluster runs, built from
// k8s.io/kubernetes at kubeVersion by the ../kube module.
var kubeCommands = []string{
	"kube-apiserver", "kube-controller-manager", "kube-scheduler",
	"kubelet", "kube-proxy", "kubectl",
}

// build compiles every binary into the cache, unless the cache already
// holds them (buildKey). The Go build cache makes a second build take
// seconds; a cold one takes minutes (docs/performance.md says how many).
func build(ctx context.Context, e env, withKEDA bool) error {
	out := filepath.Join(e.cache, "bin") + "/"
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	static := []string{"CGO_ENABLED=0", "GOTOOLCHAIN=local", "GOFLAGS=-mod=readonly"}
	if err := cachedBuild(ctx, e, "kube", func() error { return buildKube(ctx, e, static, out) }); err != nil {
		return err
	}
	if withKEDA {
		return cachedBuild(ctx, e, "keda", func() error {
			return phase("build keda", func() error { return buildKEDA(ctx, e, static, out) })
		})
	}
	return nil
}

// buildKube builds Kubernetes, etcd, CoreDNS and pause.
func buildKube(ctx context.Context, e env, static []string, out string) error {
	// Without the version stamps the API server reports v0.0.0-master,
	// which kubectl and clients cannot parse.
	var ld []string
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		major, minor, _ := strings.Cut(strings.TrimPrefix(kubeVersion, "v"), ".")
		minor, _, _ = strings.Cut(minor, ".")
		ld = append(ld, "-X", pkg+".gitVersion="+kubeVersion, "-X", pkg+".gitMajor="+major, "-X", pkg+".gitMinor="+minor,
			"-X", pkg+".gitTreeState=clean", "-X", pkg+".buildDate=1970-01-01T00:00:00Z")
	}
	args := []string{"build", "-trimpath", "-ldflags=-s -w " + strings.Join(ld, " "), "-o", out}
	for _, c := range kubeCommands {
		args = append(args, "k8s.io/kubernetes/cmd/"+c)
	}
	args = append(args, "./etcd")
	if err := phase("build kube+etcd", func() error { return runEnv(ctx, filepath.Join(e.tools, "kube"), static, "go", args...) }); err != nil {
		return err
	}
	if err := phase("build coredns", func() error {
		return runEnv(ctx, filepath.Join(e.tools, "coredns"), static, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out+"coredns", ".")
	}); err != nil {
		return err
	}
	return phase("build pause", func() error {
		return runEnv(ctx, e.tools, static, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out+"pause", "./pause")
	})
}

// kedaVersion is the KEDA release ../keda/go.mod requires.
const kedaVersion = "2.21.0"

func buildKEDA(ctx context.Context, e env, envv []string, out string) error {
	src, err := kedaDir(ctx, e)
	if err != nil {
		return err
	}
	dir := filepath.Join(e.tools, "keda")
	modFile, err := kedaRedisOnly(src, filepath.Join(e.cache, "src", "keda-"+kedaVersion), dir)
	if err != nil {
		return err
	}
	ld := "-s -w -X github.com/kedacore/keda/v2/version.Version=" + kedaVersion + " -X github.com/kedacore/keda/v2/version.GitCommit=v" + kedaVersion
	for name, pkg := range map[string]string{
		"keda":                    "github.com/kedacore/keda/v2/cmd/operator",
		"keda-adapter":            "github.com/kedacore/keda/v2/cmd/adapter",
		"keda-admission-webhooks": "github.com/kedacore/keda/v2/cmd/webhooks",
	} {
		if err := runEnv(ctx, dir, envv, "go", "build", "-modfile="+modFile, "-trimpath", "-ldflags="+ld, "-o", out+name, pkg); err != nil {
			return fmt.Errorf("build %s: %w", name, err)
		}
	}
	return nil
}
