//go:build fault

package fault

import (
	"bytes"
	"context"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/redistest"
)

// sentinelMaster is the master's name at the test's Sentinels.
const sentinelMaster = "pq"

// failoverRecovery bounds the wait for every acknowledged task to end
// after the failover. A task a worker finished on the old master just
// before the kill, whose results the replica never received, runs again
// as a copy as soon as the worker meets the new master (worker.Rerun), in
// seconds; the original, if the new master still holds it as running, is
// found by asynq's lease (30 s) and its recoverer (every minute) and then
// does nothing. The bound is that 60-125 s of crash recovery with room,
// so that only a task nothing would ever run again fails it.
const failoverRecovery = 150 * time.Second

// TestSentinelFailover runs Redis as a master, one replica and three
// Sentinels (quorum 2, down after 1 s), points the API and two workers at
// the Sentinels (REDIS_SENTINELS, REDIS_MASTER_NAME), and kills -9 the
// master. The Sentinels promote the replica; the service must answer
// again within 10 s of the promotion, and every acknowledged task must be
// accounted for by ID: completed with the right result, or reported here
// as lost because replication (asynchronous) had not carried it to the
// replica. A task acknowledged after the promotion went to the new master
// and must never be lost.
//
// Replicated: the master dies under load (batches and singles submitted
// and solved). Lagging: the replica's link is held (a proxy stops passing
// the master's stream) while three batches and a single are acknowledged,
// then the master dies: exactly those tasks are lost, each reported by
// ID, and nothing else is disturbed. The workers are frozen during that
// window, so that what is lost is exactly the submissions: a task they
// finished on the master in it would run again (worker.Rerun), which
// Replicated shows.
//
// LaggingAcked is Lagging with REDIS_ACK_REPLICAS=1 and two replicas (so
// that one is left to confirm writes after the other's promotion), both
// links held: the same requests made during the hold answer 503 within
// REDIS_ACK_TIMEOUT plus 0.5 s instead of 2xx, none hangs, and nothing
// acknowledged is lost. Lagging, with acks off, is the contrast.
func TestSentinelFailover(t *testing.T) {
	t.Run("Replicated", func(t *testing.T) { timed(t); testSentinelFailover(t, false, false) })
	t.Run("Lagging", func(t *testing.T) { timed(t); testSentinelFailover(t, true, false) })
	t.Run("LaggingAcked", func(t *testing.T) { timed(t); testSentinelFailover(t, true, true) })
}

