package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// kedaDir is where the Go module proxy put KEDA's module: its CRDs and
// manifests (config/) come from there, the same release ../keda builds.
// It downloads the module when the module cache lacks it, which happens
// when the cluster cache holds KEDA's binaries from a run with another
// module cache, so that no build downloaded it.
func kedaDir(ctx context.Context, e env) (string, error) {
	const mod = "github.com/kedacore/keda/v2"
	dir := filepath.Join(e.tools, "keda")
	for try := 0; ; try++ {
		out, err := output(ctx, dir, "go", "list", "-m", "-f", "{{.Dir}}", mod)
		if err != nil {
			return "", err
		}
		if out != "" {
			return out, nil
		}
		if try > 0 {
			return "", fmt.Errorf("%s: go mod download left it out of the module cache", mod)
		}
		if _, err := output(ctx, dir, "go", "mod", "download", mod); err != nil {
			return "", err
		}
	}
}

// installKEDACRDs installs KEDA's CRDs, so that the API server checks a
// ScaledObject against KEDA's own schema. Server-side apply: the
// ScaledObject CRD is too large for the last-applied annotation.
func installKEDACRDs(ctx context.Context, e env) error {
	dir, err := kedaDir(ctx, e)
	if err != nil {
		return err
	}
	if _, err := kubectl(ctx, e, "apply", "--server-side", "-f", filepath.Join(dir, "config", "crd", "bases")); err != nil {
		return err
	}
	return waitFor(ctx, "KEDA's CRDs established", 60*time.Second, func() error {
		for _, crd := range []string{"scaledobjects.keda.sh", "scaledjobs.keda.sh", "triggerauthentications.keda.sh", "clustertriggerauthentications.keda.sh"} {
			out, err := kubectl(ctx, e, "get", "crd", crd, "-o", `jsonpath={.status.conditions[?(@.type=="Established")].status}`)
			if err != nil {
				return err
			}
			if out != "True" {
				return fmt.Errorf("%s Established=%q", crd, out)
			}
		}
		return nil
	})
}

// kedaBinaries maps each KEDA image (by repository) to the binary that
// ../keda builds for it and the path KEDA's manifests run it from.
var kedaBinaries = map[string][2]string{
	"ghcr.io/kedacore/keda":                    {"keda", "/keda"},
	"ghcr.io/kedacore/keda-metrics-apiserver":  {"keda-adapter", "/keda-adapter"},
	"ghcr.io/kedacore/keda-admission-webhooks": {"keda-admission-webhooks", "/keda-admission-webhooks"},
}

// kedaKustomization is KEDA's config/default with our images: the same
// tag as the release built, and IfNotPresent (KEDA's manifests say
// Always, and there is no registry to pull from).
func kedaKustomization(ctx context.Context, e env) (string, error) {
	src, err := kedaDir(ctx, e)
	if err != nil {
		return "", err
	}
	dst := e.path("keda")
	if err := os.RemoveAll(dst); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", err
	}
	if _, err := output(ctx, "", "cp", "-r", filepath.Join(src, "config"), filepath.Join(dst, "config")); err != nil {
		return "", err
	}
	if _, err := output(ctx, "", "chmod", "-R", "u+w", dst); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [config/default]\nimages:\n")
	for repo := range kedaBinaries {
		fmt.Fprintf(&b, "- name: %s\n  newName: %s\n  newTag: %q\n", repo, repo, kedaVersion)
	}
	b.WriteString(`patches:
- target: {kind: Deployment}
  patch: |-
    - op: replace
      path: /spec/template/spec/containers/0/imagePullPolicy
      value: IfNotPresent
`)
	if err := os.WriteFile(filepath.Join(dst, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	return dst, nil
}

func kedaImgs(e env) []image {
	var imgs []image
	for repo, b := range kedaBinaries {
		imgs = append(imgs, image{
			ref:     repo + ":" + kedaVersion,
			entries: append(distrolessBase(), entry{path: b[1], mode: 0o755, src: e.bin(b[0])}),
			// KEDA's images are distroless/static:nonroot too.
			config: v1.Config{User: "65532:65532", Entrypoint: []string{b[1]}, WorkingDir: "/home/nonroot"},
		})
	}
	return imgs
}

// installKEDA applies KEDA's own manifests and waits until its operator,
// metrics adapter and webhooks are available and the external metrics API
// answers.
func installKEDA(ctx context.Context, e env) error {
	dir, err := kedaKustomization(ctx, e)
	if err != nil {
		return err
	}
	if _, err := kubectl(ctx, e, "apply", "--server-side", "--force-conflicts", "-k", dir); err != nil {
		return err
	}
	deps, err := kubectl(ctx, e, "-n", "keda", "get", "deploy", "-o", "name")
	if err != nil {
		return err
	}
	if len(strings.Fields(deps)) != len(kedaBinaries) {
		return fmt.Errorf("KEDA's manifests made %q, want one Deployment per image (%d)", deps, len(kedaBinaries))
	}
	for _, d := range strings.Fields(deps) {
		if _, err := kubectl(ctx, e, "-n", "keda", "rollout", "status", d, "--timeout=180s"); err != nil {
			return err
		}
	}
	return waitFor(ctx, "KEDA's external metrics API", 120*time.Second, func() error {
		_, err := kubectl(ctx, e, "get", "--raw", "/apis/external.metrics.k8s.io/v1beta1")
		return err
	})
}
