//go:build fault

package fault

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
)

// testRedisFreezePastCutoff freezes redis-server (SIGSTOP) for longer
// than WORKER_CUTOFF_AFTER (1 s here; 5 s by default) while both workers' slots
// solve 15-puzzles, one a single task and one an item of a batch, with
// cheap work submitted just before it (which the cheap lane runs beside
// the searches, so some of it is ending when Redis stops) and a client
// streaming the batch's events. Every process loses Redis at once, so:
//
//   - the watchdog must not take the silent workers for dead (a failed
//     read restarts its counts): nothing is re-driven;
//   - each worker stops its running solve once its beats have failed for
//     the cutoff, and then uses no CPU until Redis is back (measured from
//     /proc), and after SIGCONT runs the stopped tasks again (attempts 2)
//     and whatever cheap work the freeze caught;
//   - every acknowledged item ends exactly once: completed with the
//     local solver's answer, each batch counted exactly, the key's quota
//     back to 0, the workers' puzzleq_tasks_total summing to the tasks
//     submitted, and the hard boards' states only moving forward;
//   - the event stream (GET /v1/batches/{id}/events) neither hangs nor
//     lies: the connection open at the freeze ends within the API's call
//     bound, a reconnect while frozen is answered 503, no event claims
//     what the records do not hold (every item event carries the exact
//     answer, progress counts never step back, no done before the end),
//     and the client, reconnecting with Last-Event-ID, sees the batch to
//     its done event with every item.
func testRedisFreezePastCutoff(t *testing.T) {
	const (
		// WORKER_CUTOFF_AFTER, set to its least (two heartbeat
		// intervals) rather than its 5 s default: a solve that started
		// just before the freeze must still run when the cutoff comes,
		// and p75 alone takes as little as 2.4 s on this machine (it
		// once ended 2.7 s into the freeze, before a 5 s cutoff, and
		// was never stopped: CI, 3 December).
		cutoff = time.Second
		freeze = 8 * time.Second
		// idleFrom is when, into the freeze, every worker has stopped
		// its solves: the cutoff counts from the last good beat (up to
		// one 500 ms interval before the freeze) and the stop comes with
		// the next failed beat (each bounded by the interval).
		idleFrom = cutoff + 1500*time.Millisecond
		// streamBound is how soon after the freeze the open stream must
		// end: its next read of the batch fails at the API's call bound
		// (2 s) after at most one poll interval (500 ms).
		streamBound = 4 * time.Second
	)
	o := newOracle()
	// 4.2 s and 3.5 s of CPU (measured on 1 December; 2.4 s or more for
	// p75 since): each still solving when the cutoff comes (checked
	// below), and short enough to solve twice.
	single, item := hardSet(t, "p76")[0], hardSet(t, "p75")[0]
	expectHard(t, o, []hard15{single, item})
	c := newCluster(t, clusterOpts{
		authed:  true,
		api:     map[string]string{"CHUNK_SIZE": "8"},
		worker:  withPDB(map[string]string{"WORKER_CONCURRENCY": "1", "WORKER_CUTOFF_AFTER": cutoff.String()}),
		workers: 2,
	})
	for _, wp := range c.workers {
		waitReady(t, wp)
	}
	w := newWorkload()
	// The batch first: a chunk of 8 cheap items (indexes 0-7, ended
	// before the freeze, so the stream's watermark moves past them) and
	// the board in its own unit (index 8); the two idle workers take one
	// unit each, so neither waits behind the other. Then the single,
	// for the slot the chunk leaves.
	cheap := eightPuzzles(21, 991)
	ids := w.addBatch(c, append(append([]string{}, cheap[:8]...), item.req))
	batchID := ids[0][:strings.IndexByte(ids[0], '-')]
	if !pollUntil(30*time.Second, 10*time.Millisecond, func() bool { return c.batch(batchID).Counts.Completed >= 8 }) {
		t.Fatalf("precondition: the batch's cheap chunk did not end: %+v", c.batch(batchID).Counts)
	}
	hard := w.addHardSingles(c, []hard15{single})
	hard[ids[8]] = item
	watch := map[string]*stateRecorder{}
	for id := range hard {
		watch[id] = c.recordStates(t, id)
	}
	stream := startEventClient(t, c, batchID)

	waitHardBusy(t, c, 2, hard, 60*time.Second, nil)
	// The cheap items ended and the stream sent them: its watermark, the
	// id a reconnect resumes from, is 8.
	if !pollUntil(30*time.Second, 10*time.Millisecond, func() bool { return stream.lastID() == 8 }) {
		t.Fatalf("precondition: the stream's last id is %d, want 8 (the cheap items sent); batch %+v", stream.lastID(), c.waitBatch(batchID, time.Second).Counts)
	}
	// Cheap work, which the cheap lanes run beside the boards: some of it
	// is still running or writing its end when Redis stops.
	w.addBatch(c, cheap[8:16])
	for _, r := range cheap[16:] {
		w.addTask(c, r)
	}
	before := map[string]apitype.Task{}
	for id := range hard {
		before[id], _ = c.getTask(id, 0)
		if before[id].State != apitype.TaskStateActive {
			t.Fatalf("precondition: %s is %s at the freeze, want active", hard[id].name, before[id].State)
		}
	}
	total0 := 0
	for _, wp := range c.workers {
		total0 += workerTasksTotal(t, wp)
	}

	cpuAt := func() []time.Duration {
		out := make([]time.Duration, len(c.workers))
		for i, wp := range c.workers {
			out[i] = procCPU(t, wp.PID())
		}
		return out
	}
	cpu0 := cpuAt()
	frozenAt := time.Now() // before SIGSTOP: no write after it is read
	thaw := c.freezeRedis(t)
	defer thaw()
	time.Sleep(time.Until(frozenAt.Add(4 * time.Second)))
	cpu4 := cpuAt() // the solves still run, cut off or not
	time.Sleep(time.Until(frozenAt.Add(idleFrom)))
	cpuIdle := cpuAt()
	time.Sleep(time.Until(frozenAt.Add(freeze)))
	cpuEnd := cpuAt()
	for _, p := range append([]*proc{c.api}, c.workers...) {
		if p.Exited() {
			t.Fatalf("%s exited while Redis was frozen: %v", p.Name, p.Err())
		}
	}
	thaw()
	thawedAt := time.Now()

	all := w.verify(t, c, o, 90*time.Second)
	checkHardRecords(t, all, hard)
	for id, h := range hard {
		if tr := all[id]; tr.Attempts < 2 || tr.CompletedAt == nil || !tr.CompletedAt.After(thawedAt) {
			t.Errorf("%s (task %s): attempts %d, completed %v; want stopped during the freeze and run again after it (attempts 2 or more, completed after SIGCONT at %s)",
				h.name, id, tr.Attempts, tr.CompletedAt, thawedAt.Format(time.StampMilli))
		}
	}
	for id, r := range watch {
		r.check(t, hard[id].name)
	}
	c.checkQuota(t, "after the freeze, every task ended")
	retried := writtenWhileFrozen(all, frozenAt, thawedAt)
	counted := checkTasksTotal(t, fmt.Sprintf("after the freeze (%d counted before it)", total0), len(w.reqs), retried, c.workers...)

	// Each worker stopped its one solve, once, and used (next to) no CPU
	// from then until SIGCONT; before the cutoff it was solving. The stop
	// may also take cheap-lane tasks that were running beside the solve.
	var solving, idle []string
	for i, wp := range c.workers {
		log := logText(wp.LogPath)
		n := strings.Count(log, "stopping the running tasks")
		m := regexp.MustCompile(`stopping the running tasks.* tasks=(\d+)`).FindStringSubmatch(log)
		if n != 1 || m == nil || m[1] == "0" {
			t.Errorf("%s: %d cutoff stops in its log (%v), want exactly 1, of its running solve and any cheap tasks beside it", wp.Name, n, m)
		}
		busy, still := cpu4[i]-cpu0[i], cpuEnd[i]-cpuIdle[i]
		solving = append(solving, busy.Round(time.Millisecond).String())
		idle = append(idle, still.Round(time.Millisecond).String())
		if busy < 100*time.Millisecond { // idle, a worker uses a few ms
			t.Errorf("%s used %v of CPU in the first 4 s of the freeze: it was not solving when cut off", wp.Name, busy)
		}
		if still > 150*time.Millisecond {
			t.Errorf("%s used %v of CPU from %v into the freeze until SIGCONT: it did not stop solving while cut off", wp.Name, still, idleFrom)
		}
	}
	if n := strings.Count(logText(c.api.LogPath), "re-drove the tasks of a dead worker"); n != 0 {
		t.Errorf("the watchdog re-drove %d workers' tasks: a Redis freeze seen by every process was taken for their death", n)
	}

	ev := stream.wait(t, 60*time.Second)
	ev.check(t, c, o, w, batchID, frozenAt, thawedAt, streamBound)
	t.Logf("redis freeze past the cutoff: FIGURES freeze=%v cutoff=%v tasks=%d counted=%d written_while_frozen=%d held=%d worker_cpu_first_4s=%v worker_cpu_from_%v_to_sigcont=%v redrives=0 all_done_after_sigcont=%.2fs",
		freeze, cutoff, len(w.reqs), counted, retried, len(hard), solving, idleFrom, idle, lastCompleted(all).Sub(thawedAt).Seconds())
	t.Logf("events through the freeze: FIGURES connections=%d open_stream_ended_after_freeze=%v reconnects_while_frozen=%d (503, slowest %v) first_event_after_sigcont=%v done_after_sigcont=%v resumed_from=%v items=%d item_events=%d",
		len(ev.conns), ev.endedAfterFreeze.Round(time.Millisecond), ev.frozenTries, ev.slowestFrozen.Round(time.Millisecond),
		ev.firstAfterThaw.Round(time.Millisecond), ev.doneAfterThaw.Round(time.Millisecond), ev.resumes, ev.total, ev.itemEvents)
}

