package deploy_test

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/hasher"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
	"sigs.k8s.io/yaml"
)

// render builds a kustomization directory, as `kubectl kustomize` does,
// into its objects.
func render(dir string) ([]map[string]any, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// scaledObject is KEDA's keda.sh/v1alpha1 ScaledObject, the fields we use.
type scaledObject struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion,omitempty"`
			Kind       string `json:"kind,omitempty"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		PollingInterval *int32 `json:"pollingInterval,omitempty"`
		CooldownPeriod  *int32 `json:"cooldownPeriod,omitempty"`
		Advanced        *struct {
			HorizontalPodAutoscalerConfig *struct {
				Name     string                                         `json:"name,omitempty"`
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
			} `json:"horizontalPodAutoscalerConfig,omitempty"`
			RestoreToOriginalReplicaCount bool `json:"restoreToOriginalReplicaCount,omitempty"`
		} `json:"advanced,omitempty"`
		MinReplicaCount *int32 `json:"minReplicaCount,omitempty"`
		MaxReplicaCount *int32 `json:"maxReplicaCount,omitempty"`
		Triggers        []struct {
			Type     string            `json:"type"`
			Name     string            `json:"name,omitempty"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// backlogKey is the sorted set with one member per 50 batch units not yet
// queued, under KEY_PREFIX (docs/batches.md, "Keys").
const backlogKey = "backlog"

// kedaRedisKeys are the metadata keys of KEDA's redis (list) scaler.
var kedaRedisKeys = set([]string{"address", "addressFromEnv", "host", "hostFromEnv", "port", "portFromEnv",
	"listName", "listLength", "activationListLength", "databaseIndex", "enableTLS", "unsafeSsl",
	"username", "usernameFromEnv", "passwordFromEnv"})

// bundle is a rendered overlay decoded into typed objects.
type bundle struct {
	namespaces   []corev1.Namespace
	configMaps   map[string]corev1.ConfigMap
	deployments  []appsv1.Deployment
	statefulSets []appsv1.StatefulSet
	services     []corev1.Service
	pdbs         []policyv1.PodDisruptionBudget
	netpols      []networkingv1.NetworkPolicy
	hpas         []autoscalingv2.HorizontalPodAutoscaler
	scaled       []scaledObject
	jobs         []batchv1.Job
	pvcs         []corev1.PersistentVolumeClaim
}

// workload is a Deployment's or StatefulSet's pod template.
type workload struct {
	kind, name string
	replicas   *int32
	pod        corev1.PodTemplateSpec
}

func (b *bundle) workloads() []workload {
	var out []workload
	for _, d := range b.deployments {
		out = append(out, workload{"Deployment", d.Name, d.Spec.Replicas, d.Spec.Template})
	}
	for _, s := range b.statefulSets {
		out = append(out, workload{"StatefulSet", s.Name, s.Spec.Replicas, s.Spec.Template})
	}
	return out
}

// configMap returns the ConfigMap a configMapGenerator named name made:
// its name is name, a dash and the hash of its data.
func (b *bundle) configMap(name string) (corev1.ConfigMap, bool) {
	for n, cm := range b.configMaps {
		if base, _, ok := cutHash(n); ok && base == name {
			return cm, true
		}
	}
	return corev1.ConfigMap{}, false
}

// cutHash splits a generated name into its generator's name and the
// 10-character hash suffix kustomize puts after it.
func cutHash(name string) (base, hash string, ok bool) {
	i := strings.LastIndexByte(name, '-')
	if i <= 0 || len(name)-i-1 != 10 {
		return name, "", false
	}
	return name[:i], name[i+1:], true
}

// contentHashed reports whether a rendered ConfigMap's name ends in the
// hash kustomize computes from its data, so that every reference to it,
// and with them the pod templates, change when its data does.
func contentHashed(o map[string]any) bool {
	meta, _ := o["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	base, suffix, ok := cutHash(name)
	if !ok {
		return false
	}
	n, err := kyaml.FromMap(o)
	if err != nil {
		return false
	}
	if err := n.SetName(base); err != nil {
		return false
	}
	h, err := (&hasher.Hasher{}).Hash(n)
	return err == nil && h == suffix
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// decodeStrict decodes every object into its k8s.io/api type, failing on
// unknown or misspelt fields and on unexpected apiVersions.
func decodeStrict(objs []map[string]any) (*bundle, []string) {
	b := &bundle{configMaps: map[string]corev1.ConfigMap{}}
	var problems []string
	for _, o := range objs {
		data, err := yaml.Marshal(o)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		kind, _ := o["kind"].(string)
		apiVersion, _ := o["apiVersion"].(string)
		meta, _ := o["metadata"].(map[string]any)
		id := fmt.Sprintf("%s/%v", kind, meta["name"])
		want := map[string]string{
			"Namespace": "v1", "ConfigMap": "v1", "Service": "v1", "Deployment": "apps/v1", "StatefulSet": "apps/v1",
			"PodDisruptionBudget": "policy/v1", "NetworkPolicy": "networking.k8s.io/v1",
			"HorizontalPodAutoscaler": "autoscaling/v2", "ScaledObject": "keda.sh/v1alpha1",
			"Job": "batch/v1", "PersistentVolumeClaim": "v1",
		}[kind]
		if want == "" {
			problems = append(problems, fmt.Sprintf("%s: kind the checks do not know", id))
			continue
		}
		if apiVersion != want {
			problems = append(problems, fmt.Sprintf("%s: apiVersion %q, want %q", id, apiVersion, want))
			continue
		}
		var target any
		switch kind {
		case "Namespace":
			b.namespaces = append(b.namespaces, corev1.Namespace{})
			target = &b.namespaces[len(b.namespaces)-1]
		case "ConfigMap":
			target = &corev1.ConfigMap{}
		case "Service":
			b.services = append(b.services, corev1.Service{})
			target = &b.services[len(b.services)-1]
		case "Deployment":
			b.deployments = append(b.deployments, appsv1.Deployment{})
			target = &b.deployments[len(b.deployments)-1]
		case "StatefulSet":
			b.statefulSets = append(b.statefulSets, appsv1.StatefulSet{})
			target = &b.statefulSets[len(b.statefulSets)-1]
		case "PodDisruptionBudget":
			b.pdbs = append(b.pdbs, policyv1.PodDisruptionBudget{})
			target = &b.pdbs[len(b.pdbs)-1]
		case "NetworkPolicy":
			b.netpols = append(b.netpols, networkingv1.NetworkPolicy{})
			target = &b.netpols[len(b.netpols)-1]
		case "HorizontalPodAutoscaler":
			b.hpas = append(b.hpas, autoscalingv2.HorizontalPodAutoscaler{})
			target = &b.hpas[len(b.hpas)-1]
		case "ScaledObject":
			b.scaled = append(b.scaled, scaledObject{})
			target = &b.scaled[len(b.scaled)-1]
		case "Job":
			b.jobs = append(b.jobs, batchv1.Job{})
			target = &b.jobs[len(b.jobs)-1]
		case "PersistentVolumeClaim":
			b.pvcs = append(b.pvcs, corev1.PersistentVolumeClaim{})
			target = &b.pvcs[len(b.pvcs)-1]
		}
		if err := yaml.UnmarshalStrict(data, target); err != nil {
			problems = append(problems, fmt.Sprintf("%s: strict decoding: %v", id, err))
			continue
		}
		if cm, ok := target.(*corev1.ConfigMap); ok {
			b.configMaps[cm.Name] = *cm
		}
	}
	return b, problems
}

// expect is what an overlay must produce.
type expect struct {
	dir         string
	api, worker int32  // replicas; worker 0: unset, the autoscaler owns it
	autoscaler  string // "", "keda" or "hpa"
	// components are added to the overlay's kustomization, as an
	// operator opts into them (deploy/k8s/components/NAME).
	components []string
}

var overlays = []expect{
	{"deploy/k8s/base", 2, 3, "", nil},
	{"deploy/k8s/overlays/dev", 1, 1, "", nil},
	{"deploy/k8s/overlays/prod", 3, 0, "keda", nil},
	{"deploy/k8s/overlays/prod-hpa", 3, 0, "hpa", nil},
	{"deploy/k8s/overlays/dev", 1, 1, "", []string{"pdb78"}},
	{"deploy/k8s/overlays/prod", 3, 0, "keda", []string{"pdb78"}},
	{"deploy/k8s/overlays/prod-hpa", 3, 0, "hpa", []string{"pdb78"}},
	{"deploy/k8s/overlays/prod", 3, 0, "keda", []string{"tracing"}},
}

// name is the overlay and the components it is rendered with.
func (e expect) name() string {
	if len(e.components) == 0 {
		return e.dir
	}
	return e.dir + "+" + strings.Join(e.components, "+")
}

// graceMargin is the least time a pod's grace period must leave after
// its preStop hook and its process's DRAIN_TIME and SHUTDOWN_TIMEOUT.
const graceMargin = 5 * time.Second

// checkK8s decodes and checks a rendered overlay; it returns every
// problem found.
func checkK8s(f *facts, e expect, objs []map[string]any) []string {
	b, problems := decodeStrict(objs)
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	// One namespace, holding everything else.
	if len(b.namespaces) != 1 {
		bad("%d Namespaces, want 1", len(b.namespaces))
		return problems
	}
	ns := b.namespaces[0].Name
	for _, o := range objs {
		meta, _ := o["metadata"].(map[string]any)
		if o["kind"] != "Namespace" && meta["namespace"] != ns {
			bad("%s/%v: namespace %v, want %s", o["kind"], meta["name"], meta["namespace"], ns)
		}
		// Pods read their settings at start: a ConfigMap whose name does
		// not change with its data leaves them on the old values.
		if o["kind"] == "ConfigMap" && !contentHashed(o) {
			bad("ConfigMap/%v: its name carries no hash of its data (make it with a configMapGenerator), so a changed setting would not roll the pods that read it", meta["name"])
		}
	}

	var images []string
	workloads := b.workloads()
	byComponent := map[string]workload{}
	for _, w := range workloads {
		byComponent[w.pod.Labels["app.kubernetes.io/component"]] = w
		id := w.kind + "/" + w.name
		spec := w.pod.Spec
		for _, c := range spec.InitContainers {
			cid := id + " init container " + c.Name
			checkResources(cid, c, bad)
			checkSecurity(cid, spec.SecurityContext, c, bad)
			images = append(images, c.Image)
			checkTool(f, cid, c, bad)
		}
		for _, c := range spec.Containers {
			cid := id + " container " + c.Name
			checkResources(cid, c, bad)
			checkSecurity(cid, spec.SecurityContext, c, bad)
			if strings.HasPrefix(c.Image, "redis:") {
				checkRedis(cid, w, c, bad)
				continue
			}
			images = append(images, c.Image)
			checkApp(f, b, cid, w, c, bad)
		}
	}
	for _, j := range b.jobs {
		spec := j.Spec.Template.Spec
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			cid := "Job/" + j.Name + " container " + c.Name
			checkResources(cid, c, bad)
			checkSecurity(cid, spec.SecurityContext, c, bad)
			images = append(images, c.Image)
			checkTool(f, cid, c, bad)
		}
		if ptrOr(spec.AutomountServiceAccountToken, true) {
			bad("Job/%s: automountServiceAccountToken is not false", j.Name)
		}
	}
	for _, comp := range []string{"api", "worker", "redis"} {
		if _, ok := byComponent[comp]; !ok {
			bad("no workload with app.kubernetes.io/component=%s", comp)
		}
	}
	if w := byComponent["api"]; ptrOr(w.replicas, 1) != e.api {
		bad("Deployment/api: %d replicas, want %d", ptrOr(w.replicas, 1), e.api)
	}
	switch w := byComponent["worker"]; {
	case e.worker == 0 && w.replicas != nil:
		bad("Deployment/worker: sets replicas %d, which the autoscaler owns (kubectl apply would reset it)", *w.replicas)
	case e.worker != 0 && ptrOr(w.replicas, 1) != e.worker:
		bad("Deployment/worker: %d replicas, want %d", ptrOr(w.replicas, 1), e.worker)
	}

	// One image, with a real tag, for every puzzleq container.
	slices.Sort(images)
	images = slices.Compact(images)
	if len(images) != 1 {
		bad("puzzleq containers use %d images %v, want one", len(images), images)
	} else if i := strings.LastIndex(images[0], ":"); i < 0 || strings.Contains(images[0][i:], "/") ||
		images[0][i+1:] == "latest" {
		bad("image %s: give it a version tag", images[0])
	}

	// Services select pods, and their target ports are the pods' ports.
	for _, s := range b.services {
		id := "Service/" + s.Name
		if len(s.Spec.Selector) == 0 {
			bad("%s: no selector", id)
			continue
		}
		var matched []workload
		for _, w := range workloads {
			if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(w.pod.Labels)) {
				matched = append(matched, w)
			}
		}
		if len(matched) == 0 {
			bad("%s: selector %v matches no pod template", id, s.Spec.Selector)
			continue
		}
		for _, p := range s.Spec.Ports {
			for _, w := range matched {
				if _, ok := containerPort(w.pod.Spec.Containers, p.TargetPort); !ok {
					bad("%s: targetPort %s is not a port of %s/%s", id, p.TargetPort.String(), w.kind, w.name)
				}
			}
		}
	}

	// Every workload is covered by exactly one PodDisruptionBudget.
	for _, w := range workloads {
		n := 0
		for _, p := range b.pdbs {
			if selects(p.Spec.Selector, w.pod.Labels) {
				n++
			}
		}
		if n != 1 {
			bad("%s/%s: covered by %d PodDisruptionBudgets, want 1", w.kind, w.name, n)
		}
	}
	for _, p := range b.pdbs {
		if !slices.ContainsFunc(workloads, func(w workload) bool { return selects(p.Spec.Selector, w.pod.Labels) }) {
			bad("PodDisruptionBudget/%s: selects no pod template", p.Name)
		}
	}

	checkNetworkPolicies(b, byComponent, bad)
	checkPDBVolume(f, b, byComponent["worker"], bad)
	checkAutoscaling(f, b, e, ns, byComponent, bad)
	return problems
}

func selects(sel *metav1.LabelSelector, l map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && !s.Empty() && s.Matches(labels.Set(l))
}

func checkResources(id string, c corev1.Container, bad func(string, ...any)) {
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
			bad("%s: no %s request", id, r)
		}
		if q, ok := c.Resources.Limits[r]; !ok || q.IsZero() {
			bad("%s: no %s limit", id, r)
		}
	}
}

