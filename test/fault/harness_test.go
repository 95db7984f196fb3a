//go:build fault

package fault

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// Paths of the binaries TestMain builds.
var apiBin, workerBin string

// TestMain builds cmd/api and cmd/worker once, into a temporary directory
// (or uses the ones in $PUZZLEQ_FAULT_BIN, if set), raises the open-file
// limit for the storm scenario (the processes the suite starts inherit
// it) and go test's -parallel to minParallel.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

// minParallel is the least -parallel the suite runs with. TestFault's
// group orders and bounds its cases itself (gate, beside), and a case
// waiting there holds one of go test's -parallel slots: with fewer slots
// than the group has cases, the waiting ones could hold every slot while
// the case they wait for has none. The suite's other groups are of two to
// five cases, which run at once.
const minParallel = 16

func run(m *testing.M) int {
	flag.Parse()
	if f := flag.Lookup("test.parallel"); f != nil {
		if n, err := strconv.Atoi(f.Value.String()); err == nil && n < minParallel {
			_ = f.Value.Set(strconv.Itoa(minParallel))
		}
	}
	raiseFileLimit()
	pdbs, err := os.MkdirTemp("", "puzzleq-fault-pdb-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fault: temp dir:", err)
		return 1
	}
	defer os.RemoveAll(pdbs)
	pdbDir = pdbs // built by the first test that needs it (ensurePDB)
	if dir := os.Getenv("PUZZLEQ_FAULT_BIN"); dir != "" {
		// Prebuilt binaries, e.g. from CI's own build step.
		apiBin, workerBin = filepath.Join(dir, "api"), filepath.Join(dir, "worker")
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "puzzleq-fault-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fault: temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	if apiBin, workerBin, err = stacktest.BuildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, "fault:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "fault: built api and worker in %v\n", time.Since(start).Round(time.Millisecond))
	return m.Run()
}

// raiseFileLimit lifts the soft RLIMIT_NOFILE to the hard limit: the storm
// holds about 1,000 connections on each side of 127.0.0.1.
func raiseFileLimit() {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
}

// freeAddr returns a 127.0.0.1 address with a port that was free a moment
// ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := redistest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// proc is a running api or worker process.
type proc = stacktest.Proc

// cluster is one deployment: a redis-server, an API and workers, all
// separate processes, plus clients for checking what they did.
type cluster struct {
	t       *testing.T
	redis   *redistest.Server
	rdb     *redis.Client
	insp    *asynq.Inspector
	api     *proc
	workers []*proc
	wenv    map[string]string
	http    *http.Client
	n       int    // workers started so far, for names
	key     string // the API key requests carry ("" when auth is off)
}

// clusterOpts configures newCluster.
type clusterOpts struct {
	redisArgs []string          // extra redis-server directives
	api       map[string]string // API settings over the defaults
	worker    map[string]string // worker settings over the defaults
	workers   int               // workers to start
	// authed turns the API keys on with faultOwner's key (limits raised
	// out of the way), and every request of the cluster carries it, so
	// the per-key quota is in play (checkQuota).
	authed bool
	// redis, rdb and redisEnv, when set, are the Redis the cluster uses
	// (a Sentinel-watched master, say), a client of it, and the settings
	// that point both binaries at it, instead of a redis-server of its
	// own and REDIS_URL.
	redis    *redistest.Server
	rdb      *redis.Client
	redisEnv map[string]string
}

// newCluster starts Redis, the API and opts.workers workers.
// freezeRedis stops redis-server with SIGSTOP (a hung Redis: connections
// are accepted and nothing answers) and returns thaw (freezeServer).
func (c *cluster) freezeRedis(t *testing.T) (thaw func()) {
	t.Helper()
	return freezeServer(t, c.redis)
}