func testSentinelFailover(t *testing.T, lagging, acked bool) {
	ctx := t.Context()
	master := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "everysec")
	nReplicas := 1
	if acked {
		nReplicas = 2
	}
	var (
		links    []*linkProxy
		replicas []*redistest.Server
	)
	for range nReplicas {
		link := startLinkProxy(t, master.Addr)
		replica := redistest.Start(t, append(redistest.ReplicaOf(link.Addr()), "--appendonly", "yes", "--appendfsync", "everysec")...)
		waitReplicaLinked(t, replica, 10*time.Second)
		links, replicas = append(links, link), append(replicas, replica)
	}
	var sentinels []*redistest.Server
	var addrs []string
	for range 3 {
		s := redistest.StartSentinel(t, redistest.SentinelOpts{Name: sentinelMaster, Master: master.Addr, Quorum: 2, DownAfter: time.Second})
		sentinels = append(sentinels, s)
		addrs = append(addrs, s.Addr)
	}
	redistest.WaitSentinels(t, sentinelMaster, nReplicas, 20*time.Second, sentinels...)
	rdb := redistest.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinelMaster, SentinelAddrs: addrs})
	t.Cleanup(func() { rdb.Close() })

	const reqTimeout = 2 * time.Second
	apiEnv := map[string]string{"CHUNK_SIZE": "16", "REQUEST_TIMEOUT": reqTimeout.String()}
	workerEnv := map[string]string{"WORKER_CONCURRENCY": "2"}
	if acked {
		for _, m := range []map[string]string{apiEnv, workerEnv} {
			m["REDIS_ACK_REPLICAS"], m["REDIS_ACK_TIMEOUT"] = "1", ackTimeout.String()
		}
	}
	c := newCluster(t, clusterOpts{
		redis: master, rdb: rdb,
		redisEnv: map[string]string{"REDIS_SENTINELS": strings.Join(addrs, ","), "REDIS_MASTER_NAME": sentinelMaster},
		api:      apiEnv,
		worker:   workerEnv,
		workers:  2,
	})
	o := newOracle()
	slidings := eightPuzzles(20000, 37)
	sub := startSubmitter(c, slidings[:15000], corpusSweeps(t))
	defer sub.stop()
	if !pollUntil(30*time.Second, 20*time.Millisecond, func() bool { return sub.batchesAcked() >= 10 }) {
		t.Fatalf("fewer than 10 batches acknowledged before the kill: %d, statuses %v", sub.batchesAcked(), sub.statusesNow())
	}
	// unreplicated are the tasks acknowledged while the replica's link
	// was held: the ones replication may lose.
	unreplicated := newWorkload()
	var refused []time.Duration // acked: the held requests' 503s
	if lagging {
		sub.stop()
		sub.acked.verify(t, c, o, 60*time.Second)
		for _, w := range c.workers {
			w.Signal(t, syscall.SIGSTOP)
		}
		for i, replica := range replicas {
			waitReplicated(t, master, replica, 10*time.Second)
			links[i].Hold()
		}
		if acked {
			refused = refuseUnconfirmed(t, c, append(batchBodies(slidings[15000:15060], 20), []byte(slidings[15100])))
		} else {
			for i := range 3 {
				unreplicated.addBatch(c, slidings[15000+20*i:15020+20*i])
			}
			unreplicated.addTask(c, slidings[15100])
			sub.adopt(unreplicated)
		}
	}
	sub.mu.Lock()
	ackedBefore := len(sub.acked.reqs)
	sub.mu.Unlock()

	master.Kill()
	killedAt := time.Now()
	if lagging {
		for _, w := range c.workers {
			w.Signal(t, syscall.SIGCONT)
		}
	}
	var promotedAt time.Time
	if !pollUntil(30*time.Second, 20*time.Millisecond, func() bool {
		a, err := redistest.MasterAddr(ctx, sentinels[0], sentinelMaster)
		for _, replica := range replicas {
			if err == nil && a == replica.Addr {
				promotedAt = time.Now()
				return true
			}
		}
		return false
	}) {
		t.Fatalf("the Sentinels did not promote the replica within 30 s of the kill")
	}
	// The service continues: the first acknowledgement after the kill.
	first := sub
	if lagging {
		sub = startSubmitter(c, slidings[16000:], corpusSweeps(t))
		defer sub.stop()
	}
	var resumedAt time.Time
	if !pollUntil(time.Until(promotedAt.Add(20*time.Second)), 20*time.Millisecond, func() bool {
		resumedAt = sub.firstAckAfter(killedAt)
		return !resumedAt.IsZero()
	}) {
		t.Fatalf("nothing acknowledged within 20 s of the promotion; statuses %v", sub.statusesNow())
	}
	if gap := resumedAt.Sub(promotedAt); gap > 10*time.Second {
		t.Errorf("the first acknowledgement came %v after the promotion, want within 10 s", gap)
	}
	// A few more rounds on the new master, then stop submitting.
	n0 := sub.batchesAcked()
	if !pollUntil(30*time.Second, 50*time.Millisecond, func() bool { return sub.batchesAcked() >= n0+5 }) {
		t.Errorf("fewer than 5 batches acknowledged after the service resumed: %d then, %d now", n0, sub.batchesAcked())
	}
	sub.stop()
	for _, p := range append(c.workers, c.api) {
		if p.Exited() {
			t.Fatalf("%s exited during the failover: %v", p.Name, p.Err())
		}
		p.WaitReady(t, 10*time.Second)
	}
	// Each worker met the new master, and ran again what it had just
	// finished on the old one, whose results the replica may lack
	// (worker.Rerun).
	for _, w := range c.workers {
		if b, err := os.ReadFile(w.LogPath); err != nil || !bytes.Contains(b, []byte("redis master changed: the solves finished just before run again")) {
			t.Errorf("%s did not notice the new master (%v)", w.Name, err)
		}
	}

	// Account for every acknowledged task by ID: the lagging run's
	// first submitter's (verified before the kill, and replicated), the
	// unreplicated ones and the second submitter's.
	ackedReqs, ackedAt := newWorkload(), map[string]time.Time{}
	for _, w := range []*workload{first.acked, unreplicated, sub.acked} {
		maps.Copy(ackedReqs.reqs, w.reqs)
		maps.Copy(ackedReqs.batches, w.batches)
	}
	maps.Copy(ackedAt, first.at)
	maps.Copy(ackedAt, sub.at)
	var lostBatches []string
	for id, n := range ackedReqs.batches {
		code, _, err := c.do("GET", "/v1/batches/"+id+"?limit=1", nil)
		if err == nil && code == http.StatusNotFound {
			lostBatches = append(lostBatches, id)
			continue
		}
		if b := c.waitBatch(id, failoverRecovery); !b.Done {
			t.Errorf("batch %s not done: %v", id, b.Counts)
		}
		c.checkBatch(id, n)
	}
	recs := c.waitTasks(ackedReqs.ids(), failoverRecovery)
	var lost, lostAfter, stuck []string
	present := map[string]string{}
	for _, id := range ackedReqs.ids() {
		tr, ok := recs[id]
		switch {
		case !ok && ackedAt[id].After(promotedAt):
			lostAfter = append(lostAfter, id)
		case !ok:
			lost = append(lost, id)
		case !tr.State.Terminal():
			stuck = append(stuck, id+" ("+string(tr.State)+")")
		default:
			present[id] = ackedReqs.reqs[id]
		}
	}
	sort.Strings(lost)
	sort.Strings(lostBatches)
	if len(lost) > 0 || len(lostBatches) > 0 {
		// Not silently: acknowledged by the old master, not yet on the
		// replica when it died (asynchronous replication, docs/guarantees.md).
		t.Logf("sentinel failover: lost %d acknowledged task records %v, %d batches %v (acknowledged before the kill, not replicated; checked below against what this case allows)",
			len(lost), lost, len(lostBatches), lostBatches)
	}
	if len(lostAfter) > 0 {
		t.Errorf("%d tasks acknowledged after the promotion are lost: %v", len(lostAfter), lostAfter)
	}
	if len(stuck) > 0 {
		t.Errorf("%d acknowledged tasks never ended: %v", len(stuck), stuck)
	}
	if acked && (len(lost) > 0 || len(lostBatches) > 0) {
		t.Errorf("with REDIS_ACK_REPLICAS=1, %d acknowledged tasks and %d batches were lost", len(lost), len(lostBatches))
	}
	if lagging && !acked {
		// Exactly what was acknowledged while the link was held is lost.
		for id := range unreplicated.reqs {
			if _, ok := recs[id]; ok {
				t.Errorf("task %s, acknowledged while replication was held, survived the failover", id)
			}
		}
		if len(lost) != len(unreplicated.reqs) || len(lostBatches) != len(unreplicated.batches) {
			t.Errorf("lost %d tasks and %d batches, want the %d tasks and %d batches acknowledged while replication was held",
				len(lost), len(lostBatches), len(unreplicated.reqs), len(unreplicated.batches))
		}
	}
	o.check(t, recs, present)
	role, err := rdb.Do(ctx, "ROLE").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		t.Errorf("the new master's ROLE: %v %v", role, err)
	}
	t.Logf("sentinel failover (lagging=%v acked=%v): FIGURES refused_while_held=%v acked=%d (%d before the kill) completed=%d lost=%d lost_batches=%d kill_to_promotion=%v promotion_to_first_ack=%v kill_to_first_ack=%v statuses_after=%v slowest_batch_answer=%v slowest_failed_submit=%v",
		lagging, acked, roundAll(refused), len(ackedReqs.reqs), ackedBefore, len(present), len(lost), len(lostBatches), promotedAt.Sub(killedAt).Round(time.Millisecond),
		resumedAt.Sub(promotedAt).Round(time.Millisecond), resumedAt.Sub(killedAt).Round(time.Millisecond),
		sub.statuses, sub.slowest.Round(time.Millisecond), sub.worst.Round(time.Millisecond))
	for code, n := range sub.statuses {
		if code != http.StatusAccepted && code != http.StatusOK && code != http.StatusServiceUnavailable {
			t.Errorf("the submitter got status %d %d times; only 200, 202 and 503 are acceptable (0: no answer)", code, n)
		}
	}
}

