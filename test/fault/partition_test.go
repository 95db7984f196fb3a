//go:build fault

package fault

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// netns is a network namespace with two veth pairs to the host: one
// carries its processes' traffic to Redis, the other the test's traffic
// to them, so that cutting the first partitions a process from Redis
// while the test still reaches it.
type netns struct {
	name       string
	redisLink  string // the host's end of the Redis path
	hostRedis  string // the host's address on the Redis path (Redis binds it)
	inner      string // the namespace's address on the test's path
	interfaces []string
}

// ipCmd runs ip (iproute2) with args.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// removeStaleNetns deletes what a killed earlier run left of tag's
// namespace: its subnet is fixed per tag, so a leftover's host links
// hold the addresses this run needs, and the worker inside the new
// namespace is then unreachable (ci24 failed so, after ci23 was killed
// mid-suite): the namespace, and its host links, which can outlive it.
func removeStaleNetns(t *testing.T, tag string) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
			if strings.HasPrefix(name, "pqff-") && strings.HasSuffix(name, tag) {
				t.Logf("an earlier run left namespace %s behind; deleting it", name)
				_ = ipCmd("netns", "del", name)
			}
		}
	}
	if out, err := exec.Command("ip", "-br", "link").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			name, _, _ := strings.Cut(strings.Fields(line + " x")[0], "@")
			if strings.HasPrefix(name, "pqff") && (strings.HasSuffix(name, tag+"r0") || strings.HasSuffix(name, tag+"t0")) {
				t.Logf("an earlier run left link %s behind; deleting it", name)
				_ = exec.Command("ip", "link", "del", name).Run()
			}
		}
	}
}

// newNetns makes a namespace named pqff-<pid>-<tag> with its links; it
// is deleted, links and all, when the test ends. It skips the test,
// saying why, when it cannot (not root, no iproute2, no veth).
func newNetns(t *testing.T, tag string, subnet int) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network partitions need root (ip netns, veth pairs); skipped")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("network partitions need iproute2's ip; skipped")
	}
	id := fmt.Sprintf("%04x%s", os.Getpid()&0xffff, tag)
	n := &netns{name: "pqff-" + id, redisLink: "pqff" + id + "r0"}
	// 10.213.<subnet>.0/30 is the Redis path, .4/30 the test's.
	base := fmt.Sprintf("10.213.%d.", subnet)
	n.hostRedis, n.inner = base+"1", base+"6"
	removeStaleNetns(t, tag)
	if err := ipCmd("netns", "add", n.name); err != nil {
		t.Skipf("cannot make a network namespace (%v); skipped", err)
	}
	t.Cleanup(func() {
		// Deleting the namespace destroys its veth ends, and with them
		// their peers on the host.
		if err := ipCmd("netns", "del", n.name); err != nil {
			t.Errorf("clean up: %v", err)
		}
		for _, l := range n.interfaces {
			_ = exec.Command("ip", "link", "del", l).Run()
		}
	})
	for _, l := range []struct{ host, peer, hostAddr, peerAddr string }{
		{n.redisLink, "pqff" + id + "r1", base + "1/30", base + "2/30"},
		{"pqff" + id + "t0", "pqff" + id + "t1", base + "5/30", base + "6/30"},
	} {
		n.interfaces = append(n.interfaces, l.host)
		for _, args := range [][]string{
			{"link", "add", l.host, "type", "veth", "peer", "name", l.peer},
			{"link", "set", l.peer, "netns", n.name},
			{"addr", "add", l.hostAddr, "dev", l.host},
			{"link", "set", l.host, "up"},
			{"-n", n.name, "addr", "add", l.peerAddr, "dev", l.peer},
			{"-n", n.name, "link", "set", l.peer, "up"},
		} {
			if err := ipCmd(args...); err != nil {
				t.Skipf("cannot set up veth pairs (%v); skipped", err)
			}
		}
	}
	if err := ipCmd("-n", n.name, "link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	return n
}

// cut takes the Redis path down: the namespace's packets to Redis are
// dropped, with no reset, as in a partition. heal brings it back.
func (n *netns) cut(t *testing.T) {
	t.Helper()
	if err := ipCmd("link", "set", n.redisLink, "down"); err != nil {
		t.Fatal(err)
	}
}

func (n *netns) heal(t *testing.T) {
	t.Helper()
	if err := ipCmd("link", "set", n.redisLink, "up"); err != nil {
		t.Fatal(err)
	}
}