// freezeServer stops s with SIGSTOP and returns thaw, which sends SIGCONT
// once; later calls do nothing, so a test both defers it and calls it
// where the freeze should end, and a failing test never leaves the
// server frozen.
func freezeServer(t *testing.T, s *redistest.Server) (thaw func()) {
	t.Helper()
	if err := s.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	return func() {
		if !thawed {
			thawed = true
			if err := s.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func newCluster(t *testing.T, o clusterOpts) *cluster {
	t.Helper()
	c := &cluster{t: t, redis: o.redis, rdb: o.rdb}
	redisEnv := o.redisEnv
	if redisEnv == nil {
		c.redis = redistest.Start(t, o.redisArgs...)
		c.rdb = c.redis.Client(t)
		redisEnv = map[string]string{"REDIS_URL": c.redis.URL()}
	}
	c.insp = asynq.NewInspectorFromRedisClient(c.rdb)
	c.http = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(c.http.CloseIdleConnections)
	aenv := map[string]string{"HTTP_ADDR": freeAddr(t), "LOG_FORMAT": "text"}
	maps.Copy(aenv, redisEnv)
	if o.authed {
		c.key = faultKey
		aenv["API_KEYS"] = faultOwner + ":" + faultKey
		aenv["RATE_LIMIT_PER_SECOND"], aenv["RATE_LIMIT_BURST"] = "10000", "10000"
	}
	for k, v := range o.api {
		aenv[k] = v
	}
	c.api = stacktest.StartProc(t, "api", apiBin, aenv)
	// The scenarios fill every slot with one key's hard boards on purpose
	// (a fault must hit running solves), so the per-key ceiling of
	// expensive work is out of their way; the flood scenario sets one.
	c.wenv = map[string]string{"LOG_FORMAT": "text", "TASK_CHECK_INTERVAL": "20ms", "PDB_PRELOAD": "false",
		"WORKER_CONCURRENCY": "2", "MAX_EXPENSIVE_PER_KEY": "1000"}
	maps.Copy(c.wenv, redisEnv)
	for k, v := range o.worker {
		c.wenv[k] = v
	}
	for range o.workers {
		c.startWorker(nil)
	}
	return c
}

// startWorker starts one more worker; extra overrides its settings.
func (c *cluster) startWorker(extra map[string]string) *proc {
	c.t.Helper()
	env := map[string]string{"HTTP_ADDR": freeAddr(c.t)}
	for k, v := range c.wenv {
		env[k] = v
	}
	for k, v := range extra {
		env[k] = v
	}
	c.n++
	w := stacktest.StartProc(c.t, fmt.Sprintf("worker%d", c.n), workerBin, env)
	c.workers = append(c.workers, w)
	return w
}

// do sends one request to the API and returns the status and body.
func (c *cluster) do(method, path string, body []byte) (int, []byte, error) {
	return c.doOn(c.http, method, path, body)
}

// doOn is do on another HTTP client.
func (c *cluster) doOn(hc *http.Client, method, path string, body []byte) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, c.api.URL()+path, r)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// must sends a request that has to answer want.
func (c *cluster) must(method, path string, body []byte, want int) []byte {
	c.t.Helper()
	code, b, err := c.do(method, path, body)
	if err != nil || code != want {
		c.t.Fatalf("%s %s: %d %v, want %d: %.300s", method, path, code, err, want, b)
	}
	return b
}

// submitTask submits one request; it must be accepted (202) and is then
// expected to complete with want.
func (c *cluster) submitTask(req string) string {
	c.t.Helper()
	var tr apitype.Task
	if err := json.Unmarshal(c.must("POST", "/v1/tasks", []byte(req), http.StatusAccepted), &tr); err != nil {
		c.t.Fatal(err)
	}
	return tr.ID
}

// submitBatch submits requests as one JSON batch and returns its ID and
// the task IDs in order.
func (c *cluster) submitBatch(reqs []string) (string, []string) {
	c.t.Helper()
	code, b, err := c.do("POST", "/v1/batches", batchBody(reqs))
	if err != nil || code != http.StatusAccepted {
		c.t.Fatalf("POST /v1/batches: %d %v: %.300s", code, err, b)
	}
	return decodeBatchAck(c.t, b)
}

func batchBody(reqs []string) []byte {
	var buf bytes.Buffer
	buf.WriteString(`{"tasks":[`)
	for i, r := range reqs {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.WriteString(r)
	}
	buf.WriteString(`]}`)
	return buf.Bytes()
}

func decodeBatchAck(t *testing.T, b []byte) (string, []string) {
	t.Helper()
	var ack apitype.BatchCreated
	if err := json.Unmarshal(b, &ack); err != nil || len(ack.TaskIDs) != ack.Total {
		t.Fatalf("batch answer %.200s: %v", b, err)
	}
	return ack.ID, ack.TaskIDs
}

// getTask reads a task; ok is false when it does not exist (404).
func (c *cluster) getTask(id string, wait time.Duration) (tr apitype.Task, ok bool) {
	c.t.Helper()
	path := "/v1/tasks/" + id
	if wait > 0 {
		path += "?wait=" + wait.String()
	}
	code, b, err := c.do("GET", path, nil)
	if err == nil && code == http.StatusNotFound {
		return tr, false
	}
	if err != nil || code != http.StatusOK {
		c.t.Fatalf("GET %s: %d %v: %.300s", path, code, err, b)
	}
	if err := json.Unmarshal(b, &tr); err != nil {
		c.t.Fatal(err)
	}
	return tr, true
}

// batch reads a batch's counts and every item, page by page.
func (c *cluster) batch(id string) apitype.Batch {
	c.t.Helper()
	var all apitype.Batch
	cursor := "0"
	for i := 0; ; i++ {
		var page apitype.Batch
		b := c.must("GET", "/v1/batches/"+id+"?limit=1000&cursor="+cursor, nil, http.StatusOK)
		if err := json.Unmarshal(b, &page); err != nil {
			c.t.Fatal(err)
		}
		if i == 0 {
			all = page
			all.Tasks = nil
		}
		all.Tasks = append(all.Tasks, page.Tasks...)
		if page.NextCursor == nil {
			return all
		}
		cursor = *page.NextCursor
	}
}

// waitBatch long-polls a batch until it is done or d passes, and returns
// its final counts (without items).
func (c *cluster) waitBatch(id string, d time.Duration) apitype.Batch {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		var b apitype.Batch
		wait := min(time.Until(deadline), 30*time.Second).Round(time.Second)
		if wait < time.Second {
			wait = time.Second
		}
		if err := json.Unmarshal(c.must("GET", "/v1/batches/"+id+"?limit=1&wait="+wait.String(), nil, http.StatusOK), &b); err != nil {
			c.t.Fatal(err)
		}
		if b.Done || time.Now().After(deadline) {
			return b
		}
	}
}

// waitTasks polls until every task in ids has ended, or d passes; it
// returns the records (a missing record is absent from the map).
func (c *cluster) waitTasks(ids []string, d time.Duration) map[string]apitype.Task {
	c.t.Helper()
	deadline := time.Now().Add(d)
	out := map[string]apitype.Task{}
	for _, id := range ids {
		for {
			left := time.Until(deadline)
			w := min(left, 20*time.Second).Round(time.Second)
			if w < time.Second {
				w = time.Second
			}
			tr, ok := c.getTask(id, w)
			if !ok {
				break
			}
			out[id] = tr
			if tr.State.Terminal() || time.Now().After(deadline) {
				break
			}
		}
	}
	return out
}

// workerTasksTotal sums puzzleq_tasks_total on a worker's /metrics.
func workerTasksTotal(t *testing.T, w *proc) int {
	t.Helper()
	resp, err := http.Get(w.URL() + "/metrics")
	if err != nil {
		t.Fatalf("%s /metrics: %v", w.Name, err)
	}
	defer resp.Body.Close()
	n := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "puzzleq_tasks_total{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		n += v
	}
	return int(n)
}