func checkSecurity(id string, pod *corev1.PodSecurityContext, c corev1.Container, bad func(string, ...any)) {
	sc := c.SecurityContext
	if sc == nil {
		bad("%s: no securityContext", id)
		return
	}
	nonRoot := sc.RunAsNonRoot
	if nonRoot == nil && pod != nil {
		nonRoot = pod.RunAsNonRoot
	}
	if !ptrOr(nonRoot, false) {
		bad("%s: runAsNonRoot is not true", id)
	}
	if !ptrOr(sc.ReadOnlyRootFilesystem, false) {
		bad("%s: readOnlyRootFilesystem is not true", id)
	}
	if ptrOr(sc.AllowPrivilegeEscalation, true) {
		bad("%s: allowPrivilegeEscalation is not false", id)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		len(sc.Capabilities.Add) != 0 {
		bad("%s: capabilities must drop ALL and add none", id)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && pod != nil {
		seccomp = pod.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		bad("%s: seccompProfile is not RuntimeDefault", id)
	}
}

// containerEnv is a container's environment: its envFrom ConfigMaps, then
// its env.
func containerEnv(b *bundle, id string, c corev1.Container, bad func(string, ...any)) map[string]string {
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			bad("%s: envFrom other than a ConfigMap", id)
			continue
		}
		cm, ok := b.configMaps[from.ConfigMapRef.Name]
		if !ok {
			bad("%s: envFrom ConfigMap %s does not exist", id, from.ConfigMapRef.Name)
			continue
		}
		for k, v := range cm.Data {
			env[from.Prefix+k] = v
		}
	}
	for _, v := range c.Env {
		env[v.Name] = v.Value
	}
	return env
}

