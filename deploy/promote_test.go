package deploy_test

import (
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// immutableFields are the fields of each kind that the API server refuses
// to change on an existing object (apps/v1 validation: a StatefulSet's
// spec may change only in replicas, template, updateStrategy,
// persistentVolumeClaimRetentionPolicy, minReadySeconds and ordinals; a
// Deployment's selector is fixed). An overlay that differs from another
// in one of them cannot replace it in place: `kubectl apply` of prod over
// dev would fail with "field is immutable".
var immutableFields = map[string][]string{
	"StatefulSet": {"selector", "serviceName", "volumeClaimTemplates", "podManagementPolicy"},
	"Deployment":  {"selector"},
	// A Job's pod template and a claim's access modes and class are fixed
	// too (batch/v1 and core/v1 validation).
	"Job":                   {"template"},
	"PersistentVolumeClaim": {"accessModes", "storageClassName"},
}

// TestOverlaysPromoteInPlace: every overlay agrees on every immutable
// field, so any overlay can be applied over any other (dev promoted to
// prod, prod moved to prod-hpa) without deleting a workload. The cluster
// suite (test/k8s) does the promotion for real.
func TestOverlaysPromoteInPlace(t *testing.T) {
	type key struct{ kind, name, field string }
	seen := map[key]string{}
	from := map[key]string{}
	for _, e := range overlays {
		objs := renderExpect(t, e)
		for _, o := range objs {
			kind, _ := o["kind"].(string)
			meta, _ := o["metadata"].(map[string]any)
			spec, _ := o["spec"].(map[string]any)
			for _, f := range immutableFields[kind] {
				b, err := yaml.Marshal(spec[f])
				if err != nil {
					t.Fatal(err)
				}
				k := key{kind, fmt.Sprint(meta["name"]), f}
				if prev, ok := seen[k]; !ok {
					seen[k], from[k] = string(b), e.name()
				} else if prev != string(b) {
					t.Errorf("%s/%s spec.%s differs between %s and %s, so one cannot be applied over the other:\n%s\n--- vs ---\n%s",
						k.kind, k.name, f, from[k], e.name(), strings.TrimSpace(prev), strings.TrimSpace(string(b)))
				}
			}
		}
	}
	if len(seen) == 0 {
		t.Fatal("no StatefulSet or Deployment found in the overlays")
	}
}
