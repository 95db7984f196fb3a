//go:build fault

package fault

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/tasks"
)

// Every fault below is injected while the worker slots it is aimed at are
// busy with long 15-puzzles, and each scenario checks afterwards that this
// held. The other kinds (8-puzzles, fills, the sweep corpus) take
// milliseconds now, so a test that waited to catch them running saw idle
// slots on a quiet machine (issue 15). The 15-puzzle is real work whose
// length is known: IDA* on a board of 72-76 moves searches 6-90 M nodes.

// hardest80 is one of the 17 hardest 15-puzzle positions, 80 moves from
// the goal 1..15 with the blank last (TestKorf80 in solvers/sliding), and
// hardest80Path the 80-move solution IDA* finds for it (1.1 G nodes, about
// a minute of CPU: too slow to solve here). The board k moves along this
// path is exactly 80-k moves from the goal: no fewer, or the position
// would have a solution shorter than 80. So these boards come with their
// optimal length known without the solver under test.
const (
	hardest80     = "0 12 9 13 15 11 10 14 3 7 2 5 4 8 6 1"
	hardest80Path = "DDDRRRUULLDLDRRRUULULDDRULDLDRRURULURDLULDDRULLURDLDDRRURULLLDDRRRULUULLDDDRRURD"
)

// hard15 is a 15-puzzle whose solve holds a worker slot for a while.
//
// Names: "p74" is the board 74 moves from the goal on hardest80Path,
// "k88" Korf's random instance #88 (solvers/sliding/testdata, converted
// to our goal); a "t" suffix is the board transposed (cells and tile
// names reflected along the main diagonal, which maps goal to goal and
// moves to moves: the same length, a different board and cache key).
// CPU of one solve by the service's solver with the databases loaded,
// measured on this 2-vCPU machine on 2026-12-01 (a faster machine needs
// proportionally less; every use below leaves a margin of several times):
//
//	p76 4.2 s  p75 3.5 s  p76t 2.5 s  p74 1.6 s  p73 1.3 s  p75t 1.1 s
//	p72 0.57 s  p73t 0.52 s  p74t 0.52 s  p72t 0.34 s
//	k88 0.25 s  k88t 0.25 s  k15 0.22 s  k59t 0.22 s  k82t 0.17 s  k17 0.16 s
//	k32 0.16 s  k60 0.15 s  k56t 0.13 s  k22 0.12 s  k49 0.12 s  k26t 0.12 s
type hard15 struct {
	name  string
	tiles [16]int // row-major, 0 the blank
	moves int     // optimal length
	req   string
}

var (
	hardOnce  sync.Once
	hardByKey map[string]hard15
	hardErr   error
)

// loadHard builds every named board: the path boards p72 to p76 and
// Korf's 100, each also transposed.
func loadHard() (map[string]hard15, error) {
	hardOnce.Do(func() {
		hardByKey = map[string]hard15{}
		add := func(name string, tiles [16]int, moves int) {
			hardByKey[name] = newHard15(name, tiles, moves)
			hardByKey[name+"t"] = newHard15(name+"t", transpose15(tiles), moves)
		}
		b, err := parseTiles(hardest80)
		if err != nil {
			hardErr = err
			return
		}
		if end, err := replay15(b, hardest80Path); err != nil || end != goal15 || len(hardest80Path) != 80 {
			hardErr = fmt.Errorf("hardest80Path (%d moves) does not take %s to the goal: %v", len(hardest80Path), hardest80, err)
			return
		}
		for k, m := range hardest80Path[:8] {
			b, _ = replay15(b, string(m))
			if k+1 >= 4 {
				add(fmt.Sprintf("p%d", 80-(k+1)), b, 80-(k+1))
			}
		}
		f, err := os.Open("../../solvers/sliding/testdata/korf100_goal_1to15_blank_last.tsv")
		if err != nil {
			hardErr = err
			return
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Scan() // header: id, tiles, optimal_length
		for sc.Scan() {
			col := strings.Split(sc.Text(), "\t")
			if len(col) != 3 {
				hardErr = fmt.Errorf("korf100 line %q: want 3 columns", sc.Text())
				return
			}
			tiles, err := parseTiles(col[1])
			moves, err2 := strconv.Atoi(col[2])
			if err != nil || err2 != nil {
				hardErr = fmt.Errorf("korf100 line %q: %v %v", sc.Text(), err, err2)
				return
			}
			add("k"+col[0], tiles, moves)
		}
		hardErr = sc.Err()
	})
	return hardByKey, hardErr
}

// hardSet returns the named boards and starts solving them locally in the
// background (once per board and suite run), so the oracle's answers are
// ready by the time a scenario checks its results.
func hardSet(t *testing.T, names ...string) []hard15 {
	t.Helper()
	ensurePDB(t)
	out := boards(t, names...)
	go func() {
		for _, h := range out {
			localAnswer(h)
		}
	}()
	return out
}

// boards returns the named boards of loadHard without starting local
// solves (hardSet's): the scenario checks answers by their known optimal
// length and by replaying the path, and a local solve would take CPU from
// what it measures.
func boards(t *testing.T, names ...string) []hard15 {
	t.Helper()
	all, err := loadHard()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]hard15, len(names))
	for i, n := range names {
		h, ok := all[n]
		if !ok {
			t.Fatalf("no hard board %q", n)
		}
		out[i] = h
	}
	return out
}