// secretFileOf returns the Secret that provides file to container c of
// w, through a volume mount of a secret volume, or "".
func secretFileOf(w workload, c corev1.Container, file string) string {
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range w.pod.Spec.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			if len(v.Secret.Items) == 0 {
				return v.Secret.SecretName
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					return v.Secret.SecretName
				}
			}
		}
	}
	return ""
}

// containerPort resolves a probe's or Service's port to a container port.
func containerPort(cs []corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, c := range cs {
		for _, cp := range c.Ports {
			if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

func addrPort(addr string) int32 {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return -1
	}
	return int32(n)
}

// goRuntimeEnv are the settings the Go runtime reads itself, which a
// container may set besides the binary's own.
var goRuntimeEnv = set([]string{"GOMEMLIMIT", "GOGC", "GOMAXPROCS"})

// checkApp checks a puzzleq container against the binary it runs.
func checkApp(f *facts, b *bundle, id string, w workload, c corev1.Container, bad func(string, ...any)) {
	if len(c.Command) == 0 {
		bad("%s: no command: name the binary", id)
		return
	}
	bin := path.Base(c.Command[0])
	if path.Dir(c.Command[0]) != f.binDir || !f.binaries[bin] {
		bad("%s: command %s is not a binary of the image (%s/%v)", id, c.Command[0], f.binDir, keys(f.binaries))
		return
	}
	known := f.envKnown(bin)
	if known == nil {
		bad("%s: %s is not a server binary", id, bin)
		return
	}
	if comp := w.pod.Labels["app.kubernetes.io/component"]; comp != bin {
		bad("%s: runs %s but is labelled component=%s", id, bin, comp)
	}
	env := containerEnv(b, id, c, bad)
	for _, k := range keys(env) {
		if !known[k] && !goRuntimeEnv[k] {
			bad("%s: sets %s, which the %s does not read", id, k, bin)
		}
	}
	if bin == "api" {
		if file, ok := env["API_KEYS_FILE"]; !ok {
			bad("%s: no API_KEYS_FILE: the api would serve every route without auth", id)
		} else if secret := secretFileOf(w, c, file); secret == "" {
			bad("%s: API_KEYS_FILE %s is not a file of a mounted Secret", id, file)
		} else {
			// The Secret is the operator's to create; the binary reads it
			// at start, so check the configuration with a valid one.
			env["API_KEYS_FILE"] = f.exampleKeysFile
		}
	}
	cfg, err := f.load[bin](env)
	if err != nil {
		bad("%s: the %s rejects its configuration: %v", id, bin, err)
		return
	}
	port := addrPort(cfg.HTTPAddr)
	scrapePort := port
	if cfg.MetricsAddr != "" {
		scrapePort = addrPort(cfg.MetricsAddr)
		if _, ok := containerPort([]corev1.Container{c}, intstr.FromInt32(scrapePort)); !ok {
			bad("%s: METRICS_ADDR port %d is not a container port", id, scrapePort)
		}
	}

	// Probes: GETs of paths the binary serves, on the port it listens on.
	probe := func(kind string, p *corev1.Probe) {
		if p == nil || p.HTTPGet == nil {
			bad("%s: no HTTP %s probe", id, kind)
			return
		}
		if !f.serves(bin, p.HTTPGet.Path) {
			bad("%s: %s probe path %s is not served by the %s", id, kind, p.HTTPGet.Path, bin)
		}
		if cp, ok := containerPort([]corev1.Container{c}, p.HTTPGet.Port); !ok || cp != port {
			bad("%s: %s probe port %s is not the %s's HTTP_ADDR port %d", id, kind, p.HTTPGet.Port.String(), bin, port)
		}
	}
	probe("readiness", c.ReadinessProbe)
	probe("liveness", c.LivenessProbe)
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		bad("%s: readiness probe %s, want /readyz (it fails while draining and when Redis is down)", id, c.ReadinessProbe.HTTPGet.Path)
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
		bad("%s: liveness probe %s, want /healthz (a Redis outage must not restart pods)", id, c.LivenessProbe.HTTPGet.Path)
	}

	// Prometheus scrapes the binary's /metrics on its port.
	ann := w.pod.Annotations
	if ann["prometheus.io/scrape"] != "true" {
		bad("%s/%s: no prometheus.io/scrape annotation", w.kind, w.name)
	}
	if p := ann["prometheus.io/path"]; !f.serves(bin, p) {
		bad("%s/%s: prometheus.io/path %q is not served by the %s", w.kind, w.name, p, bin)
	}
	if p := ann["prometheus.io/port"]; p != strconv.Itoa(int(scrapePort)) {
		bad("%s/%s: prometheus.io/port %q, want the /metrics port %d (METRICS_ADDR, else HTTP_ADDR)", w.kind, w.name, p, scrapePort)
	}

	// The grace period covers the preStop hook, DRAIN_TIME, SHUTDOWN_TIMEOUT
	// and a margin.
	grace := time.Duration(ptrOr(w.pod.Spec.TerminationGracePeriodSeconds, 30)) * time.Second
	var preStop time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		if c.Lifecycle.PreStop.Sleep == nil {
			bad("%s: preStop other than sleep (the image has no shell)", id)
		} else {
			preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
		}
	}
	if need := preStop + cfg.DrainTime + cfg.ShutdownTimeout + graceMargin; grace < need {
		bad("%s: terminationGracePeriodSeconds %s is below preStop %s + DRAIN_TIME %s + SHUTDOWN_TIMEOUT %s + margin %s",
			id, grace, preStop, cfg.DrainTime, cfg.ShutdownTimeout, graceMargin)
	}
}