// lastCompleted is the latest completed_at of recs.
func lastCompleted(recs map[string]apitype.Task) time.Time {
	var last time.Time
	for _, tr := range recs {
		if tr.CompletedAt != nil && tr.CompletedAt.After(last) {
			last = *tr.CompletedAt
		}
	}
	return last
}

// procCPU is the CPU time (user and system) process pid has used.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatalf("CPU of pid %d: %v", pid, err)
	}
	// The command may hold spaces: the fields after it follow the last ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("CPU of pid %d: %q", pid, b)
	}
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks
}

// sseEvent is one event a stream sent.
type sseEvent struct {
	conn       int // which connection carried it
	id         int // -1: none
	name, data string
	at         time.Time
}

// sseConn is one connection of the event client.
type sseConn struct {
	from       int // the Last-Event-ID it sent (-1: none)
	code       int
	err        error
	start, end time.Time
	done       bool // it carried the done event
}

// eventClient follows a batch's event stream as EventSource does:
// reconnecting after the stream's retry delay, with the last event id
// as Last-Event-ID, until the done event.
type eventClient struct {
	mu     sync.Mutex
	events []sseEvent
	conns  []sseConn
	fin    chan struct{}
}

func startEventClient(t *testing.T, c *cluster, batchID string) *eventClient {
	ec := &eventClient{fin: make(chan struct{})}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop); <-ec.fin })
	hc := &http.Client{Timeout: 90 * time.Second} // bounds a stream that would hang
	go func() {
		defer close(ec.fin)
		last, retry := -1, 2*time.Second
		for n := 0; n < 100; n++ {
			req, err := http.NewRequest("GET", c.api.URL()+"/v1/batches/"+batchID+"/events", nil)
			if err != nil {
				return
			}
			req.Header.Set("Authorization", "Bearer "+c.key)
			if last >= 0 {
				req.Header.Set("Last-Event-ID", strconv.Itoa(last))
			}
			cn := sseConn{from: last, start: time.Now()}
			resp, err := hc.Do(req)
			if err == nil {
				cn.code = resp.StatusCode
				if resp.StatusCode == http.StatusOK {
					var r int
					last, r, cn.done, cn.err = ec.read(n, resp, last)
					if r > 0 {
						retry = time.Duration(r) * time.Millisecond
					}
				}
				resp.Body.Close()
			} else {
				cn.err = err
			}
			cn.end = time.Now()
			ec.mu.Lock()
			ec.conns = append(ec.conns, cn)
			ec.mu.Unlock()
			if cn.done {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(retry):
			}
		}
	}()
	return ec
}