// refuseUnconfirmed sends each body (a batch's or a single task's) once
// while no replica can confirm a write, and checks that each answers 503
// with Retry-After within ackBound; it returns how long each took.
func refuseUnconfirmed(t *testing.T, c *cluster, bodies [][]byte) []time.Duration {
	t.Helper()
	var took []time.Duration
	for _, b := range bodies {
		path := "/v1/tasks"
		if bytes.HasPrefix(b, []byte(`{"tasks":`)) {
			path = "/v1/batches"
		}
		start := time.Now()
		req, _ := http.NewRequest("POST", c.api.URL()+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.http.Do(req)
		d := time.Since(start)
		took = append(took, d)
		if err != nil {
			t.Errorf("POST %s while replication was held: %v after %v", path, err, d)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || d > ackBound {
			t.Errorf("POST %s while replication was held: %d (Retry-After %q) after %v, want 503 with Retry-After within %v",
				path, resp.StatusCode, resp.Header.Get("Retry-After"), d, ackBound)
		}
	}
	return took
}

// batchBodies cuts reqs into JSON batch bodies of n each.
func batchBodies(reqs []string, n int) [][]byte {
	var out [][]byte
	for i := 0; i < len(reqs); i += n {
		out = append(out, batchBody(reqs[i:min(i+n, len(reqs))]))
	}
	return out
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// waitReplicaLinked waits until the replica has synced with its master,
// so the Sentinels find it at their first look at the master.
func waitReplicaLinked(t *testing.T, replica *redistest.Server, d time.Duration) {
	t.Helper()
	c := replica.Client(t)
	var info string
	if !pollUntil(d, 50*time.Millisecond, func() bool {
		info, _ = c.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "master_link_status:up")
	}) {
		t.Fatalf("the replica did not sync within %v: %s", d, info)
	}
}

// waitReplicated waits until the replica has applied the master's whole
// replication stream so far.
func waitReplicated(t *testing.T, master, replica *redistest.Server, d time.Duration) {
	t.Helper()
	m, r := master.Client(t), replica.Client(t)
	offset := func(c *redis.Client) string {
		info, _ := c.Info(context.Background(), "replication").Result()
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "master_repl_offset:"); ok {
				return v
			}
		}
		return "?"
	}
	var mo, ro string
	if !pollUntil(d, 20*time.Millisecond, func() bool {
		mo, ro = offset(m), offset(r)
		return mo != "?" && mo == ro
	}) {
		t.Fatalf("the replica is at offset %s, the master at %s, after %v", ro, mo, d)
	}
}

