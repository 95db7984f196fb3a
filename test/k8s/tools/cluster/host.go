package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// savedSysctls are the host settings the cluster changes: the driver sets
// ip_forward and bridge-nf-call-iptables (kube-proxy needs both), the
// kubelet sets the kernel and vm ones, kube-proxy the conntrack ones.
// down writes back what up found.
var savedSysctls = []string{
	"net/ipv4/ip_forward",
	"net/bridge/bridge-nf-call-iptables",
	"net/bridge/bridge-nf-call-ip6tables",
	"net/ipv4/conf/all/route_localnet",
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
	"net/netfilter/nf_conntrack_max",
	"net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait",
}

// hostState is what up records before it changes the host, for down.
type hostState struct {
	Sysctls  map[string]string `json:"sysctls"`
	IPTables map[string]string `json:"iptables"` // iptables-save per family, for the comparison after down
}

func (e env) hostStateFile() string { return e.path("host.json") }

func saveHost(ctx context.Context, e env) error {
	if _, err := os.Stat(e.hostStateFile()); err == nil {
		return nil // an earlier, failed up already saved the original values
	}
	hs := hostState{Sysctls: map[string]string{}, IPTables: map[string]string{}}
	for _, k := range savedSysctls {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			hs.Sysctls[k] = strings.TrimSpace(string(b))
		}
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		out, err := output(ctx, "", fam+"-save")
		if err != nil {
			return err
		}
		hs.IPTables[fam] = normaliseIPTables(out)
	}
	b, err := json.MarshalIndent(hs, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(e.state, 0o755); err != nil {
		return err
	}
	return os.WriteFile(e.hostStateFile(), b, 0o600)
}

func setSysctl(k, v string) error {
	return os.WriteFile("/proc/sys/"+k, []byte(v), 0o644)
}