// redisArgs returns the --name value pairs of a redis-server command line.
func redisArgs(argv []string) map[string]string {
	m := map[string]string{}
	for i := 0; i < len(argv); i++ {
		if strings.HasPrefix(argv[i], "--") && i+1 < len(argv) {
			m[strings.TrimPrefix(argv[i], "--")] = argv[i+1]
			i++
		}
	}
	return m
}

func checkRedis(id string, w workload, c corev1.Container, bad func(string, ...any)) {
	if !strings.HasPrefix(c.Image, "redis:7") {
		bad("%s: image %s, want Redis 7", id, c.Image)
	}
	if w.kind != "StatefulSet" {
		bad("%s: Redis runs in a %s, want a StatefulSet", id, w.kind)
	}
	args := redisArgs(append(slices.Clone(c.Command), c.Args...))
	for k, v := range map[string]string{"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"} {
		if args[k] != v {
			bad("%s: --%s %q, want %q", id, k, args[k], v)
		}
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	if dir := args["dir"]; dir == "" || mounts[dir] == "" {
		bad("%s: --dir %q is not a mounted volume", id, dir)
	}
	if mounts["/tmp"] == "" {
		bad("%s: no volume on /tmp (the root filesystem is read-only)", id)
	}
}

// checkNetworkPolicies: only the API and the workers (and, namespaced and
// named, an operator such as KEDA) reach Redis.
func checkNetworkPolicies(b *bundle, byComponent map[string]workload, bad func(string, ...any)) {
	redis, api, worker := byComponent["redis"], byComponent["api"], byComponent["worker"]
	allowed := map[string]bool{}
	var redisPolicies int
	for _, np := range b.netpols {
		if !selects(&np.Spec.PodSelector, redis.pod.Labels) {
			continue
		}
		redisPolicies++
		for _, rule := range np.Spec.Ingress {
			if len(rule.From) == 0 {
				bad("NetworkPolicy/%s: lets every pod reach Redis", np.Name)
			}
			for _, peer := range rule.From {
				switch {
				case peer.IPBlock != nil:
					bad("NetworkPolicy/%s: lets an IP block reach Redis", np.Name)
				case peer.NamespaceSelector != nil:
					if len(peer.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]) == 0 ||
						peer.PodSelector == nil || len(peer.PodSelector.MatchLabels) == 0 {
						bad("NetworkPolicy/%s: a namespace peer must name its namespace and pods", np.Name)
					}
				default:
					for comp, w := range byComponent {
						if selects(peer.PodSelector, w.pod.Labels) {
							if comp != "api" && comp != "worker" {
								bad("NetworkPolicy/%s: lets %s pods reach Redis", np.Name, comp)
							}
							allowed[comp] = true
						}
					}
					if peer.PodSelector == nil || len(peer.PodSelector.MatchLabels)+len(peer.PodSelector.MatchExpressions) == 0 {
						bad("NetworkPolicy/%s: an empty podSelector lets every pod reach Redis", np.Name)
					}
				}
			}
		}
	}
	if redisPolicies == 0 {
		bad("no NetworkPolicy selects the Redis pods")
	}
	for _, w := range []workload{api, worker} {
		if !allowed[w.pod.Labels["app.kubernetes.io/component"]] {
			bad("%s/%s: no NetworkPolicy lets it reach Redis", w.kind, w.name)
		}
	}
}

