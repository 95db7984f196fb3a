package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// up starts the cluster. If any step fails it tears down what it made,
// so a failed up leaves the host as it found it.
func up(ctx context.Context, e env, withKEDA bool) (err error) {
	if alive(e, "kube-apiserver") {
		return fmt.Errorf("a cluster is already running (state in %s); run down first", e.state)
	}
	// A run that was killed (CI's job cancelled, the machine restored from
	// a snapshot) can leave its bridge, state directory or processes
	// behind without a live API server; the next up would then fail on
	// "File exists". No cluster runs, so what is left is stale: down
	// removes it and restores the host from the state it saved.
	if left := leftovers(ctx, e); len(left) > 0 {
		fmt.Printf("cluster: an earlier run left %s behind; cleaning up first\n", strings.Join(left, ", "))
		if err := phase("down (leftovers)", func() error { return down(e) }); err != nil {
			return fmt.Errorf("clean up an earlier run's leftovers: %w", err)
		}
	}
	total := time.Now()
	defer func() {
		if err != nil {
			fmt.Fprintf(os.Stderr, "cluster up failed: %v\ncluster up: tearing down; logs are kept in %s\n", err, filepath.Join(e.cache, "last-logs"))
			if derr := down(e); derr != nil {
				fmt.Fprintln(os.Stderr, "cluster down:", derr)
			}
		}
	}()
	steps := []struct {
		name string
		f    func() error
	}{
		{"build", func() error { return build(ctx, e, withKEDA) }},
		{"host", func() error { return prepareHost(ctx, e) }},
		{"containerd", func() error { return startContainerd(ctx, e) }},
		{"control plane", func() error { return startControlPlane(ctx, e) }},
		{"node", func() error { return startNode(ctx, e) }},
		{"images", func() error { return images(ctx, e, withKEDA) }},
		{"addons", func() error { return addons(ctx, e, withKEDA) }},
	}
	for _, s := range steps {
		if err := phase(s.name, s.f); err != nil {
			return err
		}
	}
	fmt.Printf("cluster: up in %.1fs; %s\n", time.Since(total).Seconds(), "export KUBECONFIG="+e.kubeconfig())
	return nil
}

func prepareHost(ctx context.Context, e env) error {
	for _, d := range []string{"logs", "pids", "pki", "etcd", "cni", "kubelet", "containerd", "pv"} {
		if err := os.MkdirAll(e.path(d), 0o755); err != nil {
			return err
		}
	}
	if err := saveHost(ctx, e); err != nil {
		return err
	}
	if err := makePKI(e); err != nil {
		return err
	}
	return setupNetwork(ctx, e)
}