// start runs bin inside the namespace, listening on the test's path.
func (n *netns) start(t *testing.T, name, bin string, env map[string]string) *proc {
	t.Helper()
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), name+".sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec "+ip+" netns exec "+n.name+" "+bin+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(freeAddr(t))
	env["HTTP_ADDR"] = net.JoinHostPort(n.inner, port)
	return stacktest.StartProc(t, name, script, env)
}

// testAPIPartition cuts an API process off from Redis (its packets
// dropped, no reset) for 5 s while the test still reaches it: every
// route must answer 503 within 2.5 s, /readyz within its 2 s limit, and
// after the heal every route must answer normally within 2 s; every task
// acknowledged before or after completes with the exact answer, each
// batch counted exactly.
func testAPIPartition(t *testing.T) {
	const (
		bound     = 2500 * time.Millisecond
		readyz    = 2300 * time.Millisecond
		recovered = 2 * time.Second
	)
	n := newNetns(t, "a", 77)
	c := newCluster(t, clusterOpts{
		redisArgs: []string{"--bind", "127.0.0.1 " + n.hostRedis, "--protected-mode", "no"},
		api:       map[string]string{"CHUNK_SIZE": "4"}, workers: 1,
	})
	addr := strings.TrimPrefix(c.redis.URL(), "redis://127.0.0.1")
	part := n.start(t, "api-partitioned", apiBin, map[string]string{"REDIS_URL": "redis://" + n.hostRedis + addr,
		"LOG_FORMAT": "text", "CHUNK_SIZE": "4"})
	o := newOracle()
	reqs := eightPuzzles(40, 313)
	w := newWorkload()
	pc := &cluster{t: t, redis: c.redis, rdb: c.rdb, insp: c.insp, api: part, http: c.http}
	done := w.addTask(pc, reqs[0])
	items := w.addBatch(pc, reqs[1:9])
	batchID := items[0][:strings.IndexByte(items[0], '-')]
	w.verify(t, pc, o, 60*time.Second)
	for _, q := range solveQueues {
		if err := c.insp.PauseQueue(q); err != nil {
			t.Fatal(err)
		}
	}
	pending := w.addTask(pc, reqs[9])
	routes := func(i int) []probe {
		waitOn := pending
		if i >= 2 {
			waitOn = done
		}
		return []probe{
			{route: "POST tasks", method: "POST", path: "/v1/tasks", body: []byte(reqs[10+i]), ok: 202},
			{route: "POST batches", method: "POST", path: "/v1/batches", body: batchBody(reqs[16+4*i : 20+4*i]), ok: 202, reqs: reqs[16+4*i : 20+4*i]},
			{route: "GET task", method: "GET", path: "/v1/tasks/" + done, ok: 200},
			{route: "GET item", method: "GET", path: "/v1/tasks/" + items[2], ok: 200},
			{route: "GET task wait", method: "GET", path: "/v1/tasks/" + waitOn + "?wait=1s", ok: 200},
			{route: "GET batch", method: "GET", path: "/v1/batches/" + batchID, ok: 200},
			{route: "GET results", method: "GET", path: "/v1/batches/" + batchID + "/results", ok: 200},
			{route: "GET readyz", method: "GET", path: "/readyz", ok: 200},
		}
	}

	n.cut(t)
	cutAt := time.Now()
	healed := false
	defer func() {
		if !healed {
			n.heal(t)
		}
	}()
	slowest := pc.probeOutage(t, "API partitioned", routes, outageBounds{route: bound, readyz: readyz})
	if d := time.Since(cutAt); d < 5*time.Second {
		time.Sleep(5*time.Second - d)
	}
	cutFor := time.Since(cutAt)
	if part.Exited() {
		t.Fatalf("the partitioned API exited: %v", part.Err())
	}
	n.heal(t)
	healed = true
	recovery := pc.probeRecovery(t, "after the heal", routes, w, time.Now(), recovered)
	for _, q := range solveQueues {
		if err := c.insp.UnpauseQueue(q); err != nil {
			t.Fatal(err)
		}
	}
	w.verify(t, pc, o, 60*time.Second)
	t.Logf("API partition: FIGURES cut_for=%v tasks=%d batches=%d partitioned_503: %s healthy_after_heal: %s",
		cutFor.Round(time.Millisecond), len(w.reqs), len(w.batches), figures(slowest), figures(recovery))
}