// checkTasksTotal asserts that the workers' puzzleq_tasks_total counts
// want ended tasks. A stall or freeze that swallows the reply to a
// worker's finish leaves the task ended in Redis but not counted by that
// worker, which heard nothing; the next delivery finds it ended and counts
// nothing either. So the total may miss a task whose finish failed (the
// worker logs it) and the retried ones that writtenWhileFrozen counts, and
// never counts one twice. It returns the total.
func checkTasksTotal(t *testing.T, when string, want, retried int, workers ...*proc) int {
	t.Helper()
	missable := retried
	for _, p := range workers {
		missable += strings.Count(logText(p.LogPath), "tasks: finish ")
	}
	total := settledTasksTotal(t, want, workers...)
	if total > want || total < want-missable {
		t.Errorf("%s: the workers counted %d ended tasks, want the %d submitted (%d fewer at most: finishes that failed, and %d written while Redis was frozen)", when, total, want, missable, retried)
	}
	return total
}

// writtenWhileFrozen counts the records of recs whose end was written
// while Redis answered nothing (completed_at in [from, to)): completed_at
// is the writer's clock when it sent the write, and go-redis sends a
// write whose reply timed out again, on a new connection. Both copies run
// once Redis is back; the first ends the record, and the worker hears the
// second's answer, "already ended", so it counts nothing, and logs
// nothing either: its call succeeded. A write sent a moment before the
// freeze may not have been read by Redis yet, so the window opens 20 ms
// early; no earlier, since a test's tasks may end in the instant before
// it freezes Redis, and each one the window takes in is one fewer whose
// count is checked.
func writtenWhileFrozen(recs map[string]apitype.Task, from, to time.Time) int {
	from = from.Add(-20 * time.Millisecond)
	n := 0
	for _, r := range recs {
		if r.CompletedAt != nil && !r.CompletedAt.Before(from) && r.CompletedAt.Before(to) {
			n++
		}
	}
	return n
}