func startContainerd(ctx context.Context, e env) error {
	// restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, so runc
	// cannot lower a container's oom_score_adj below its own; without it
	// every pod fails with "can't get final child's PID from pipe: EOF".
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
`, e.path("containerd", "root"), e.path("containerd", "state"), e.containerdSock(), e.containerdSock()+".ttrpc",
		e.path("containerd", "opt"), pauseImage, e.path("cni", "net.d"))
	cfgPath := e.path("containerd", "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	if err := start(e, "containerd", "/usr/bin/containerd", "--config", cfgPath); err != nil {
		return err
	}
	return waitFor(ctx, "containerd", 30*time.Second, func() error {
		if !alive(e, "containerd") {
			return fmt.Errorf("exited; see %s", e.logFile("containerd"))
		}
		_, err := ctr(ctx, e, "version")
		return err
	})
}

func ctr(ctx context.Context, e env, args ...string) (string, error) {
	return output(ctx, "", "ctr", append([]string{"--address", e.containerdSock(), "--namespace", "k8s.io"}, args...)...)
}

func startControlPlane(ctx context.Context, e env) error {
	if err := start(e, "etcd", e.bin("etcd"),
		"--name=puzzleq-test",
		"--data-dir="+e.path("etcd"),
		"--listen-client-urls=http://"+etcdClient,
		"--advertise-client-urls=http://"+etcdClient,
		"--listen-peer-urls=http://"+etcdPeer,
		"--initial-advertise-peer-urls=http://"+etcdPeer,
		"--initial-cluster=puzzleq-test=http://"+etcdPeer,
		// A throwaway test cluster on a shared disk: fsync buys nothing.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	); err != nil {
		return err
	}
	if err := waitFor(ctx, "etcd", 60*time.Second, func() error {
		if !alive(e, "etcd") {
			return fmt.Errorf("exited; see %s", e.logFile("etcd"))
		}
		return httpGetOK(ctx, "http://"+etcdClient+"/health", nil)
	}); err != nil {
		return err
	}
	p := e.pki
	if err := start(e, "kube-apiserver", e.bin("kube-apiserver"),
		"--etcd-servers=http://"+etcdClient,
		"--bind-address="+nodeIP,
		"--advertise-address="+nodeIP,
		"--secure-port="+apiPort,
		"--service-cluster-ip-range="+serviceCIDR,
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--client-ca-file="+p("ca.crt"),
		"--kubelet-client-certificate="+p("apiserver-kubelet-client.crt"), "--kubelet-client-key="+p("apiserver-kubelet-client.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		// The aggregation layer, for KEDA's and metrics-server's APIs.
		"--requestheader-client-ca-file="+p("front-proxy-ca.crt"),
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file="+p("front-proxy-client.crt"), "--proxy-client-key-file="+p("front-proxy-client.key"),
		"--enable-aggregator-routing=true",
		// The node name is not in any DNS: the kubelet is reached by its IP.
		"--kubelet-preferred-address-types=InternalIP",
		"--profiling=false",
	); err != nil {
		return err
	}
	if err := waitFor(ctx, "kube-apiserver", 120*time.Second, func() error {
		if !alive(e, "kube-apiserver") {
			return fmt.Errorf("exited; see %s", e.logFile("kube-apiserver"))
		}
		_, err := kubectl(ctx, e, "get", "--raw", "/readyz")
		return err
	}); err != nil {
		return err
	}
	if err := start(e, "kube-controller-manager", e.bin("kube-controller-manager"),
		"--kubeconfig="+p("controller-manager.kubeconfig"),
		"--authentication-kubeconfig="+p("controller-manager.kubeconfig"),
		"--authorization-kubeconfig="+p("controller-manager.kubeconfig"),
		"--bind-address=127.0.0.1",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+p("sa.key"),
		"--root-ca-file="+p("ca.crt"),
		"--cluster-signing-cert-file="+p("ca.crt"), "--cluster-signing-key-file="+p("ca.key"),
		"--service-cluster-ip-range="+serviceCIDR,
	); err != nil {
		return err
	}
	if err := start(e, "kube-scheduler", e.bin("kube-scheduler"),
		"--kubeconfig="+p("scheduler.kubeconfig"),
		"--authentication-kubeconfig="+p("scheduler.kubeconfig"),
		"--authorization-kubeconfig="+p("scheduler.kubeconfig"),
		"--bind-address=127.0.0.1",
		"--leader-elect=false",
	); err != nil {
		return err
	}
	for _, c := range []struct{ name, url string }{
		{"kube-controller-manager", "https://127.0.0.1:10257/healthz"},
		{"kube-scheduler", "https://127.0.0.1:10259/healthz"},
	} {
		if err := waitFor(ctx, c.name, 90*time.Second, func() error {
			if !alive(e, c.name) {
				return fmt.Errorf("exited; see %s", e.logFile(c.name))
			}
			return httpGetOK(ctx, c.url, &tls.Config{InsecureSkipVerify: true})
		}); err != nil {
			return err
		}
	}
	return nil
}

func startNode(ctx context.Context, e env) error {
	resolv := e.path("kubelet", "resolv.conf")
	if err := os.WriteFile(resolv, nil, 0o644); err != nil {
		return err
	}
	// failCgroupV1 and cgroupfs: this VM has cgroup v1 only and no
	// systemd. The eviction thresholds are low because the disk is shared
	// with everything else on the machine.
	kubeletCfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%s
address: %s
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
clusterDNS: [%s]
resolvConf: %s
failSwapOn: false
rotateCertificates: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
syncFrequency: 10s
fileCheckFrequency: 0s
`, e.containerdSock(), nodeIP, e.pki("ca.crt"), nodeIP, resolv)
	cfgPath := e.path("kubelet", "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(kubeletCfg), 0o644); err != nil {
		return err
	}
	if err := start(e, "kubelet", e.bin("kubelet"),
		"--config="+cfgPath,
		"--kubeconfig="+e.pki("kubelet.kubeconfig"),
		"--root-dir="+e.path("kubelet", "root"),
		"--cert-dir="+e.path("kubelet", "pki"),
		"--hostname-override="+nodeName,
		"--node-ip="+nodeIP,
	); err != nil {
		return err
	}
	proxyCfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: %s}
