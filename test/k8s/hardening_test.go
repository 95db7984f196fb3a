//go:build k8s

package k8s

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// container is one running container of a pod, as the node sees it.
type container struct {
	pod, name string
	pid       int
	spec      struct {
		Resources struct {
			Limits map[string]string `json:"limits"`
		} `json:"resources"`
	}
	runAsUser int
}

// containersOf returns the running containers of a component's pods,
// with the host pid of each container's first process.
func containersOf(t *testing.T, component string) []container {
	t.Helper()
	out := kubectl(t, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component="+component, "-o", "json")
	var list struct {
		Items []struct {
			Metadata struct{ Name string } `json:"metadata"`
			Spec     struct {
				SecurityContext struct {
					RunAsUser *int `json:"runAsUser"`
				} `json:"securityContext"`
				Containers []json.RawMessage `json:"containers"`
			} `json:"spec"`
			Status struct {
				Phase             string `json:"phase"`
				ContainerStatuses []struct {
					Name        string `json:"name"`
					ContainerID string `json:"containerID"`
					Ready       bool   `json:"ready"`
				} `json:"containerStatuses"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	var cs []container
	for _, p := range list.Items {
		if p.Status.Phase != "Running" {
			continue
		}
		for i, st := range p.Status.ContainerStatuses {
			c := container{pod: p.Metadata.Name, name: st.Name}
			if err := json.Unmarshal(p.Spec.Containers[i], &c.spec); err != nil {
				t.Fatal(err)
			}
			if p.Spec.SecurityContext.RunAsUser != nil {
				c.runAsUser = *p.Spec.SecurityContext.RunAsUser
			}
			id := strings.TrimPrefix(st.ContainerID, "containerd://")
			b, err := os.ReadFile(filepath.Join(stateDir, "containerd", "state", "io.containerd.runtime.v2.task", "k8s.io", id, "init.pid"))
			if err != nil {
				t.Fatalf("pid of %s/%s: %v", p.Metadata.Name, st.Name, err)
			}
			c.pid = atoi(string(b))
			cs = append(cs, c)
		}
	}
	if len(cs) == 0 {
		t.Fatalf("no running %s container", component)
	}
	return cs
}

// procStatus reads /proc/PID/status into a map.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// cgroupFile reads a file of the container's cgroup in a v1 hierarchy.
func cgroupFile(t *testing.T, pid int, controller, file string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) == 3 && strings.Contains(","+parts[1]+",", ","+controller+",") {
			dir := filepath.Join("/sys/fs/cgroup", parts[1], parts[2])
			v, err := os.ReadFile(filepath.Join(dir, file))
			if err != nil {
				t.Fatal(err)
			}
			return strings.TrimSpace(string(v))
		}
	}
	t.Fatalf("pid %d has no %s cgroup", pid, controller)
	return ""
}

// testHardening looks at each container from the node: the user it runs
// as, its capabilities, no_new_privs, seccomp, a read-only root, and the
// limits the manifests give, as the kernel enforces them.
func testHardening(t *testing.T) {
	for _, comp := range []string{"api", "worker", "redis"} {
		for _, c := range containersOf(t, comp) {
			id := c.pod + "/" + c.name
			st := procStatus(t, c.pid)
			uids := strings.Fields(st["Uid"])
			if len(uids) < 2 || uids[1] != strconv.Itoa(c.runAsUser) || uids[1] == "0" {
				t.Errorf("%s runs as uid %v, want %d (non-root)", id, uids, c.runAsUser)
			}
			if st["CapEff"] != "0000000000000000" || st["CapPrm"] != "0000000000000000" {
				t.Errorf("%s has capabilities eff=%s prm=%s, want none", id, st["CapEff"], st["CapPrm"])
			}
			if st["NoNewPrivs"] != "1" {
				t.Errorf("%s: NoNewPrivs=%s, want 1 (allowPrivilegeEscalation: false)", id, st["NoNewPrivs"])
			}
			if st["Seccomp"] != "2" {
				t.Errorf("%s: Seccomp=%s, want 2 (filter: RuntimeDefault)", id, st["Seccomp"])
			}
			if ro, err := rootReadOnly(c.pid); err != nil || !ro {
				t.Errorf("%s: root filesystem read-only=%v (%v)", id, ro, err)
			}
			if lim := c.spec.Resources.Limits["memory"]; lim != "" {
				want := quantityBytes(t, lim)
				if got := cgroupFile(t, c.pid, "memory", "memory.limit_in_bytes"); got != strconv.FormatInt(want, 10) {
					t.Errorf("%s: memory.limit_in_bytes=%s, want %d (%s)", id, got, want, lim)
				}
			}
			if lim := c.spec.Resources.Limits["cpu"]; lim != "" {
				quota := atoi(cgroupFile(t, c.pid, "cpu", "cpu.cfs_quota_us"))
				period := atoi(cgroupFile(t, c.pid, "cpu", "cpu.cfs_period_us"))
				if want := milliCPU(t, lim); period == 0 || quota*1000/period != want {
					t.Errorf("%s: cfs quota %d/%d us, want %dm (%s)", id, quota, period, want, lim)
				}
			}
			t.Logf("%s: uid %s, CapEff %s, NoNewPrivs %s, Seccomp %s, read-only root, limits %v as cgroup values",
				id, uids[1], st["CapEff"], st["NoNewPrivs"], st["Seccomp"], c.spec.Resources.Limits)
		}
	}
}

// rootReadOnly reports whether a process's / is mounted read-only.
func rootReadOnly(pid int) (bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return false, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && f[4] == "/" {
			return strings.Contains(","+f[5]+",", ",ro,"), nil
		}
	}
	return false, fmt.Errorf("no / in mountinfo")
}

func quantityBytes(t *testing.T, q string) int64 {
	t.Helper()
	for suf, mul := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if n, ok := strings.CutSuffix(q, suf); ok {
			return int64(atoi(n)) * mul
		}
	}
	t.Fatalf("quantity %q: unsupported unit", q)
	return 0
}

func milliCPU(t *testing.T, q string) int {
	t.Helper()
	if n, ok := strings.CutSuffix(q, "m"); ok {
		return atoi(n)
	}
	return atoi(q) * 1000
}

// testDisruptions: the preStop sleep keeps a deleted api pod serving
// while it leaves the Service's endpoints; the PDBs refuse an eviction
// that would take a second api pod or the one Redis away; readiness
// follows Redis.
func testDisruptions(t *testing.T) {
	kubectl(t, "-n", ns, "rollout", "status", "deploy/api", "--timeout=3m")

	// preStop: the container must live at least the sleep after deletion,
	// and its endpoint must be marked not ready at once.
	victim := containersOf(t, "api")[0]
	start := time.Now()
	kubectl(t, "-n", ns, "delete", "pod", victim.pod, "--wait=false")
	var notReadyAt time.Duration
	if err := poll(10*time.Second, func() error {
		out := kubectl(t, "-n", ns, "get", "endpointslices", "-l", "kubernetes.io/service-name=api", "-o",
			`jsonpath={range .items[*].endpoints[*]}{.targetRef.name}={.conditions.ready}{"\n"}{end}`)
		for _, l := range strings.Split(out, "\n") {
			if l == victim.pod+"=false" {
				notReadyAt = time.Since(start)
				return nil
			}
		}
		return fmt.Errorf("endpoint of %s still ready: %s", victim.pod, out)
	}); err != nil {
		t.Fatal(err)
	}
	for procAlive(victim.pid) && time.Since(start) < 40*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	exited := time.Since(start)
	figure(t, "preStop: deleted api pod out of the endpoints after %.1fs, its process exited %.1fs after deletion (preStop sleep 5s)",
		notReadyAt.Seconds(), exited.Seconds())
	if exited < 5*time.Second {
		t.Errorf("api container exited %.1fs after deletion, before the 5s preStop sleep ended", exited.Seconds())
	}
	if notReadyAt >= 5*time.Second {
		t.Errorf("endpoint left only %.1fs after deletion: the preStop sleep did not cover it", notReadyAt.Seconds())
	}
	kubectl(t, "-n", ns, "rollout", "status", "deploy/api", "--timeout=3m")

	// PDBs: with every api pod ready, one eviction is allowed and a
	// second at once is not; Redis (minAvailable 1 of 1) never.
	waitPDBAllowed(t, "api", 1)
	// Only pods not being deleted: a pod still terminating from the
	// stages before (its preStop sleep) is evicted without the budget
	// being asked, which made a second eviction "succeed".
	apis := livePodsOf(t, "api")
	if len(apis) < 2 {
		t.Fatalf("live api pods %v, want at least 2 for the PDB check", apis)
	}
	if code := evict(t, apis[0]); code != 201 {
		t.Fatalf("first api eviction: HTTP %d, want 201", code)
	}
	if code := evict(t, apis[1]); code != 429 {
		t.Fatalf("second api eviction at once: HTTP %d, want 429 (PDB maxUnavailable 1)", code)
	}
	if code := evict(t, "redis-0"); code != 429 {
		t.Fatalf("redis-0 eviction: HTTP %d, want 429 (PDB minAvailable 1)", code)
	}
	kubectl(t, "-n", ns, "rollout", "status", "deploy/api", "--timeout=3m")
	t.Log("PDB: one api eviction allowed, a second refused (429), redis-0 refused (429)")

	// Readiness follows Redis: with Redis gone the api pods leave the
	// Service, with it back they return; liveness does not restart them.
	kubectl(t, "-n", ns, "scale", "sts/redis", "--replicas=0")
	start = time.Now()
	if err := poll(60*time.Second, func() error { return readyCount(t, "api", 0) }); err != nil {
		t.Fatal(err)
	}
	figure(t, "readiness: api pods not ready %.1fs after Redis went away", time.Since(start).Seconds())
	kubectl(t, "-n", ns, "scale", "sts/redis", "--replicas=1")
	kubectl(t, "-n", ns, "rollout", "status", "sts/redis", "--timeout=3m")
	start = time.Now()
	kubectl(t, "-n", ns, "rollout", "status", "deploy/api", "--timeout=3m")
	if err := poll(60*time.Second, func() error { return readyCount(t, "api", 3) }); err != nil {
		t.Fatal(err)
	}
	figure(t, "readiness: api pods ready again %.1fs after Redis came back", time.Since(start).Seconds())
	restarts := kubectl(t, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=api", "-o", "jsonpath={.items[*].status.containerStatuses[*].restartCount}")
	for _, r := range strings.Fields(restarts) {
		if r != "0" {
			t.Errorf("an api container restarted while Redis was away (restart counts %s): liveness must not depend on Redis", restarts)
			break
		}
	}
}

func readyCount(t *testing.T, component string, want int) error {
	out := kubectl(t, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component="+component, "-o",
		`jsonpath={range .items[*]}{.metadata.deletionTimestamp}/{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if l == "/True" {
			n++
		}
	}
	if n != want {
		return fmt.Errorf("%d %s pods ready, want %d", n, component, want)
	}
	return nil
}

func waitPDBAllowed(t *testing.T, name string, want int) {
	t.Helper()
	if err := poll(2*time.Minute, func() error {
		got := atoi(kubectl(t, "-n", ns, "get", "pdb", name, "-o", "jsonpath={.status.disruptionsAllowed}"))
		if got != want {
			return fmt.Errorf("pdb %s allows %d disruptions, want %d", name, got, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// evict asks the API for an eviction of pod (what kubectl drain does) and
// returns the HTTP status.
func evict(t *testing.T, pod string) int {
	t.Helper()
	body := fmt.Sprintf(`{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":%q,"namespace":%q}}`, pod, ns)
	f := filepath.Join(t.TempDir(), "eviction.json")
	if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := kubectlErr("create", "--raw", "/api/v1/namespaces/"+ns+"/pods/"+pod+"/eviction", "-f", f)
	if err == nil {
		return 201
	}
	if strings.Contains(err.Error(), "TooManyRequests") || strings.Contains(err.Error(), "disruption budget") {
		return 429
	}
	t.Logf("eviction of %s: %v", pod, err)
	return 0
}

func procAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}