// setupNetwork makes the bridge the pods attach to, routes the service
// range onto it (so a service address never takes the default route),
// and installs the isolation rule before forwarding is turned on.
func setupNetwork(ctx context.Context, e env) error {
	steps := [][]string{
		{"ip", "link", "add", bridgeName, "type", "bridge"},
		{"ip", "addr", "add", nodeIP + "/16", "dev", bridgeName},
		{"ip", "link", "set", bridgeName, "up"},
		{"ip", "route", "add", serviceCIDR, "dev", bridgeName, "src", nodeIP},
	}
	for _, s := range steps {
		if _, err := output(ctx, "", s[0], s[1:]...); err != nil {
			return err
		}
	}
	// The mangle table is one kube-proxy leaves alone, so this rule stays
	// first: a packet forwarded between the bridge and any other interface
	// is dropped, in either direction.
	for _, fam := range []string{"iptables", "ip6tables"} {
		rules := [][]string{
			{"-t", "mangle", "-N", isolateChain},
			{"-t", "mangle", "-A", isolateChain, "-i", bridgeName, "-o", bridgeName, "-j", "RETURN"},
			{"-t", "mangle", "-A", isolateChain, "-i", bridgeName, "-j", "DROP"},
			{"-t", "mangle", "-A", isolateChain, "-o", bridgeName, "-j", "DROP"},
			{"-t", "mangle", "-I", "FORWARD", "1", "-j", isolateChain},
		}
		for _, r := range rules {
			if _, err := output(ctx, "", fam, r...); err != nil {
				return err
			}
		}
	}
	for k, v := range map[string]string{
		"net/bridge/bridge-nf-call-iptables":  "1",
		"net/bridge/bridge-nf-call-ip6tables": "1",
		"net/ipv4/ip_forward":                 "1",
	} {
		if err := setSysctl(k, v); err != nil {
			return fmt.Errorf("sysctl %s: %w", k, err)
		}
	}
	// The CNI configuration lives in the state directory, which
	// containerd's config points at: /etc/cni is never touched.
	conf := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "puzzleq-test",
  "plugins": [{
    "type": "bridge",
    "bridge": %q,
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "dataDir": %q,
      "ranges": [[{"subnet": %q, "rangeStart": "10.217.1.1", "gateway": %q}]],
      "routes": [{"dst": "0.0.0.0/0"}]
    }
  }, {"type": "loopback"}]
}
`, bridgeName, e.path("cni", "ipam"), podCIDR, nodeIP)
	if err := os.MkdirAll(e.path("cni", "net.d"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(e.path("cni", "net.d", "10-puzzleq.conflist"), []byte(conf), 0o644)
}

// isolateChain is the driver's own iptables chain (see setupNetwork).
const isolateChain = "PZQ-K8S-ISOLATE"

// ourChain matches the chains the cluster creates: kube-proxy's and the
// kubelet's KUBE-*, the CNI plugins' CNI-* and the driver's own.
var ourChain = regexp.MustCompile(`\b(KUBE-[A-Z0-9-]+|CNI-[A-Za-z0-9-]+|` + isolateChain + `)\b`)

// sweepIPTables removes from every table each chain the cluster made and
// each rule that names one, restoring the tables in one step per family.
func sweepIPTables(ctx context.Context) error {
	var errs []error
	for _, fam := range []string{"iptables", "ip6tables"} {
		out, err := output(ctx, "", fam+"-save")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var kept []string
		changed := false
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			line := sc.Text()
			if (strings.HasPrefix(line, ":") || strings.HasPrefix(line, "-A ")) && ourChain.MatchString(line) {
				changed = true
				continue
			}
			kept = append(kept, line)
		}
		if !changed {
			continue
		}
		cmd := fam + "-restore"
		if err := pipe(ctx, strings.Join(kept, "\n")+"\n", cmd); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// normaliseIPTables drops comments and counters from iptables-save output
// so that two snapshots compare equal when the rules are.
//
// A table that holds no rule and only built-in chains with policy ACCEPT
// is left out: it is what an unused table looks like, and iptables-save
// omits a table nobody has touched.
func normaliseIPTables(s string) string {
	var b strings.Builder
	counters := regexp.MustCompile(`\[\d+:\d+\]`)
	var table []string
	empty := true
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		line = counters.ReplaceAllString(line, "[0:0]")
		switch {
		case strings.HasPrefix(line, "*"):
			table, empty = []string{line}, true
		case line == "COMMIT":
			if !empty {
				b.WriteString(strings.Join(append(table, line), "\n") + "\n")
			}
			table = nil
		default:
			table = append(table, line)
			if !(strings.HasPrefix(line, ":") && strings.HasSuffix(line, " ACCEPT [0:0]")) {
				empty = false
			}
		}
	}
	return b.String()
}

// restoreHost puts back what saveHost recorded and reports any table that
// still differs from it.
func restoreHost(ctx context.Context, e env) error {
	b, err := os.ReadFile(e.hostStateFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var hs hostState
	if err := json.Unmarshal(b, &hs); err != nil {
		return err
	}
	var errs []error
	for k, v := range hs.Sysctls {
		cur, _ := os.ReadFile("/proc/sys/" + k)
		if strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := setSysctl(k, v); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", k, v, err))
		}
	}
	for fam, want := range hs.IPTables {
		out, err := output(ctx, "", fam+"-save")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if got := normaliseIPTables(out); got != want {
			fmt.Fprintf(os.Stderr, "cluster down: warning: %s rules differ from before up (another process may have changed them):\n%s\n", fam, diffLines(want, got))
		}
	}
	return errors.Join(errs...)
}

// diffLines lists the lines only in a (-) or only in b (+).
func diffLines(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for l := range ma {
		if !mb[l] {
			out = append(out, "- "+l)
		}
	}
	for l := range mb {
		if !ma[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

func pipe(ctx context.Context, stdin, name string, args ...string) error {
	f, err := os.CreateTemp("", "pzq-k8s-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(stdin); err != nil {
		return err
	}
	f.Close()
	_, err = output(ctx, "", "sh", "-c", fmt.Sprintf("%s %s < %s", name, strings.Join(args, " "), f.Name()))
	return err
}

// ourMounts lists the mount points under dir, deepest first.
func ourMounts(dirs ...string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var ms []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, d := range dirs {
			if mp == d || strings.HasPrefix(mp, filepath.Clean(d)+"/") {
				ms = append(ms, mp)
			}
		}
	}
	// Deepest (and latest) first.
	for i, j := 0, len(ms)-1; i < j; i, j = i+1, j-1 {
		ms[i], ms[j] = ms[j], ms[i]
	}
	return ms
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}