hostnameOverride: %s
clusterCIDR: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["%s/32"]
conntrack: {maxPerCore: 0, min: 0}
iptables: {localhostNodePorts: false}
`, e.pki("kube-proxy.kubeconfig"), nodeName, podCIDR, nodeIP, nodeIP)
	proxyPath := e.path("kube-proxy.yaml")
	if err := os.WriteFile(proxyPath, []byte(proxyCfg), 0o644); err != nil {
		return err
	}
	if err := start(e, "kube-proxy", e.bin("kube-proxy"), "--config="+proxyPath); err != nil {
		return err
	}
	corefile := fmt.Sprintf(`.:53 {
    bind %s
    errors
    health 127.0.0.1:18180
    ready 127.0.0.1:18181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %s puzzleq-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
    loadbalance
}
`, nodeIP, e.kubeconfig())
	cf := e.path("Corefile")
	if err := os.WriteFile(cf, []byte(corefile), 0o644); err != nil {
		return err
	}
	if err := start(e, "coredns", e.bin("coredns"), "-conf", cf); err != nil {
		return err
	}
	if err := waitFor(ctx, "node Ready", 120*time.Second, func() error {
		for _, c := range []string{"kubelet", "kube-proxy", "coredns"} {
			if !alive(e, c) {
				return fmt.Errorf("%s exited; see %s", c, e.logFile(c))
			}
		}
		out, err := kubectl(ctx, e, "get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil {
			return err
		}
		if out != "True" {
			return fmt.Errorf("node Ready=%q", out)
		}
		return nil
	}); err != nil {
		return err
	}
	return waitFor(ctx, "coredns ready", 60*time.Second, func() error {
		return httpGetOK(ctx, "http://127.0.0.1:18181/ready", nil)
	})
}

// httpGetOK GETs url and wants a 200.
func httpGetOK(ctx context.Context, url string, tlsCfg *tls.Config) error {
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// addons installs what every overlay needs from the cluster besides
// Kubernetes itself: volumes for Redis's claims (there is no dynamic
// provisioner), KEDA's CRDs (prod's ScaledObject), and, with -keda,
// KEDA itself.
func addons(ctx context.Context, e env, withKEDA bool) error {
	var pvs strings.Builder
	for i := 0; i < 3; i++ {
		dir := e.path("pv", fmt.Sprint(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		// Redis runs as 999; a hostPath volume does not get fsGroup.
		if err := os.Chown(dir, 999, 999); err != nil {
			return err
		}
		fmt.Fprintf(&pvs, `---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: puzzleq-test-%d
  labels: {puzzleq.test/pv: "true"}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: %s, type: Directory}
`, i, dir)
	}
	if err := applyStdin(ctx, e, pvs.String()); err != nil {
		return err
	}
	if err := installKEDACRDs(ctx, e); err != nil {
		return err
	}
	if withKEDA {
		return installKEDA(ctx, e)
	}
	return nil
}

func applyStdin(ctx context.Context, e env, manifest string) error {
	f := e.path("apply.yaml")
	if err := os.WriteFile(f, []byte(manifest), 0o644); err != nil {
		return err
	}
	_, err := kubectl(ctx, e, "apply", "-f", f)
	return err
}

// leftovers names what an earlier run left on the host: the bridge, the
// state directory, a process of it.
func leftovers(ctx context.Context, e env) []string {
	var left []string
	if _, err := output(ctx, "", "ip", "link", "show", bridgeName); err == nil {
		left = append(left, "bridge "+bridgeName)
	}
	if _, err := os.Stat(e.state); err == nil {
		left = append(left, "state directory "+e.state)
	}
	return left
}
