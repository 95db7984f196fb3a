package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// down stops the cluster and restores the host. It is safe to run at any
// point (after a failed up, twice, with nothing running) and does every
// step even when one fails, reporting all failures at the end.
func down(e env) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var errs []error
	step := func(name string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	// The kubelet first, so it does not restart what is killed next.
	step("stop kubelet", stop(e, "kubelet", 10*time.Second))
	step("kill pods", killPods(ctx, e))
	step("stop containerd", stop(e, "containerd", 10*time.Second))
	step("kill shims", killShims(e))
	for _, c := range []string{"kube-proxy", "coredns", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		step("stop "+c, stop(e, c, 10*time.Second))
	}
	// kube-proxy's own cleanup of its iptables chains, then a sweep for
	// anything left (the kubelet's, the driver's).
	if _, err := os.Stat(e.bin("kube-proxy")); err == nil {
		output(ctx, "", e.bin("kube-proxy"), "--cleanup")
	}
	step("iptables", sweepIPTables(ctx))
	step("unmount", unmountAll(e))
	step("cgroups", removeCgroups())
	if _, err := output(ctx, "", "ip", "link", "show", bridgeName); err == nil {
		_, err := output(ctx, "", "ip", "link", "delete", bridgeName)
		step("delete bridge", err)
	}
	step("restore host", restoreHost(ctx, e))
	step("verify", verifyClean(ctx, e))
	// Keep the logs of the last run for whoever debugs it.
	if _, err := os.Stat(e.path("logs")); err == nil {
		last := filepath.Join(e.cache, "last-logs")
		os.RemoveAll(last)
		os.MkdirAll(e.cache, 0o755)
		if _, err := output(ctx, "", "cp", "-r", e.path("logs"), last); err != nil {
			step("keep logs", err)
		}
	}
	if len(ourMounts(e.state)) == 0 {
		step("remove state", os.RemoveAll(e.state))
	} else {
		step("remove state", fmt.Errorf("mounts remain under %s: %v", e.state, ourMounts(e.state)))
	}
	return errors.Join(errs...)
}

// killPods kills every process in the kubelet's pod cgroups, then deletes
// each container's task and the network namespace containerd made for
// its sandbox (which takes the pod's veth with it).
func killPods(ctx context.Context, e env) error {
	killCgroupProcs()
	if !alive(e, "containerd") {
		return nil
	}
	var errs []error
	ids, err := ctr(ctx, e, "containers", "ls", "-q")
	if err != nil {
		return err
	}
	for _, id := range strings.Fields(ids) {
		ctr(ctx, e, "tasks", "kill", "-s", "SIGKILL", id)
		ctr(ctx, e, "tasks", "delete", "-f", id)
		if info, err := ctr(ctx, e, "containers", "info", id); err == nil {
			if ns := netnsOf(info); strings.HasPrefix(ns, "/var/run/netns/") || strings.HasPrefix(ns, "/run/netns/") {
				if _, err := output(ctx, "", "ip", "netns", "delete", filepath.Base(ns)); err != nil && !strings.Contains(err.Error(), "No such file") {
					errs = append(errs, err)
				}
			}
		}
		if _, err := ctr(ctx, e, "containers", "delete", id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// netnsOf returns the network namespace path in a container's spec.
func netnsOf(info string) string {
	var c struct {
		Spec struct {
			Linux struct {
				Namespaces []struct{ Type, Path string } `json:"namespaces"`
			} `json:"linux"`
		} `json:"Spec"`
	}
	if json.Unmarshal([]byte(info), &c) != nil {
		return ""
	}
	for _, ns := range c.Spec.Linux.Namespaces {
		if ns.Type == "network" {
			return ns.Path
		}
	}
	return ""
}

// cgroupRoots are the kubelet's pod cgroups in each v1 hierarchy.
func cgroupRoots() []string {
	ms, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	return ms
}

func killCgroupProcs() {
	for _, root := range cgroupRoots() {
		filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
			if err != nil || info.IsDir() || info.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
	}
}

// removeCgroups removes the kubelet's cgroups, deepest first.
func removeCgroups() error {
	var errs []error
	for _, root := range cgroupRoots() {
		var dirs []string
		filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
			if err == nil && info.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for try := 0; try < 20; try++ {
				if err = syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				// A process killed a moment ago may not have left yet.
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// killShims ends the containerd shims of this cluster's containerd (they
// outlive containerd by design), found by the socket in their command
// line.
func killShims(e env) error {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var errs []error
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), e.containerdSock()) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		exe, _ := os.Readlink(filepath.Join(filepath.Dir(p), "exe"))
		if !strings.Contains(exe, "containerd-shim") {
			continue
		}
		if err := killWait(pid, exe, 5*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// unmountAll detaches every mount under the state directory (the
// kubelet's volumes, containerd's rootfs and shm mounts), deepest first.
func unmountAll(e env) error {
	var errs []error
	for try := 0; try < 3; try++ {
		ms := ourMounts(e.state)
		if len(ms) == 0 {
			return nil
		}
		errs = nil
		for _, m := range ms {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("umount %s: %w", m, err))
			}
		}
	}
	if ms := ourMounts(e.state); len(ms) > 0 {
		errs = append(errs, fmt.Errorf("still mounted: %v", ms))
	}
	return errors.Join(errs...)
}

// verifyClean checks that nothing of the cluster is left on the host:
// no process of it, no chain of it in any table, no bridge, no pod
// cgroup, no mount under the state directory.
func verifyClean(ctx context.Context, e env) error {
	var errs []error
	for _, fam := range []string{"iptables", "ip6tables"} {
		out, err := output(ctx, "", fam+"-save")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if m := ourChain.FindString(out); m != "" {
			errs = append(errs, fmt.Errorf("%s still has chain %s", fam, m))
		}
	}
	if _, err := output(ctx, "", "ip", "link", "show", bridgeName); err == nil {
		errs = append(errs, fmt.Errorf("bridge %s still exists", bridgeName))
	}
	if roots := cgroupRoots(); len(roots) > 0 {
		errs = append(errs, fmt.Errorf("pod cgroups remain: %v", roots))
	}
	if ms := ourMounts(e.state); len(ms) > 0 {
		errs = append(errs, fmt.Errorf("mounts remain: %v", ms))
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), e.state+"/") {
			errs = append(errs, fmt.Errorf("process %s still runs: %.120s", filepath.Base(filepath.Dir(p)), strings.ReplaceAll(string(b), "\x00", " ")))
		}
	}
	return errors.Join(errs...)
}