// lastID is the id of the last event with one (-1: none yet).
func (ec *eventClient) lastID() int {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	for i := len(ec.events) - 1; i >= 0; i-- {
		if ec.events[i].id >= 0 {
			return ec.events[i].id
		}
	}
	return -1
}

// read reads one connection's events; it returns the last event id, the
// retry delay asked for (0: none) and whether the done event came.
func (ec *eventClient) read(conn int, resp *http.Response, last int) (int, int, bool, error) {
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	ev := sseEvent{conn: conn, id: -1}
	var data []string
	retry := 0
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.name != "" {
				ev.data, ev.at = strings.Join(data, "\n"), time.Now()
				if ev.id >= 0 {
					last = ev.id
				}
				ec.mu.Lock()
				ec.events = append(ec.events, ev)
				ec.mu.Unlock()
				if ev.name == "done" {
					return last, retry, true, nil
				}
			}
			ev, data = sseEvent{conn: conn, id: -1}, nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "retry: "):
			retry, _ = strconv.Atoi(strings.TrimPrefix(line, "retry: "))
		case strings.HasPrefix(line, "id: "):
			ev.id, _ = strconv.Atoi(strings.TrimPrefix(line, "id: "))
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		}
	}
	return last, retry, false, sc.Err()
}

// eventReport is what the event client saw, summed up by check.
type eventReport struct {
	events           []sseEvent
	conns            []sseConn
	total            int
	itemEvents       int
	endedAfterFreeze time.Duration
	frozenTries      int
	slowestFrozen    time.Duration
	firstAfterThaw   time.Duration
	doneAfterThaw    time.Duration
	resumes          []int
}