// firstAckAfter is when the first task acknowledged after t was, or zero.
func (s *submitter) firstAckAfter(t time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var first time.Time
	for _, at := range s.at {
		if at.After(t) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first
}

// linkProxy is the replica's way to its master: a TCP proxy that can hold
// the master's replication stream (stop passing it on, the connection
// still up), so that writes the master acknowledges do not reach the
// replica, as when replication lags behind a burst or a slow link.
type linkProxy struct {
	ln     net.Listener
	target string
	held   atomic.Bool
	closed atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func startLinkProxy(t *testing.T, target string) *linkProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &linkProxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's address, for the replica's replicaof.
func (p *linkProxy) Addr() string { return p.ln.Addr().String() }

// Hold stops passing the master's bytes to the replica.
func (p *linkProxy) Hold() { p.held.Store(true) }

func (p *linkProxy) serve() {
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, down, up)
		p.mu.Unlock()
		go func() { io.Copy(up, down); up.Close() }()
		go func() { p.pass(down, up); down.Close() }()
	}
}

// pass copies the master's stream to the replica, waiting while held.
func (p *linkProxy) pass(down, up net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := up.Read(buf)
		for p.held.Load() && !p.closed.Load() {
			time.Sleep(10 * time.Millisecond)
		}
		if p.held.Load() || p.closed.Load() {
			return // held to the end: nothing more is passed
		}
		if n > 0 {
			if _, werr := down.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *linkProxy) close() {
	p.closed.Store(true)
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}