// settledTasksTotal returns the sum of workers' puzzleq_tasks_total once
// it has reached want, or what it is after five seconds. A worker counts
// a task after its store write, which is what the test saw end, so the
// last count can trail the records by a moment (under CI's load, once,
// one of 23). An overcount is returned at once: waiting cannot undo it.
func settledTasksTotal(t *testing.T, want int, workers ...*proc) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := 0
		for _, w := range workers {
			n += workerTasksTotal(t, w)
		}
		if n >= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// oracle solves requests locally, once each, for comparing results.
type oracle struct {
	mu   sync.Mutex
	want map[string][]byte // request -> compact result JSON
}

func newOracle() *oracle { return &oracle{want: map[string][]byte{}} }

// expect is the exact result the API must serve for req.
func (o *oracle) expect(t *testing.T, req string) []byte {
	o.mu.Lock()
	w, ok := o.want[req]
	o.mu.Unlock()
	if ok {
		return w
	}
	w = solveLocal(t, req)
	o.mu.Lock()
	o.want[req] = w
	o.mu.Unlock()
	return w
}

// check compares every task's final record with the local solver's answer.
// reqs maps task ID to request. It returns how many records were missing.
func (o *oracle) check(t *testing.T, recs map[string]apitype.Task, reqs map[string]string) {
	t.Helper()
	bad := 0
	for id, req := range reqs {
		tr, ok := recs[id]
		var msg string
		switch {
		case !ok:
			msg = "no record"
		case tr.State != apitype.TaskStateCompleted:
			msg = fmt.Sprintf("state %s, error %+v", tr.State, tr.Error)
		case !bytes.Equal(compact(tr.Result), o.expect(t, req)):
			msg = fmt.Sprintf("result %.200s, want %.200s", tr.Result, o.expect(t, req))
		default:
			continue
		}
		if bad++; bad <= 10 {
			t.Errorf("task %s: %s (request %.120s)", id, msg, req)
		}
	}
	if bad > 10 {
		t.Errorf("... %d tasks wrong in all", bad)
	}
}

func compact(b []byte) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return b
	}
	return buf.Bytes()
}

// checkBatch asserts a done batch counted every item exactly once, and
// returns its records by ID.
func (c *cluster) checkBatch(id string, total int) map[string]apitype.Task {
	c.t.Helper()
	b := c.batch(id)
	want := apitype.Counts{Completed: total}
	if !b.Done || b.Total != total || b.Counts != want || len(b.Tasks) != total {
		c.t.Errorf("batch %s: done=%v total=%d counts=%+v items=%d, want done, %d, %+v", id, b.Done, b.Total, b.Counts, len(b.Tasks), total, want)
	}
	out := make(map[string]apitype.Task, len(b.Tasks))
	for _, tr := range b.Tasks {
		out[tr.ID] = tr
	}
	return out
}

// pollUntil calls f every step until it returns true or d passes.
func pollUntil(d, step time.Duration, f func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if f() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(step)
	}
}

// ctxT is a context that ends with the test.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

// probe is one request of a route, with what it must answer.
type probe struct {
	route        string // the figure's name
	method, path string
	body         []byte
	ok           int // the status of a healthy answer
	// alt is another healthy status (0: none), e.g. 409 for a DELETE
	// that the fault let through before the answer came back.
	alt int
	// reqs are the requests a POST /v1/batches probe carries, so that an
	// accepted batch joins the workload (a POST /v1/tasks probe's request
	// is its body).
	reqs []string
}