// wait waits up to d for the client to see the done event.
func (ec *eventClient) wait(t *testing.T, d time.Duration) *eventReport {
	t.Helper()
	select {
	case <-ec.fin:
	case <-time.After(d):
		t.Errorf("the event stream did not reach its done event within %v", d)
	}
	ec.mu.Lock()
	defer ec.mu.Unlock()
	return &eventReport{events: append([]sseEvent(nil), ec.events...), conns: append([]sseConn(nil), ec.conns...)}
}

// check holds what the stream sent to the records.
func (r *eventReport) check(t *testing.T, c *cluster, o *oracle, w *workload, batchID string, frozenAt, thawedAt time.Time, streamBound time.Duration) {
	t.Helper()
	b := c.batch(batchID)
	r.total = b.Total
	byIndex := map[int]apitype.Task{}
	for _, tr := range b.Tasks {
		if i, err := strconv.Atoi(tr.ID[strings.LastIndexByte(tr.ID, '-')+1:]); err == nil {
			byIndex[i] = tr
		}
	}
	seen := map[int]bool{}
	var lastProgress *apitype.BatchProgress
	done := 0
	for _, ev := range r.events {
		switch ev.name {
		case "item":
			r.itemEvents++
			var ie apitype.ItemEvent
			if err := json.Unmarshal([]byte(ev.data), &ie); err != nil {
				t.Errorf("item event %q: %v", ev.data, err)
				continue
			}
			seen[ie.Index] = true
			tr, ok := byIndex[ie.Index]
			if from := r.conns[ev.conn].from; from > 0 && ie.Index < from {
				t.Errorf("connection %d resumed from %d and sent item %d again, below its Last-Event-ID", ev.conn, from, ie.Index)
			}
			if !ok {
				t.Errorf("item event %.300s: no item %d in the batch", ev.data, ie.Index)
				continue
			}
			want := o.expect(t, w.reqs[tr.ID])
			if ie.ID != tr.ID || ie.State != apitype.TaskStateCompleted || !bytes.Equal(compact(ie.Result), want) {
				t.Errorf("item event %.300s: want item %d (%s) completed with %.200s", ev.data, ie.Index, tr.ID, want)
			}
		case "progress", "done":
			var p apitype.BatchProgress
			if err := json.Unmarshal([]byte(ev.data), &p); err != nil {
				t.Errorf("%s event %q: %v", ev.name, ev.data, err)
				continue
			}
			cs := p.Counts
			if cs.Pending+cs.Active+cs.Completed+cs.Failed+cs.Canceled != b.Total || cs.Failed+cs.Canceled != 0 {
				t.Errorf("%s event %.300s: counts do not add up to the batch's %d tasks, or count failures that never were", ev.name, ev.data, b.Total)
			}
			if lastProgress != nil && cs.Completed < lastProgress.Counts.Completed {
				t.Errorf("%s event %.300s: completed stepped back from %d", ev.name, ev.data, lastProgress.Counts.Completed)
			}
			if ev.name == "done" {
				done++
				if !p.Done || cs != (apitype.Counts{Completed: b.Total}) {
					t.Errorf("done event %.300s, want done with all %d completed", ev.data, b.Total)
				}
			} else if p.Done && cs.Completed != b.Total {
				t.Errorf("progress event %.300s says done before every task ended", ev.data)
			}
			lastProgress = &p
		}
	}
	if done != 1 {
		t.Errorf("%d done events, want 1", done)
	}
	for i := range b.Total {
		if !seen[i] {
			t.Errorf("item %d never sent as an event", i)
		}
	}
	// The connection open at the freeze ended within the bound, a
	// reconnect while frozen was answered 503 at once, and after SIGCONT
	// a connection carried the rest.
	var open *sseConn
	for i := range r.conns {
		cn := &r.conns[i]
		if cn.start.Before(frozenAt) && cn.end.After(frozenAt) {
			open = cn
		}
		// A reconnect that started 2.5 s or less before SIGCONT may
		// have been answered by a Redis awake again.
		if cn.start.After(frozenAt) && cn.start.Before(thawedAt.Add(-2500*time.Millisecond)) {
			r.frozenTries++
			took := cn.end.Sub(cn.start)
			r.slowestFrozen = max(r.slowestFrozen, took)
			if cn.code != http.StatusServiceUnavailable || took > 2500*time.Millisecond {
				t.Errorf("a reconnect while Redis was frozen: %d %v after %v, want 503 within 2.5 s", cn.code, cn.err, took)
			}
		}
		if cn.from >= 0 {
			r.resumes = append(r.resumes, cn.from)
		}
	}
	if open == nil {
		t.Errorf("no stream was open when Redis froze: %+v", r.conns)
	} else {
		r.endedAfterFreeze = open.end.Sub(frozenAt)
		if r.endedAfterFreeze > streamBound || open.done {
			t.Errorf("the stream open at the freeze ended %v after it (done %v), want it cut within %v, without a done", r.endedAfterFreeze, open.done, streamBound)
		}
	}
	if r.frozenTries == 0 {
		t.Errorf("the client never reconnected while Redis was frozen: %+v", r.conns)
	}
	for _, ev := range r.events {
		if ev.at.After(thawedAt) {
			if r.firstAfterThaw == 0 {
				r.firstAfterThaw = ev.at.Sub(thawedAt)
			}
			if ev.name == "done" {
				r.doneAfterThaw = ev.at.Sub(thawedAt)
			}
		}
	}
	if len(r.resumes) == 0 || r.resumes[len(r.resumes)-1] != 8 {
		t.Errorf("the client resumed from %v, want the last resume from 8 (the cheap items ended and sent before the freeze)", r.resumes)
	}
	if r.firstAfterThaw == 0 || r.doneAfterThaw == 0 {
		t.Errorf("after SIGCONT: first event %v, done %v; want both", r.firstAfterThaw, r.doneAfterThaw)
	}
}