func newHard15(name string, tiles [16]int, moves int) hard15 {
	rows := make([]string, 4)
	for r := range rows {
		rows[r] = fmt.Sprintf("[%d,%d,%d,%d]", tiles[4*r], tiles[4*r+1], tiles[4*r+2], tiles[4*r+3])
	}
	return hard15{name: name, tiles: tiles, moves: moves,
		req: `{"kind":"sliding","puzzle":{"board":[` + strings.Join(rows, ",") + `]}}`}
}

var goal15 = [16]int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0}

func parseTiles(s string) ([16]int, error) {
	var b [16]int
	f := strings.Fields(s)
	if len(f) != 16 {
		return b, fmt.Errorf("board %q: %d tiles, want 16", s, len(f))
	}
	seen := 0
	for i, x := range f {
		v, err := strconv.Atoi(x)
		if err != nil || v < 0 || v > 15 || seen&(1<<v) != 0 {
			return b, fmt.Errorf("board %q: bad or repeated tile %q", s, x)
		}
		seen |= 1 << v
		b[i] = v
	}
	return b, nil
}

// transpose15 reflects a board along its main diagonal: cell (r, c) goes
// to (c, r) and tile v, whose goal cell is (r0, c0), is renamed after the
// goal cell (c0, r0).
func transpose15(b [16]int) [16]int {
	var out [16]int
	for r := 0; r < 4; r++ {
		for c := 0; c < 4; c++ {
			v := b[4*r+c]
			if v != 0 {
				r0, c0 := (v-1)/4, (v-1)%4
				v = 4*c0 + r0 + 1
			}
			out[4*c+r] = v
		}
	}
	return out
}

// replay15 moves the blank of b along path (U, D, L, R).
func replay15(b [16]int, path string) ([16]int, error) {
	z := -1
	for i, v := range b {
		if v == 0 {
			z = i
		}
	}
	for i, m := range path {
		r, c := z/4, z%4
		switch {
		case m == 'U' && r > 0:
			r--
		case m == 'D' && r < 3:
			r++
		case m == 'L' && c > 0:
			c--
		case m == 'R' && c < 3:
			c++
		default:
			return b, fmt.Errorf("move %d (%q) leaves the board or is no move", i, m)
		}
		n := 4*r + c
		b[z], b[n] = b[n], b[z]
		z = n
	}
	return b, nil
}

// localAnswers memoizes the local solver's answer per board: several
// scenarios use the same boards, and a solve costs up to seconds.
var localAnswers sync.Map // request -> *localAnswerEntry

type localAnswerEntry struct {
	once sync.Once
	res  []byte
	err  error
}

// solveLocalErr is solveLocal for goroutines that are not the test's.
func solveLocalErr(req string) ([]byte, error) {
	p, err := puzzle.Decode([]byte(req))
	if err != nil {
		return nil, err
	}
	res, err := p.WithMaxNodes(workerLimits.MaxNodes[p.Kind()]).Solve(context.Background())
	if err != nil {
		return nil, err
	}
	return compact(res), nil
}

func localAnswer(h hard15) ([]byte, error) {
	e, _ := localAnswers.LoadOrStore(h.req, &localAnswerEntry{})
	le := e.(*localAnswerEntry)
	le.once.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				le.err = fmt.Errorf("panic: %v", r)
			}
		}()
		le.res, le.err = solveLocalErr(h.req)
	})
	return le.res, le.err
}

