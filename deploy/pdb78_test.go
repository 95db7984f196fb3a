package deploy_test

import (
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/kustomize/api/krusty"
)

// The 7-8 table set, as docs/performance-solvers.md measures it (and
// `puzzlectl pdb build` reports): the files' bytes and the build's peak
// resident memory.
const (
	tables78Bytes    = 259_459_255 + 28_828_854
	build78PeakBytes = 1_460_000_000
)

// workerBaseLimit is the worker's memory limit without the 7-8 tables
// (the base's): with them mapped, the limit must leave this besides the
// files' pages, which are charged to the pod that first touches them.
var workerBaseLimit = resource.MustParse("1Gi")

// renderExpect renders e: its overlay as it is, or, with components, the
// overlay with `components:` added to its kustomization.yaml, the edit an
// operator makes to opt in.
func renderExpect(t *testing.T, e expect) []map[string]any {
	t.Helper()
	if len(e.components) == 0 {
		objs, err := render(overlayDir(e.dir))
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}
	rel := strings.TrimPrefix(e.dir, "deploy/k8s/")
	mem := copyTree(t, filepath.Join(root, "deploy", "k8s"), func(p string, b []byte) []byte {
		if filepath.ToSlash(p) != rel+"/kustomization.yaml" {
			return b
		}
		if strings.Contains(string(b), "\ncomponents:") {
			t.Fatalf("%s already lists components; this test appends them", p)
		}
		up := strings.Repeat("../", strings.Count(rel, "/")+1)
		s := string(b) + "components:\n"
		for _, c := range e.components {
			s += "  - " + up + "components/" + c + "\n"
		}
		return []byte(s)
	})
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(mem, "/"+rel)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// pdbCommand parses a container's `puzzlectl pdb build|verify DIR
// [--set S]`; ok is false for any other command.
func pdbCommand(c corev1.Container) (verb, dir, set string, ok bool) {
	argv := append(slices.Clone(c.Command), c.Args...)
	if len(argv) < 4 || path.Base(argv[0]) != "puzzlectl" || argv[1] != "pdb" {
		return "", "", "", false
	}
	verb, dir, set = argv[2], argv[3], "78" // the flag's default
	rest := argv[4:]
	for len(rest) > 0 {
		switch {
		case rest[0] == "--set" && len(rest) > 1:
			set, rest = rest[1], rest[2:]
		case strings.HasPrefix(rest[0], "--set="):
			set, rest = strings.TrimPrefix(rest[0], "--set="), rest[1:]
		default:
			return "", "", "", false
		}
	}
	return verb, dir, set, verb == "build" || verb == "verify"
}

// checkTool checks a container that runs to completion (an init
// container, a Job's): a binary of the image, and for puzzlectl a pdb
// command on a directory the container mounts.
func checkTool(f *facts, id string, c corev1.Container, bad func(string, ...any)) {
	if len(c.Command) == 0 {
		bad("%s: no command: name the binary", id)
		return
	}
	bin := path.Base(c.Command[0])
	if path.Dir(c.Command[0]) != f.binDir || !f.binaries[bin] {
		bad("%s: command %s is not a binary of the image (%s/%v)", id, c.Command[0], f.binDir, keys(f.binaries))
		return
	}
	_, dir, set, ok := pdbCommand(c)
	if !ok {
		bad("%s: runs %q, which the checks do not know (want puzzlectl pdb build|verify DIR [--set S])",
			id, strings.Join(append(slices.Clone(c.Command), c.Args...), " "))
		return
	}
	if set != "78" && set != "663" {
		bad("%s: --set %q, want 78 or 663", id, set)
	}
	if _, ok := mountOf(c, dir); !ok {
		bad("%s: %s is not a mounted volume (the root filesystem is read-only)", id, dir)
	}
}

// mountOf returns c's volume mount at exactly dir.
func mountOf(c corev1.Container, dir string) (corev1.VolumeMount, bool) {
	for _, m := range c.VolumeMounts {
		if path.Clean(m.MountPath) == path.Clean(dir) {
			return m, true
		}
	}
	return corev1.VolumeMount{}, false
}

func volumeOf(spec corev1.PodSpec, name string) (corev1.Volume, bool) {
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	return corev1.Volume{}, false
}

// checkPDBVolume: when the workers' pattern databases come from a shared
// volume (an init container verifying them), the workers map the files
// the init container verified, from a claim every node can mount, mounted
// read-only, with the set PDB_SET asks for; a Job builds that set into
// that claim with the memory the build needs; and the workers' memory
// limit leaves room for the mapped files.
func checkPDBVolume(f *facts, b *bundle, w workload, bad func(string, ...any)) {
	var verifies []corev1.Container
	for _, c := range w.pod.Spec.InitContainers {
		if verb, _, _, ok := pdbCommand(c); ok && verb == "verify" {
			verifies = append(verifies, c)
		}
	}
	if len(verifies) == 0 && len(b.jobs) == 0 && len(b.pvcs) == 0 {
		return // the base's per-pod cache: 6-6-3, or 7-8 built in place
	}
	id := w.kind + "/" + w.name
	if len(verifies) != 1 {
		bad("%s: %d init containers run puzzlectl pdb verify, want 1 (the workers would start on the 6-6-3 fallback)", id, len(verifies))
		return
	}
	var worker corev1.Container
	for _, c := range w.pod.Spec.Containers {
		if len(c.Command) > 0 && path.Base(c.Command[0]) == "worker" {
			worker = c
		}
	}
	env := containerEnv(b, id, worker, bad)
	cfg, err := f.load["worker"](env)
	if err != nil {
		return // checkApp reports it
	}
	_, vdir, vset, _ := pdbCommand(verifies[0])
	if path.Clean(vdir) != path.Clean(cfg.PDBDir) {
		bad("%s: init container %s verifies %s, not PDB_DIR %q", id, verifies[0].Name, vdir, cfg.PDBDir)
	}
	if vset != cfg.PDBSet {
		bad("%s: init container %s verifies the %s set, the worker's PDB_SET is %s", id, verifies[0].Name, vset, cfg.PDBSet)
	}
	wm, ok := mountOf(worker, cfg.PDBDir)
	if !ok {
		bad("%s: PDB_DIR %q is not a mounted volume", id, cfg.PDBDir)
		return
	}
	if !wm.ReadOnly {
		bad("%s: PDB_DIR %s is not mounted read-only (the workers only map the files)", id, cfg.PDBDir)
	}
	if vm, ok := mountOf(verifies[0], vdir); ok && vm.Name != wm.Name {
		bad("%s: init container %s verifies volume %s, the worker maps volume %s", id, verifies[0].Name, vm.Name, wm.Name)
	}
	v, _ := volumeOf(w.pod.Spec, wm.Name)
	if v.PersistentVolumeClaim == nil {
		bad("%s: PDB_DIR's volume %s is not a PersistentVolumeClaim: every pod would need its own build", id, wm.Name)
		return
	}
	claim := v.PersistentVolumeClaim.ClaimName
	if !v.PersistentVolumeClaim.ReadOnly {
		bad("%s: claim %s is not mounted read-only", id, claim)
	}
	lim := worker.Resources.Limits[corev1.ResourceMemory]
	need := workerBaseLimit.DeepCopy()
	need.Add(*resource.NewQuantity(tables78Bytes, resource.BinarySI))
	if cfg.PDBSet == "78" && lim.Cmp(need) < 0 {
		bad("%s: worker memory limit %s leaves less than %s besides the 7-8 files' %d bytes", id, lim.String(), workerBaseLimit.String(), tables78Bytes)
	}

	// The claim: mountable by every node's workers, large enough.
	pi := slices.IndexFunc(b.pvcs, func(p corev1.PersistentVolumeClaim) bool { return p.Name == claim })
	if pi < 0 {
		bad("%s: claim %s does not exist", id, claim)
		return
	}
	pvc := b.pvcs[pi]
	if !slices.Contains(pvc.Spec.AccessModes, corev1.ReadWriteMany) && !slices.Contains(pvc.Spec.AccessModes, corev1.ReadOnlyMany) {
		bad("PersistentVolumeClaim/%s: access modes %v are mountable by one node only, want ReadWriteMany or ReadOnlyMany", claim, pvc.Spec.AccessModes)
	}
	if st := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; st.Value() < tables78Bytes {
		bad("PersistentVolumeClaim/%s: %s holds less than the 7-8 files' %d bytes", claim, st.String(), tables78Bytes)
	}

	// The Job that fills it.
	builds := 0
	for _, j := range b.jobs {
		spec := j.Spec.Template.Spec
		for _, c := range spec.Containers {
			verb, dir, set, ok := pdbCommand(c)
			if !ok || verb != "build" {
				continue
			}
			m, ok := mountOf(c, dir)
			if !ok {
				continue // checkTool reports it
			}
			jv, _ := volumeOf(spec, m.Name)
			if jv.PersistentVolumeClaim == nil || jv.PersistentVolumeClaim.ClaimName != claim {
				continue
			}
			builds++
			jid := fmt.Sprintf("Job/%s container %s", j.Name, c.Name)
			if m.ReadOnly || jv.PersistentVolumeClaim.ReadOnly {
				bad("%s: builds into claim %s mounted read-only", jid, claim)
			}
			if set != cfg.PDBSet {
				bad("%s: builds the %s set, the workers' PDB_SET is %s", jid, set, cfg.PDBSet)
			}
			if spec.SecurityContext == nil || spec.SecurityContext.FSGroup == nil {
				bad("Job/%s: no fsGroup: the nonroot user cannot write a new volume", j.Name)
			}
			if set == "78" {
				for kind, q := range map[string]resource.Quantity{"request": c.Resources.Requests[corev1.ResourceMemory], "limit": c.Resources.Limits[corev1.ResourceMemory]} {
					if q.Value() < build78PeakBytes {
						bad("%s: memory %s %s is below the 7-8 build's peak of %d bytes", jid, kind, q.String(), int64(build78PeakBytes))
					}
				}
			}
		}
	}
	if builds == 0 {
		bad("%s: no Job runs puzzlectl pdb build into claim %s", id, claim)
	}
}

// TestChecksCatchBrokenPDB78 breaks the pdb78 component's output one way
// at a time and asserts that the checks report it.
func TestChecksCatchBrokenPDB78(t *testing.T) {
	f := newFacts(t)
	e := expect{"deploy/k8s/overlays/prod", 3, 0, "keda", []string{"pdb78"}}
	worker := func(o []map[string]any) map[string]any { return container(o, "Deployment", "worker") }
	verify := func(o []map[string]any) map[string]any {
		return dig(find(o, "Deployment", "worker"), "spec", "template", "spec", "initContainers", 0).(map[string]any)
	}
	cases := []struct {
		name   string
		mutate func([]map[string]any)
		want   string
	}{
		{"worker mounts the tables writable", func(o []map[string]any) {
			delete(dig(worker(o), "volumeMounts", 0).(map[string]any), "readOnly")
		}, "PDB_DIR /var/cache/puzzleq is not mounted read-only"},
		{"init verifies another directory", func(o []map[string]any) {
			verify(o)["command"].([]any)[3] = "/tmp"
		}, "verifies /tmp, not PDB_DIR"},
		{"init verifies the other set", func(o []map[string]any) {
			c := verify(o)
			c["command"] = append(c["command"].([]any), "--set", "663")
		}, "verifies the 663 set, the worker's PDB_SET is 78"},
		{"no init container", func(o []map[string]any) {
			delete(dig(find(o, "Deployment", "worker"), "spec", "template", "spec").(map[string]any), "initContainers")
		}, "0 init containers run puzzlectl pdb verify"},
		{"init container with a writable root", func(o []map[string]any) {
			dig(verify(o), "securityContext").(map[string]any)["readOnlyRootFilesystem"] = false
		}, "init container pdb-verify: readOnlyRootFilesystem is not true"},
		{"init container without limits", func(o []map[string]any) {
			delete(dig(verify(o), "resources").(map[string]any), "limits")
		}, "init container pdb-verify: no memory limit"},
		{"worker limit not raised", func(o []map[string]any) {
			dig(worker(o), "resources", "limits").(map[string]any)["memory"] = "1Gi"
		}, "worker memory limit 1Gi leaves less than 1Gi besides the 7-8 files"},
		{"claim for one node", func(o []map[string]any) {
			dig(find(o, "PersistentVolumeClaim", "pdb"), "spec").(map[string]any)["accessModes"] = []any{"ReadWriteOnce"}
		}, "mountable by one node only"},
		{"claim too small", func(o []map[string]any) {
			dig(find(o, "PersistentVolumeClaim", "pdb"), "spec", "resources", "requests").(map[string]any)["storage"] = "256Mi"
		}, "256Mi holds less than the 7-8 files"},
		{"build without the memory", func(o []map[string]any) {
			dig(container(o, "Job", "pdb-build"), "resources", "limits").(map[string]any)["memory"] = "1Gi"
		}, "memory limit 1Gi is below the 7-8 build's peak"},
		{"build into another claim", func(o []map[string]any) {
			dig(find(o, "Job", "pdb-build"), "spec", "template", "spec", "volumes", 0, "persistentVolumeClaim").(map[string]any)["claimName"] = "other"
		}, "no Job runs puzzlectl pdb build into claim pdb"},
		{"build as a new image", func(o []map[string]any) {
			c := container(o, "Job", "pdb-build")
			c["image"] = strings.Split(c["image"].(string), ":")[0] + ":0.0.9"
		}, "puzzleq containers use 2 images"},
		{"build without fsGroup", func(o []map[string]any) {
			delete(dig(find(o, "Job", "pdb-build"), "spec", "template", "spec", "securityContext").(map[string]any), "fsGroup")
		}, "no fsGroup"},
		{"build by a command the checks do not know", func(o []map[string]any) {
			container(o, "Job", "pdb-build")["command"].([]any)[2] = "bild"
		}, `runs "/usr/local/bin/puzzlectl pdb bild /var/cache/puzzleq"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderExpect(t, e)
			if p := checkK8s(f, e, objs); len(p) != 0 {
				t.Fatalf("unbroken overlay has problems: %v", p)
			}
			tc.mutate(objs)
			assertReported(t, checkK8s(f, e, objs), tc.want)
		})
	}
}
