package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// namespace is the overlays' namespace (deploy/k8s/base).
const namespace = "puzzleq"

// overlayPath resolves an overlay name (dev, prod, ...) to its directory
// in deploy/k8s/overlays; anything with a slash is taken as a path, so
// test overlays elsewhere work too.
func overlayPath(e env, overlay string) string {
	if strings.Contains(overlay, "/") {
		if filepath.IsAbs(overlay) {
			return overlay
		}
		return filepath.Join(e.repo, overlay)
	}
	return filepath.Join(e.repo, "deploy", "k8s", "overlays", overlay)
}

// ensureNamespace creates the namespace for real and makes Pod Security
// Admission enforce (and warn about) "restricted" there, so that a dry
// run sees what a real apply would see.
func ensureNamespace(ctx context.Context, e env) error {
	if _, err := kubectl(ctx, e, "create", "namespace", namespace); err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
		return err
	}
	_, err := kubectl(ctx, e, "label", "--overwrite", "namespace", namespace,
		"pod-security.kubernetes.io/enforce=restricted",
		"pod-security.kubernetes.io/enforce-version=latest",
		"pod-security.kubernetes.io/warn=restricted",
		"pod-security.kubernetes.io/audit=restricted")
	return err
}

// apiKeysSecret is the Secret every overlay's api mounts as
// API_KEYS_FILE (deploy/k8s/base/api.yaml).
const apiKeysSecret = "puzzleq-api-keys"

// apiKeysFile is where the cluster keeps the keys it put in that Secret,
// so the suite (and a person with kubectl) can use them.
func (e env) apiKeysFile() string { return filepath.Join(e.state, "api-keys.json") }

// ensureAPIKeys creates the keys Secret as an operator would before the
// first apply: a tenant key and an operator key, random, in the format
// API_KEYS_FILE reads. The file stays in the state directory, which down
// removes.
func ensureAPIKeys(ctx context.Context, e env) error {
	if _, err := os.Stat(e.apiKeysFile()); errors.Is(err, fs.ErrNotExist) {
		tenant, operator := make([]byte, 16), make([]byte, 16)
		if _, err := rand.Read(tenant); err != nil {
			return err
		}
		if _, err := rand.Read(operator); err != nil {
			return err
		}
		// The suite's eight clients share the tenant key, so it gets a
		// rate far over the default per-key 20/s: the rolling-restart
		// stage measures restarts under load, not the rate limiter.
		keys := fmt.Sprintf(`[{"name":"k8s-suite","key":%q,"rate_per_second":5000,"burst":10000},{"name":"k8s-operator","key":%q,"role":"operator"}]`,
			hex.EncodeToString(tenant), hex.EncodeToString(operator))
		if err := os.WriteFile(e.apiKeysFile(), []byte(keys), 0o600); err != nil {
			return err
		}
	}
	_, err := kubectl(ctx, e, "-n", namespace, "create", "secret", "generic", apiKeysSecret, "--from-file=keys.json="+e.apiKeysFile())
	// "create secret" words it "failed to create secret ... already
	// exists", without the API's reason AlreadyExists.
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		return err
	}
	return nil
}

// check applies every overlay with --dry-run=server --warnings-as-errors:
// the API server runs its validation, defaulting, admission (Pod Security
// among it) and the CRDs' schemas, and any warning fails the check.
func check(ctx context.Context, e env) error {
	if err := ensureNamespace(ctx, e); err != nil {
		return err
	}
	if err := ensureAPIKeys(ctx, e); err != nil {
		return err
	}
	overlays, err := overlayNames(e)
	if err != nil {
		return err
	}
	var errs []error
	for _, o := range overlays {
		err := phase("check "+o, func() error {
			out, err := kubectl(ctx, e, "apply", "--dry-run=server", "--warnings-as-errors", "-k", overlayPath(e, o))
			if err != nil {
				return err
			}
			fmt.Println(indent(out))
			return nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("overlay %s: %w", o, err))
		}
	}
	return errors.Join(errs...)
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n    ")
}

// deploy applies an overlay as its comment says (kubectl apply -k) and
// waits until every workload in the namespace has rolled out.
func deploy(ctx context.Context, e env, overlay string) error {
	if err := ensureNamespace(ctx, e); err != nil {
		return err
	}
	if err := ensureAPIKeys(ctx, e); err != nil {
		return err
	}
	start := time.Now()
	out, err := kubectl(ctx, e, "apply", "--warnings-as-errors", "-k", overlayPath(e, overlay))
	if err != nil {
		return err
	}
	fmt.Println(indent(out))
	if err := rollout(ctx, e, 5*time.Minute); err != nil {
		return err
	}
	fmt.Printf("cluster: overlay %s Ready %.1fs after apply\n", overlay, time.Since(start).Seconds())
	return nil
}

// rollout waits for every Deployment and StatefulSet in the namespace.
func rollout(ctx context.Context, e env, timeout time.Duration) error {
	names, err := kubectl(ctx, e, "-n", namespace, "get", "deploy,sts", "-o", "name")
	if err != nil {
		return err
	}
	for _, n := range strings.Fields(names) {
		if _, err := kubectl(ctx, e, "-n", namespace, "rollout", "status", n, "--timeout="+timeout.String()); err != nil {
			return dumpOnFailure(ctx, e, err)
		}
	}
	return nil
}

// dumpOnFailure adds the namespace's pods and events to err, which is
// what one needs to see why a rollout hung.
func dumpOnFailure(ctx context.Context, e env, err error) error {
	pods, _ := kubectl(ctx, e, "-n", namespace, "get", "pods", "-o", "wide")
	events, _ := kubectl(ctx, e, "-n", namespace, "get", "events", "--sort-by=.lastTimestamp")
	fmt.Fprintf(os.Stderr, "pods:\n%s\nevents:\n%s\n", pods, events)
	return err
}