func checkAutoscaling(f *facts, b *bundle, e expect, ns string, byComponent map[string]workload,
	bad func(string, ...any)) {
	got := ""
	switch {
	case len(b.scaled) > 0 && len(b.hpas) > 0:
		got = "keda+hpa"
	case len(b.scaled) > 0:
		got = "keda"
	case len(b.hpas) > 0:
		got = "hpa"
	}
	if got != e.autoscaler {
		bad("autoscaling %q, want %q", got, e.autoscaler)
	}
	worker := byComponent["worker"]
	for _, h := range b.hpas {
		if h.Spec.ScaleTargetRef.Kind != worker.kind || h.Spec.ScaleTargetRef.Name != worker.name {
			bad("HorizontalPodAutoscaler/%s: scales %s/%s, not the workers", h.Name, h.Spec.ScaleTargetRef.Kind, h.Spec.ScaleTargetRef.Name)
		}
		if ptrOr(h.Spec.MinReplicas, 1) < 1 || h.Spec.MaxReplicas < ptrOr(h.Spec.MinReplicas, 1) {
			bad("HorizontalPodAutoscaler/%s: bad replica range", h.Name)
		}
		if len(h.Spec.Metrics) != 1 || h.Spec.Metrics[0].Resource == nil || h.Spec.Metrics[0].Resource.Name != corev1.ResourceCPU {
			bad("HorizontalPodAutoscaler/%s: want one CPU metric", h.Name)
		}
	}
	if len(b.scaled) == 0 {
		return
	}
	// The Redis address KEDA dials is the Redis Service, by its cluster
	// name, on the database REDIS_URL names.
	var redisSvc corev1.Service
	for _, s := range b.services {
		if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(byComponent["redis"].pod.Labels)) {
			redisSvc = s
		}
	}
	wantAddr := ""
	if len(redisSvc.Spec.Ports) > 0 {
		wantAddr = fmt.Sprintf("%s.%s.svc.cluster.local:%d", redisSvc.Name, ns, redisSvc.Spec.Ports[0].Port)
	}
	wantDB, prefix := "0", "pq:"
	if cm, ok := b.configMap("puzzleq-config"); ok {
		if u, err := url.Parse(cm.Data["REDIS_URL"]); err == nil && strings.Trim(u.Path, "/") != "" {
			wantDB = strings.Trim(u.Path, "/")
		}
		if p := cm.Data["KEY_PREFIX"]; p != "" {
			prefix = p
		}
	}
	for _, so := range b.scaled {
		id := "ScaledObject/" + so.Metadata.Name
		ref := so.Spec.ScaleTargetRef
		if ref.Name != worker.name || (ref.Kind != "" && ref.Kind != worker.kind) {
			bad("%s: scales %s/%s, not the workers", id, ref.Kind, ref.Name)
		}
		lo, hi := ptrOr(so.Spec.MinReplicaCount, 0), ptrOr(so.Spec.MaxReplicaCount, 100)
		if so.Spec.MinReplicaCount == nil || so.Spec.MaxReplicaCount == nil || lo < 1 || hi < lo {
			bad("%s: want minReplicaCount >= 1 and maxReplicaCount >= it, got %d and %d", id, lo, hi)
		}
		// KEDA's cooldownPeriod governs only the step from 1 to 0; above
		// minReplicaCount the HPA KEDA manages scales down after its own
		// stabilization window, which the ScaledObject must state.
		if lo == 0 && ptrOr(so.Spec.CooldownPeriod, 0) <= 0 {
			bad("%s: minReplicaCount 0 and no cooldownPeriod", id)
		}
		// KEDA's admission webhook warns about both, which fails
		// `kubectl apply --warnings-as-errors` (test/k8s).
		if lo > 0 && (so.Spec.CooldownPeriod != nil || so.Spec.PollingInterval != nil) {
			bad("%s: cooldownPeriod or pollingInterval set with minReplicaCount %d: KEDA ignores them for scaling and warns", id, lo)
		}
		if a := so.Spec.Advanced; a == nil || a.HorizontalPodAutoscalerConfig == nil || a.HorizontalPodAutoscalerConfig.Behavior == nil ||
			a.HorizontalPodAutoscalerConfig.Behavior.ScaleDown == nil || a.HorizontalPodAutoscalerConfig.Behavior.ScaleDown.StabilizationWindowSeconds == nil {
			bad("%s: no advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.stabilizationWindowSeconds: the scale-down delay would be the HPA's unstated default", id)
		}
		var lists []string
		for _, tr := range so.Spec.Triggers {
			if tr.Type != "redis" {
				bad("%s: trigger type %q, want redis", id, tr.Type)
				continue
			}
			for k := range tr.Metadata {
				if !kedaRedisKeys[k] {
					bad("%s: unknown redis trigger field %q", id, k)
				}
			}
			if tr.Metadata["address"] != wantAddr {
				bad("%s: address %q, want the Redis Service %q", id, tr.Metadata["address"], wantAddr)
			}
			if db := tr.Metadata["databaseIndex"]; db != wantDB {
				bad("%s: databaseIndex %q, want REDIS_URL's %q", id, db, wantDB)
			}
			if n, err := strconv.Atoi(tr.Metadata["listLength"]); err != nil || n < 1 {
				bad("%s: listLength %q must be a positive number", id, tr.Metadata["listLength"])
			}
			lists = append(lists, tr.Metadata["listName"])
		}
		// The feeder keeps the bulk queue shallow (docs/batches.md,
		// "Fairness"), so the waiting units of a large batch are counted
		// by the backlog, a sorted set KEDA's redis scaler reads with
		// ZCARD; expensive work parked over its key's cap waits in each
		// queue's retry set, another sorted set.
		want := []string{prefix + backlogKey}
		for _, q := range keys(f.pendingKey) {
			want = append(want, f.pendingKey[q], f.retryKey[q])
		}
		sort.Strings(lists)
		sort.Strings(want)
		if !slices.Equal(lists, want) {
			bad("%s: triggers on lists %v, want each queue's pending list and retry set, and the backlog %v", id, lists, want)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func overlayDir(dir string) string { return filepath.Join(root, filepath.FromSlash(dir)) }