// probeResult is a probe's answer.
type probeResult struct {
	code int
	body []byte
	err  error
	took time.Duration
}

// runProbes sends every probe at once and returns the answers by route.
func (c *cluster) runProbes(ps []probe) map[string]probeResult {
	out := make(map[string]probeResult, len(ps))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() {
			start := time.Now()
			code, b, err := c.do(p.method, p.path, p.body)
			r := probeResult{code: code, body: b, err: err, took: time.Since(start)}
			mu.Lock()
			out[p.route] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// figures renders durations by route, sorted by route.
func figures(d map[string]time.Duration) string {
	var parts []string
	for r, v := range d {
		parts = append(parts, fmt.Sprintf("%s=%v", strings.ReplaceAll(r, " ", "_"), v.Round(time.Millisecond)))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// outageBounds is what every route must answer while Redis is out of
// reach (frozen, partitioned): 503 "unavailable" within route, /readyz
// within readyz.
type outageBounds struct {
	route, readyz time.Duration
}

// probeOutage sends the probes of routes(0) and then routes(1) while a
// fault keeps Redis out of reach (the first round meets the pool's
// connections, the second new ones), and fails the test for any answer
// but a 503 "unavailable" within the bounds. what names the fault in
// messages. It returns the slowest answer by route.
func (c *cluster) probeOutage(t *testing.T, what string, routes func(int) []probe, b outageBounds) map[string]time.Duration {
	t.Helper()
	slowest := map[string]time.Duration{}
	for round := range 2 {
		for route, r := range c.runProbes(routes(round)) {
			slowest[route] = max(slowest[route], r.took)
			var e apitype.ErrorBody
			_ = json.Unmarshal(r.body, &e)
			if r.err != nil || r.code != http.StatusServiceUnavailable || e.Error.Code != apitype.CodeUnavailable {
				t.Errorf("%s, round %d: %s: %d %v %.200s, want 503 unavailable", what, round, route, r.code, r.err, r.body)
			}
			limit := b.route
			if route == "GET readyz" {
				limit = b.readyz
			}
			if r.took > limit {
				t.Errorf("%s, round %d: %s answered after %v, want within %v", what, round, route, r.took, limit)
			}
		}
	}
	return slowest
}

// probeRecovery sends, every 50 ms for up to 10 s from since, the probes
// of routes(2) and routes(3) in turn that have not yet answered as a
// healthy route does, and fails the test for any route that did not
// within `within` of since. A POST that is accepted is acknowledged: its
// tasks join w. It returns by route how long after since each answered.
func (c *cluster) probeRecovery(t *testing.T, what string, routes func(int) []probe, w *workload, since time.Time, within time.Duration) map[string]time.Duration {
	t.Helper()
	recovery := map[string]time.Duration{}
	want := len(routes(0))
	for i := 0; len(recovery) < want && time.Since(since) < 10*time.Second; i++ {
		if i > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		byRoute := map[string]probe{}
		var todo []probe
		for _, p := range routes(2 + i%2) {
			if _, ok := recovery[p.route]; !ok {
				todo = append(todo, p)
				byRoute[p.route] = p
			}
		}
		for route, r := range c.runProbes(todo) {
			p := byRoute[route]
			if r.err != nil || (r.code != p.ok && (p.alt == 0 || r.code != p.alt)) {
				continue
			}
			recovery[route] = time.Since(since)
			if p.method != "POST" || r.code != http.StatusAccepted && r.code != http.StatusOK {
				continue
			}
			if p.path == "/v1/batches" {
				id, ids := decodeBatchAck(t, r.body)
				w.batches[id] = len(ids)
				for k, tid := range ids {
					w.reqs[tid] = p.reqs[k]
				}
				continue
			}
			var tr apitype.Task
			if err := json.Unmarshal(r.body, &tr); err != nil {
				t.Fatal(err)
			}
			w.reqs[tr.ID] = string(p.body)
		}
	}
	for _, p := range routes(0) {
		if d, ok := recovery[p.route]; !ok || d > within {
			t.Errorf("%s: %s healthy after %v (ok %v), want within %v", what, p.route, d, ok, within)
		}
	}
	return recovery
}
