// Command cluster runs puzzleq's one-node test Kubernetes cluster on this
// machine, offline: the control plane, kubelet, kube-proxy, etcd and
// CoreDNS are built from the Go module proxy (see ../kube, ../coredns and
// ../keda), containerd, runc and the CNI plugins come from Debian, and the
// images are packed from the current checkout, so no registry is needed.
//
//	cluster build                 build every binary into the cache
//	cluster up [-keda]            start the cluster (tears down again if it fails)
//	cluster keda                  build, import and install KEDA on a running cluster
//	cluster images                rebuild and import the images from the checkout
//	cluster check                 server-side dry run of every overlay
//	cluster deploy OVERLAY        apply deploy/k8s/overlays/OVERLAY and wait for Ready
//	cluster down                  stop everything and restore the host
//	cluster env                   print the environment for kubectl
//	cluster kubectl ARGS...       run the cluster's kubectl
//
// Everything the cluster changes on the host is undone by down: the bridge
// and its route, the iptables chains, the sysctls (ip_forward among them),
// the mounts, cgroups and network namespaces of the pods, and the state
// directory. The CNI configuration never leaves the state directory. The
// pod and service ranges live on one bridge with no masquerading, and a
// mangle-table rule drops anything forwarded between the bridge and any
// other interface, so no packet from the cluster leaves the machine.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// The cluster's fixed addresses. The ranges are uncommon private ones so
// that they do not meet a network this machine already has.
const (
	bridgeName  = "pzq0"
	nodeIP      = "10.217.0.1" // the bridge's address: API server, kubelet, DNS
	podCIDR     = "10.217.0.0/16"
	serviceCIDR = "10.218.0.0/16"
	kubeSvcIP   = "10.218.0.1" // the "kubernetes" Service
	nodeName    = "pzq-node"
	apiPort     = "6443"
	etcdClient  = "127.0.0.1:23790"
	etcdPeer    = "127.0.0.1:23800"
	pauseImage  = "puzzleq.test/pause:1"
	kubeVersion = "v1.37.2"
)

// env holds the directories the driver works in.
type env struct {
	repo  string // the puzzleq checkout whose images and manifests are used
	tools string // test/k8s/tools in that checkout
	cache string // binaries, kept across runs so a warm start is quick
	state string // everything of one running cluster; removed by down
}

func (e env) bin(name string) string     { return filepath.Join(e.cache, "bin", name) }
func (e env) path(p ...string) string    { return filepath.Join(append([]string{e.state}, p...)...) }
func (e env) kubeconfig() string         { return e.path("pki", "admin.kubeconfig") }
func (e env) containerdSock() string     { return e.path("containerd.sock") }
func (e env) pki(name string) string     { return e.path("pki", name) }
func (e env) logFile(name string) string { return e.path("logs", name+".log") }

func main() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: cluster build [-keda]|up [-keda]|keda|images|check|deploy OVERLAY|down|env|kubectl ARGS...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	e, err := newEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cmd, args := flag.Arg(0), flag.Args()[1:]
	if err := run(ctx, e, cmd, args); err != nil {
		fmt.Fprintf(os.Stderr, "cluster %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, e env, cmd string, args []string) error {
	switch cmd {
	case "build":
		fs := flag.NewFlagSet("build", flag.ExitOnError)
		keda := fs.Bool("keda", false, "also build KEDA's operator and metrics adapter")
		fs.Parse(args)
		return phase("build", func() error { return build(ctx, e, *keda) })
	case "up":
		fs := flag.NewFlagSet("up", flag.ExitOnError)
		keda := fs.Bool("keda", false, "also build and install KEDA's operator and metrics adapter")
		fs.Parse(args)
		return up(ctx, e, *keda)
	case "keda":
		// KEDA on a cluster that came up without it: CI starts the cluster
		// while KEDA's long cold build still runs, and adds it after.
		return phase("keda", func() error {
			if err := build(ctx, e, true); err != nil {
				return err
			}
			if err := importImages(ctx, e, kedaImgs(e)); err != nil {
				return err
			}
			return installKEDA(ctx, e)
		})
	case "images":
		return phase("images", func() error { return images(ctx, e, false) })
	case "check":
		return phase("check", func() error { return check(ctx, e) })
	case "deploy":
		if len(args) != 1 {
			return fmt.Errorf("deploy needs one overlay name (dev, prod, prod-hpa, ...)")
		}
		return phase("deploy "+args[0], func() error { return deploy(ctx, e, args[0]) })
	case "down":
		return phase("down", func() error { return down(e) })
	case "env":
		fmt.Printf("export KUBECONFIG=%s\nexport PATH=%s:$PATH\n", e.kubeconfig(), filepath.Join(e.cache, "bin"))
		return nil
	case "kubectl":
		return kubectlPassthrough(ctx, e, args)
	}
	return fmt.Errorf("unknown command %q", cmd)
}

// phase runs f and prints how long it took, so CI logs show each phase's
// time.
func phase(name string, f func() error) error {
	start := time.Now()
	err := f()
	status := "ok"
	if err != nil {
		status = "FAILED"
	}
	fmt.Printf("cluster: phase %-24s %-6s %6.1fs\n", name, status, time.Since(start).Seconds())
	return err
}

func newEnv() (env, error) {
	repo := os.Getenv("PUZZLEQ_REPO")
	if repo == "" {
		out, err := output(context.Background(), "", "git", "rev-parse", "--show-toplevel")
		if err != nil {
			return env{}, fmt.Errorf("find the checkout (set PUZZLEQ_REPO): %w", err)
		}
		repo = out
	}
	cache := os.Getenv("PUZZLEQ_K8S_CACHE")
	if cache == "" {
		cache = "/var/cache/puzzleq-k8s"
	}
	state := os.Getenv("PUZZLEQ_K8S_STATE")
	if state == "" {
		state = "/var/lib/puzzleq-k8s"
	}
	e := env{repo: repo, tools: filepath.Join(repo, "test", "k8s", "tools"), cache: cache, state: state}
	if _, err := os.Stat(filepath.Join(e.tools, "kube", "go.mod")); err != nil {
		return env{}, fmt.Errorf("%s is not a puzzleq checkout: %w", repo, err)
	}
	return e, nil
}