// expectHard checks each board's local answer against what is known
// about it without the solver (its optimal length; the path must replay
// to the goal) and hands it to o, so the scenario's final check holds
// the service to both.
func expectHard(t *testing.T, o *oracle, hs []hard15) {
	t.Helper()
	for _, h := range hs {
		res, err := localAnswer(h)
		if err != nil {
			t.Fatalf("%s: local solve: %v", h.name, err)
		}
		if msg := h.check(res); msg != "" {
			t.Fatalf("%s: the local solver's answer %s: %s", h.name, res, msg)
		}
		o.mu.Lock()
		o.want[h.req] = res
		o.mu.Unlock()
	}
}

// check returns what is wrong with res as the answer to h, or "".
func (h hard15) check(res []byte) string {
	var r struct {
		Moves    int    `json:"moves"`
		Solvable bool   `json:"solvable"`
		Path     string `json:"path"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return err.Error()
	}
	if !r.Solvable || r.Moves != h.moves || len(r.Path) != h.moves {
		return fmt.Sprintf("%d moves (path of %d, solvable %v), want the optimum %d", r.Moves, len(r.Path), r.Solvable, h.moves)
	}
	if end, err := replay15(h.tiles, r.Path); err != nil || end != goal15 {
		return fmt.Sprintf("the path does not reach the goal (%v, ends at %v)", err, end)
	}
	return ""
}

// checkHardRecords holds every hard board's final record to the exact
// answer: completed, the optimal length, a path that replays to the goal.
func checkHardRecords(t *testing.T, recs map[string]apitype.Task, hard map[string]hard15) {
	t.Helper()
	for id, h := range hard {
		tr, ok := recs[id]
		switch {
		case !ok:
			t.Errorf("%s (task %s): no record", h.name, id)
		case tr.State != apitype.TaskStateCompleted:
			t.Errorf("%s (task %s): state %s, error %+v", h.name, id, tr.State, tr.Error)
		default:
			if msg := h.check(tr.Result); msg != "" {
				t.Errorf("%s (task %s): answer %.200s: %s", h.name, id, tr.Result, msg)
			}
		}
	}
}

// addHardBatch submits hs as one batch (one asynq task each, in the bulk
// queue, in this order) and returns the boards by task ID.
func (w *workload) addHardBatch(c *cluster, hs []hard15) map[string]hard15 {
	reqs := make([]string, len(hs))
	for i, h := range hs {
		reqs[i] = h.req
	}
	out := map[string]hard15{}
	for i, id := range w.addBatch(c, reqs) {
		out[id] = hs[i]
	}
	return out
}

// addHardSingles submits hs one by one (the interactive queue, in order).
func (w *workload) addHardSingles(c *cluster, hs []hard15) map[string]hard15 {
	out := map[string]hard15{}
	for _, h := range hs {
		out[w.addTask(c, h.req)] = h
	}
	return out
}

// hardOf returns the board an asynq task solves, if it is one of hard.
func hardOf(ti *asynq.TaskInfo, hard map[string]hard15) (hard15, bool) {
	if ti.Type != tasks.TypeSliding && ti.Type != tasks.TypeUnit {
		return hard15{}, false
	}
	ids := itemsOf(ti) // a single, or a batch item in its own unit
	if len(ids) != 1 {
		return hard15{}, false
	}
	h, ok := hard[ids[0]]
	return h, ok
}

// waitHardBusy waits until exactly slots asynq tasks are active on the
// solver slots (the cheap lane's run beside them and do not count), every
// one of them a board of hard, and more holds too (nil: nothing more). It
// returns the active tasks. When d passes it fails the test with what it
// saw last: the active tasks, the queues and the hard boards' states.
func waitHardBusy(t *testing.T, c *cluster, slots int, hard map[string]hard15, d time.Duration, more func() (bool, string)) []*asynq.TaskInfo {
	t.Helper()
	active, _ := waitHardBusyAt(t, c, slots, hard, d, more)
	return active
}

// waitHardBusyAt is waitHardBusy that also returns when the active tasks
// it returns were read: a board that ended after that read may have
// ended before the caller's next step (more, the log line and the
// caller's own work come between).
func waitHardBusyAt(t *testing.T, c *cluster, slots int, hard map[string]hard15, d time.Duration, more func() (bool, string)) ([]*asynq.TaskInfo, time.Time) {
	t.Helper()
	var active []*asynq.TaskInfo
	var extra string
	var seen time.Time
	start := time.Now()
	ok := pollUntil(d, 5*time.Millisecond, func() bool {
		seen = time.Now()
		active = c.solverActive()
		if len(active) != slots {
			return false
		}
		for _, ti := range active {
			if _, ok := hardOf(ti, hard); !ok {
				return false
			}
		}
		if more == nil {
			return true
		}
		var ok bool
		ok, extra = more()
		return ok
	})
	if !ok {
		t.Fatalf("never saw all %d slots busy with the hard boards within %v: last saw %s; %s; hard boards %s; %s",
			slots, d, describeActive(active, hard), c.describeQueues(), c.hardStates(hard), extra)
	}
	t.Logf("all %d slots busy with hard boards %v after %v; %s", slots, hardNames(active, hard),
		time.Since(start).Round(time.Millisecond), c.describeQueues())
	return active, seen
}

// describeActive renders active asynq tasks: hard boards by name, the
// rest by type.
func describeActive(active []*asynq.TaskInfo, hard map[string]hard15) string {
	var parts []string
	for _, ti := range active {
		if h, ok := hardOf(ti, hard); ok {
			parts = append(parts, h.name)
		} else {
			parts = append(parts, fmt.Sprintf("%s(%s)", ti.Type, ti.ID))
		}
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d active %v", len(active), parts)
}

func hardNames(active []*asynq.TaskInfo, hard map[string]hard15) []string {
	var out []string
	for _, ti := range active {
		if h, ok := hardOf(ti, hard); ok {
			out = append(out, h.name)
		}
	}
	sort.Strings(out)
	return out
}

// describeQueues renders asynq's queue sizes.
func (c *cluster) describeQueues() string {
	var parts []string
	for _, q := range solveQueues {
		qi, err := c.insp.GetQueueInfo(q)
		if err != nil {
			parts = append(parts, fmt.Sprintf("%s: %v", q, err))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s pending=%d active=%d retry=%d scheduled=%d processed=%d",
			q, qi.Pending, qi.Active, qi.Retry, qi.Scheduled, qi.ProcessedTotal))
	}
	return "queues: " + strings.Join(parts, ", ")
}

// hardStates counts the hard boards' records by state, naming the ones
// that already ended.
func (c *cluster) hardStates(hard map[string]hard15) string {
	c.t.Helper()
	n := map[string]int{}
	var ended []string
	for id, h := range hard {
		tr, ok := c.getTask(id, 0)
		switch {
		case !ok:
			n["missing"]++
		default:
			n[string(tr.State)]++
			if tr.State.Terminal() {
				ended = append(ended, h.name)
			}
		}
	}
	sort.Strings(ended)
	return fmt.Sprintf("%v (ended: %v)", n, ended)
}

// timed logs, when the test ends (its clusters stopped), how long it took.
func timed(t *testing.T) {
	start := time.Now()
	t.Cleanup(func() { t.Logf("TIME %s took %v", t.Name(), time.Since(start).Round(100*time.Millisecond)) })
}

// pdbDir holds the 15-puzzle's pattern databases, built once per suite
// run by the first test that needs them (ensurePDB) and removed when the
// suite ends; workers that get withPDB load them from there in
// milliseconds instead of building them (6 s of CPU per process).
var pdbDir string

var (
	pdbOnce sync.Once
	pdbErr  error
	pdbTook time.Duration
)

// ensurePDB builds the pattern databases into pdbDir, once for the whole
// suite (10-15 s on the shared machine; 40-46 s under extra load), and
// logs how long that took in the test that paid for it.
func ensurePDB(t *testing.T) {
	t.Helper()
	built := false
	pdbOnce.Do(func() {
		built = true
		if pdbDir == "" {
			pdbErr = fmt.Errorf("no directory for the pattern databases (TestMain makes it)")
			return
		}
		start := time.Now()
		pdbErr = sliding.Preload(context.Background(), pdbDir)
		pdbTook = time.Since(start)
	})
	if pdbErr != nil {
		t.Fatalf("build the pattern databases into %s: %v", pdbDir, pdbErr)
	}
	if built {
		t.Logf("built the pattern databases in %v", pdbTook.Round(100*time.Millisecond))
	}
}

// withPDB returns env with the settings that make a worker load the
// pattern databases from pdbDir at start (readiness waits for it).
func withPDB(env map[string]string) map[string]string {
	out := map[string]string{"PDB_DIR": pdbDir, "PDB_PRELOAD": "true"}
	for k, v := range env {
		out[k] = v
	}
	return out
}
