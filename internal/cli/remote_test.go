package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/internal/cli"
	"github.com/puzzleq/puzzleq/puzzle"
)

func runCtx(ctx context.Context, stdin string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := cli.Run(ctx, args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// slidingLines returns n distinct 3x3 sliding requests (random
// permutations: about half are unsolvable, answered -1), one per line.
func slidingLines(n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 1))
	seen := map[[9]int]bool{}
	var out []string
	for len(out) < n {
		var p [9]int
		for i := range p {
			p[i] = i
		}
		rng.Shuffle(9, func(i, j int) { p[i], p[j] = p[j], p[i] })
		if seen[p] {
			continue
		}
		seen[p] = true
		out = append(out, fmt.Sprintf(`{"kind":"sliding","puzzle":{"board":[[%d,%d,%d],[%d,%d,%d],[%d,%d,%d]]}}`,
			p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]))
	}
	return out
}

func writeLines(t *testing.T, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "jobs.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// closedURL is an address nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func TestRemoteSolveMatchesLocal(t *testing.T) {
	t.Parallel()
	s := startStack(t, 1)
	s.requireBatchNDJSON()
	var jsonIn strings.Builder
	for _, l := range slidingLines(50, 7) {
		jsonIn.WriteString(l + "\n")
	}
	jsonIn.WriteString(`{"kind":"sweep","puzzle":{"board":["**...",".....","....*","..*..","....."]}}` + "\n\n")
	jsonIn.WriteString(`{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[0,1]]}}` + "\n")
	for _, tc := range []struct{ format, in string }{
		{"boj1525", "1 0 3\n4 2 5\n7 8 6\n"},
		{"boj1525", "3 6 0\n8 1 2\n7 4 5\n"}, // unsolvable: -1
		{"boj1525", "1 2 3\r\n4 5 6\r\n7 8 0\r\n"},
		{"boj1525", "8 6 7\n2 5 4\n3 0 1\n"}, // 31 moves, the hardest
		{"boj9944", "5 5\n**...\n.....\n....*\n..*..\n.....\n3 4\n****\n*...\n*..*\n"},
		{"boj9944", "1 1\n.\n2 2\n.*\n*.\n"},
		{"p84021", p84021Sample},
		{"p84021", `{"game_board":[[0,0,0],[1,1,0],[1,1,1]],"table":[[1,1,1],[1,0,0],[0,0,0]]}`},
		{"json", jsonIn.String()},
	} {
		lcode, lout, lerr := run(t, tc.in, "solve", "--local", "--format", tc.format)
		rcode, rout, rerr := run(t, tc.in, "solve", "--server", s.base, "--format", tc.format)
		if lcode != 0 || rcode != 0 || lout != rout || lout == "" {
			t.Errorf("%s %.40q: local exit %d %q (%s), remote exit %d %q (%s)", tc.format, tc.in, lcode, lout, lerr, rcode, rout, rerr)
		}
	}
	// Bad input fails remotely as locally, before anything is sent.
	code, out, errOut := run(t, "1 0 3\n4 2\n7 8 6\n", "solve", "--server", s.base, "--format", "boj1525")
	if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, "line 2") {
		t.Errorf("bad boj1525 remotely: exit %d, out %q, stderr %q", code, out, errOut)
	}
}

// A handful of boards is solved as single tasks on the interactive
// queue, one request each; a ninth makes a batch.
func TestRemoteSolveHandfulAsSingles(t *testing.T) {
	t.Parallel()
	s := startStack(t, 1)
	lines := slidingLines(9, 11)
	for _, tc := range []struct {
		n       int
		batches int
	}{{1, 0}, {8, 0}, {9, 1}} {
		in := strings.Join(lines[:tc.n], "\n") + "\n"
		lcode, lout, _ := run(t, in, "solve", "--local", "--format", "json")
		rcode, rout, rerr := run(t, in, "solve", "--server", s.base, "--format", "json")
		if lcode != 0 || rcode != 0 || lout != rout {
			t.Fatalf("%d boards: local exit %d %q, remote exit %d %q (%s)", tc.n, lcode, lout, rcode, rout, rerr)
		}
		if got := s.Keys("pq:batch:*:req"); got != tc.batches {
			t.Fatalf("after %d boards: %d batches, want %d", tc.n, got, tc.batches)
		}
	}
	if got := s.Keys("pq:task:*"); got != 9 {
		t.Fatalf("%d single-task records, want 9 (1 + 8)", got)
	}
}

// Lines named by custom_id are solved through the API as locally, byte
// for byte, in the order of the lines: a handful as single tasks, which
// take no custom_id, and more as a batch, whose items carry theirs.
func TestRemoteSolveWithCustomIDsMatchesLocal(t *testing.T) {
	t.Parallel()
	s := startStack(t, 1)
	s.requireBatchNDJSON()
	named := func(n int) string {
		var in strings.Builder
		for i, l := range slidingLines(n, 23) {
			if i%3 != 2 { // every third line has none
				l = fmt.Sprintf(`{"custom_id":"case-%d",`, i) + l[1:]
			}
			in.WriteString(l + "\n")
			if i == 1 {
				in.WriteString("\n") // a blank line: no request, no result
			}
		}
		in.WriteString(`{"kind":"sweep","puzzle":{"board":["**...",".....","....*","..*..","....."]},"custom_id":"sweep \u00e9"}` + "\n")
		return in.String()
	}
	for _, tc := range []struct {
		n       int
		batches int
	}{{4, 0}, {12, 1}} {
		in := named(tc.n)
		lcode, lout, lerr := run(t, in, "solve", "--local", "--format", "json")
		rcode, rout, rerr := run(t, in, "solve", "--server", s.base, "--format", "json")
		if lcode != 0 || rcode != 0 || lout != rout || strings.Count(lout, "\n") != tc.n+1 {
			t.Fatalf("%d requests: local exit %d %q (%s), remote exit %d %q (%s)", tc.n+1, lcode, lout, lerr, rcode, rout, rerr)
		}
		if got := s.Keys("pq:batch:*:req"); got != tc.batches {
			t.Fatalf("after %d requests: %d batches, want %d", tc.n+1, got, tc.batches)
		}
	}
	// The batch's items carry the custom_ids of their lines.
	code, body := s.Do("GET", "/v1/batches", nil)
	var list apitype.BatchList
	if err := json.Unmarshal(body, &list); code != http.StatusOK || err != nil || len(list.Batches) != 1 {
		t.Fatalf("GET /v1/batches: %d %s", code, body)
	}
	code, body = s.Do("GET", "/v1/batches/"+list.Batches[0].ID+"/results", nil)
	var ids []string
	for l := range bytes.Lines(body) {
		var r apitype.ResultLine
		if err := json.Unmarshal(l, &r); err != nil {
			t.Fatalf("results: %v: %s", err, l)
		}
		id := "-"
		if r.CustomID != nil {
			id = *r.CustomID
		}
		ids = append(ids, id)
	}
	want := "case-0 case-1 - case-3 case-4 - case-6 case-7 - case-9 case-10 - sweep \u00e9"
	if code != http.StatusOK || strings.Join(ids, " ") != want {
		t.Errorf("the batch's custom_ids: %d %q, want %q", code, ids, want)
	}
}

// resultLine is one line of submit --wait: the item's id, state, result
// and error, as the API names them, under the request's line number and
// with its custom_id.
type resultLine struct {
	Line     int     `json:"line"`
	CustomID *string `json:"custom_id"`
	client.ResultLine
}

// TestSubmitWaitSurvivesDroppedResponses submits 20,000 distinct puzzles
// in two batches through a proxy that drops the connection carrying the
// answer to each batch POST: the client retries with the same idempotency
// key, the server replays the batch, and no work is done twice. Under the
// race detector, which slows the in-process API 5-20x, it runs 4,000 in
// two batches of 2,000 instead. Every tenth line has a custom_id, which
// comes back next to its line.
func TestSubmitWaitSurvivesDroppedResponses(t *testing.T) {
	t.Parallel()
	s := startStack(t, 1)
	s.requireBatchNDJSON()
	proxy := startFlakyProxy(t, strings.TrimPrefix(s.base, "http://"), 2)
	total, batch := 20000, 10000
	if raceEnabled {
		total, batch = 4000, 2000
	}
	lines := slidingLines(total, 42)
	for i := 0; i < total; i += 10 {
		lines[i] = fmt.Sprintf(`{"custom_id":"c%d",`, i) + lines[i][1:]
	}
	// A blank line: line numbers count it, requests do not.
	lines = append(lines[:100:100], append([]string{""}, lines[100:]...)...)
	in := writeLines(t, lines)
	outPath := filepath.Join(t.TempDir(), "results.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	code, stdout, stderr := runCtx(ctx, "", "submit", "--server", proxy.URL(), "-f", in, "--wait", "--out", outPath, "--parallel", "2", "--batch-size", fmt.Sprint(batch))
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if stdout != "" || withoutAccepted(stderr) != "" {
		t.Errorf("stdout %q, stderr %q: want both empty but for the batch IDs (results go to --out, no bar without a terminal)", stdout, stderr)
	}
	if proxy.Dropped() != 2 {
		t.Errorf("proxy dropped %d responses, want 2", proxy.Dropped())
	}
	f, err := os.Open(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	ids := map[string]bool{}
	n := 0
	for sc.Scan() {
		var r resultLine
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("result %d: %v: %s", n+1, err, sc.Bytes())
		}
		wantLine := n + 1
		if n >= 100 {
			wantLine++ // the blank line
		}
		_, index, ok := client.ParseItemID(r.ID)
		if r.Line != wantLine || r.State != client.StateCompleted || r.Error != nil || ids[r.ID] || !ok || index != n%batch {
			t.Fatalf("result %d: %s", n+1, sc.Bytes())
		}
		if wantCustom := n%10 == 0; wantCustom != (r.CustomID != nil) || wantCustom && *r.CustomID != fmt.Sprintf("c%d", n) {
			t.Fatalf("result %d: %s; want custom_id c%d: %v", n+1, sc.Bytes(), n, wantCustom)
		}
		ids[r.ID] = true
		if n%100 == 0 { // spot-check against the local solver
			p, err := puzzle.Decode([]byte(slidingLines(total, 42)[n]))
			if err != nil {
				t.Fatal(err)
			}
			want, err := p.Solve(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(want, r.Result) {
				t.Errorf("line %d: result %s, local %s", wantLine, r.Result, want)
			}
		}
		n++
	}
	if n != total {
		t.Fatalf("%d results, want %d", n, total)
	}
	if got := s.submitted(); got != total {
		t.Errorf("puzzleq_submitted_total = %d, want exactly %d", got, total)
	}
	if got := s.Keys(batchKeys); got != 2 {
		t.Errorf("%d batches in Redis, want 2", got)
	}
}

// TestSubmitOneRequestOnStack: an input within the server's limits is
// one batch and one POST, whatever its size (a --batch-size of 10,000
// was the old default and would have made ten).
func TestSubmitOneRequestOnStack(t *testing.T) {
	t.Parallel()
	s := startStack(t, 1)
	s.requireBatchNDJSON()
	total := 100000
	if raceEnabled {
		total = 12000
	}
	in := writeLines(t, slidingLines(total, 8))
	code, out, errOut := run(t, "", "submit", "--server", s.base, "-f", in)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if n := strings.Count(out, "\n"); n != 1 || !strings.Contains(out, fmt.Sprintf(`"total":%d,"first_line":1,"last_line":%d`, total, total)) {
		t.Errorf("stdout %q; want one batch of every line", out)
	}
	if got := s.Keys(batchKeys); got != 1 {
		t.Errorf("%d batches in Redis, want 1", got)
	}
}

// TestSubmitBadLateLineLeavesNothingOnStack: the upload streams while
// the lines are checked, so a bad line near the end of a large input cuts
// a request the API has been staging for a while. It must exit 2 naming
// the line, with nothing accepted and nothing staged left in Redis, and
// no --out file made.
func TestSubmitBadLateLineLeavesNothingOnStack(t *testing.T) {
	t.Parallel()
	s := startStack(t, 1)
	total := 60000
	if raceEnabled {
		total = 12000
	}
	lines := slidingLines(total, 9)
	lines[total-3] = `{"kind":"sliding","puzzle":{"board":[[1,2],[3,3]]}}`
	in := writeLines(t, lines)
	outPath := filepath.Join(t.TempDir(), "results.jsonl")
	code, out, errOut := run(t, "", "submit", "--server", s.base, "-f", in, "--wait", "--out", outPath)
	if want := fmt.Sprintf("line %d:", total-2); code != cli.ExitUsage || out != "" || !strings.Contains(errOut, want) {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 naming %q", code, out, errOut, want)
	}
	if _, err := os.Stat(outPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("--out exists after a bad line (%v)", err)
	}
	// The API discards what it staged once it sees the body cut, which
	// may be after puzzlectl has exited.
	left := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if left = s.Keys("pq:batch:*") + s.Keys("pq:idem:*"); left == 0 {
			break
		}
	}
	if left != 0 {
		t.Errorf("%d batch keys left in Redis after a cut upload", left)
	}
	if got := s.submitted(); got != 0 {
		t.Errorf("puzzleq_submitted_total = %d after a bad line, want 0", got)
	}
}

// TestSubmitInterruptedThenResumed cancels a run (Ctrl-C) while it waits
// for results no worker will produce: it reports the batches submitted,
// exits non-zero, and running it again submits nothing new.
func TestSubmitInterruptedThenResumed(t *testing.T) {
	t.Parallel()
	s := startStack(t, 0)
	s.requireBatchNDJSON()
	in := writeLines(t, slidingLines(300, 3))
	ctx, cancel := context.WithCancel(context.Background())
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		defer cancel()
		for s.Keys(batchKeys) < 3 {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		time.Sleep(100 * time.Millisecond)
	}()
	code, out, errOut := runCtx(ctx, "", "submit", "--server", s.base, "-f", in, "--wait", "--batch-size", "100", "--parallel", "2")
	close(stop)
	<-watched // no Keys once the stack is gone
	if code == 0 || out != "" {
		t.Fatalf("interrupted run: exit %d, stdout %q", code, out)
	}
	ids := regexp.MustCompile(`(?m)^  ([0-9a-f]{32})$`).FindAllStringSubmatch(errOut, -1)
	if !strings.Contains(errOut, "interrupted") || !strings.Contains(errOut, "submitted 3 of 3 batches (300 of 300 tasks)") || len(ids) != 3 {
		t.Fatalf("interrupted run: stderr %q", errOut)
	}
	// Resume: the same batches come back (idempotency keys), no new work.
	code, out, errOut = run(t, "", "submit", "--server", s.base, "-f", in, "--batch-size", "100")
	if code != 0 {
		t.Fatalf("resumed run: exit %d, stderr %q", code, errOut)
	}
	for _, id := range ids {
		if !strings.Contains(out, id[1]) {
			t.Errorf("resumed run did not print batch %s: %q", id[1], out)
		}
	}
	if got := s.submitted(); got != 300 {
		t.Errorf("puzzleq_submitted_total = %d after resuming, want 300", got)
	}
	// A new --run-id submits the same input as new work.
	code, out, errOut = run(t, "", "submit", "--server", s.base, "-f", in, "--batch-size", "100", "--run-id", "again")
	if code != 0 || strings.Contains(out, ids[0][1]) {
		t.Fatalf("--run-id again: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if got := s.submitted(); got != 600 {
		t.Errorf("puzzleq_submitted_total = %d after a new --run-id, want 600", got)
	}
}

func TestSubmitBadInputSubmitsNothing(t *testing.T) {
	t.Parallel()
	// submit uploads while it validates, and cuts the upload short at a
	// bad line: the server may see a request begin, never a whole body.
	var whole atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err == nil {
			whole.Add(1)
		}
		w.WriteHeader(500)
	}))
	defer srv.Close()
	good := slidingLines(3, 1)
	for _, tc := range []struct {
		in, errHas string
	}{
		{good[0] + "\n" + good[1] + "\n\n" + `{"kind":"sliding","puzzle":{"board":[[1,2],[3,3]]}}` + "\n" + good[2], "line 4"},
		{good[0] + "\n{not json\n", "line 2"},
		{`{"kind":"nope","puzzle":{}}`, "line 1"},
		{good[0] + "\n" + `{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]},"extra":1}`, "line 2"},
		{"\n\n", "no requests"},
		{`{"custom_id":"a",` + good[0][1:] + "\n" + `{"custom_id":"a",` + good[1][1:], `line 2: custom_id "a" repeats line 1's`},
		{good[0] + "\n" + `{"custom_id":5,` + good[1][1:], "line 2: custom_id: expected a string, got number"},
		{`{"custom_id":"` + strings.Repeat("x", 65) + `",` + good[0][1:], "line 1: custom_id is at most 64 bytes, got 65"},
		{`{"custom_id":"a","custom_id":"b",` + good[0][1:], `line 1: key "custom_id" appears twice`},
	} {
		code, out, errOut := run(t, tc.in, "submit", "--server", srv.URL, "-f", "-", "--wait")
		if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, tc.errHas) {
			t.Errorf("%.60q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.in, code, out, errOut, tc.errHas)
		}
	}
	for _, args := range [][]string{
		{"submit"},
		{"submit", "-f", "/nonexistent/jobs.jsonl"},
		{"submit", "-f", "-", "--batch-size", "0"},
		{"get"},
		{"get", "a", "b"},
		{"batch"},
		{"health", "-o", "xml"},
	} {
		code, _, errOut := run(t, good[0], append([]string{"--server", srv.URL}, args...)...)
		if code != cli.ExitUsage || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q; want exit 2", args, code, errOut)
		}
	}
	if whole.Load() != 0 {
		t.Errorf("the server got %d whole bodies; bad input must have none accepted", whole.Load())
	}
	if code, _, errOut := run(t, "", "health", "--server", "localhost:8080"); code != cli.ExitUsage || !strings.Contains(errOut, "http://") {
		t.Errorf("--server without a scheme: exit %d, stderr %q", code, errOut)
	}
}

func TestUnreachableServerExits3(t *testing.T) {
	t.Parallel()
	url := closedURL(t)
	good := slidingLines(2, 1)
	for _, tc := range []struct {
		stdin string
		args  []string
	}{
		{strings.Join(good, "\n"), []string{"submit", "-f", "-", "--wait"}},
		{"1 0 3\n4 2 5\n7 8 6\n", []string{"solve", "--format", "boj1525"}},
		{"", []string{"get", "5c0d8f0e2b6a4e7f9a1b3c5d7e9f0a1b"}},
		{"", []string{"cancel", "5c0d8f0e2b6a4e7f9a1b3c5d7e9f0a1b"}},
		{"", []string{"batch", "5c0d8f0e2b6a4e7f9a1b3c5d7e9f0a1b", "--watch"}},
		{"", []string{"health"}},
		{"", []string{"health", "--server", "http://no-such-host.invalid:8080"}},
	} {
		start := time.Now()
		code, out, errOut := run(t, tc.stdin, append([]string{"--server", url, "--retries", "2"}, tc.args...)...)
		if code != cli.ExitUnreachable || out != "" || !strings.Contains(errOut, "cannot reach") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 3", tc.args, code, out, errOut)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%v: took %s", tc.args, d)
		}
	}
}

func TestTaskAndBatchCommands(t *testing.T) {
	t.Parallel()
	s := startStack(t, 0) // no worker: tasks stay pending until canceled
	c := client.New(s.base)
	ctx := context.Background()
	task, err := c.Submit(ctx, client.RawRequest([]byte(slidingLines(1, 9)[0])))
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "", "--server", s.base, "get", task.ID)
	if code != 0 || !strings.Contains(out, "STATE") || !strings.Contains(out, "pending") {
		t.Errorf("get: exit %d, out %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = run(t, "", "--server", s.base, "cancel", task.ID, "-o", "json")
	var got client.Task
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.State != client.StateCanceled {
		t.Errorf("cancel: exit %d, out %q, stderr %q", code, out, errOut)
	}
	// A second cancel (a retry) answers the canceled task again.
	code, out, errOut = run(t, "", "--server", s.base, "cancel", task.ID)
	if code != 0 || !strings.Contains(out, "canceled") {
		t.Errorf("cancel twice: exit %d, out %q, stderr %q; want 0 and the canceled task", code, out, errOut)
	}
	code, out, _ = run(t, "", "--server", s.base, "get", task.ID, "--wait", "-o", "json")
	if code != cli.ExitFailed || !strings.Contains(out, `"canceled"`) {
		t.Errorf("get canceled task: exit %d, out %q; want 1", code, out)
	}
	code, _, errOut = run(t, "", "--server", s.base, "get", "00000000000000000000000000000000")
	if code != cli.ExitNotFound || !strings.Contains(errOut, "not_found") || !strings.Contains(errOut, "--api-key") {
		t.Errorf("get missing: exit %d, stderr %q", code, errOut)
	}

	// batch --watch shows counts until the batch is done.
	var reqs []client.Request
	for _, l := range slidingLines(5, 10) {
		reqs = append(reqs, client.RawRequest([]byte(l)))
	}
	sub, err := c.SubmitBatch(ctx, client.BatchOf(reqs...))
	if err != nil {
		t.Fatal(err)
	}
	code, out, _ = run(t, "", "--server", s.base, "batch", sub.ID)
	if code != 0 || !strings.Contains(out, "PENDING") || !strings.Contains(out, sub.ID) {
		t.Errorf("batch: exit %d, out %q", code, out)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		c.CancelBatch(ctx, sub.ID)
	}()
	code, out, _ = run(t, "", "--server", s.base, "batch", sub.ID, "--watch", "-o", "ndjson")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != cli.ExitFailed || len(lines) < 2 || !strings.Contains(lines[len(lines)-1], `"canceled":5`) || !strings.Contains(lines[len(lines)-1], `"done":true`) {
		t.Errorf("batch --watch -o ndjson: exit %d, out %q; want a line per change, the last one done", code, out)
	}
	// -o yaml of a done batch is one document.
	code, out, _ = run(t, "", "--server", s.base, "batch", sub.ID, "--watch", "-o", "yaml")
	if code != cli.ExitFailed || strings.Count(out, "done: true") != 1 || !strings.Contains(out, "  canceled: 5\n") {
		t.Errorf("batch --watch -o yaml: exit %d, out %q; want the final counts once", code, out)
	}

	// No worker runs here: health says so and fails.
	code, out, errOut = run(t, "", "--server", s.base, "health")
	if code != cli.ExitFailed || !strings.Contains(out, "live, ready, 0 workers alive") || !strings.Contains(errOut, "no worker is alive") {
		t.Errorf("health without workers: exit %d, out %q, stderr %q", code, out, errOut)
	}
}

// TestProgressBarOnlyOnTerminal runs the real command path with stderr on
// a pty: the bar is drawn. With stderr a pipe or buffer, it is not.
func TestProgressBarOnlyOnTerminal(t *testing.T) {
	t.Parallel()
	s := startStack(t, 1)
	s.requireBatchNDJSON()
	in := writeLines(t, slidingLines(3000, 5))

	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer ptmx.Close()
	var drawn bytes.Buffer
	readDone := make(chan struct{})
	go func() { defer close(readDone); io.Copy(&drawn, ptmx) }()
	var out bytes.Buffer
	code := cli.Run(context.Background(), []string{"submit", "--server", s.base, "-f", in, "--wait", "--batch-size", "500"},
		strings.NewReader(""), &out, tty)
	tty.Close()
	<-readDone
	if code != 0 {
		t.Fatalf("exit %d; terminal: %q", code, drawn.String())
	}
	if n := strings.Count(out.String(), "\n"); n != 3000 {
		t.Errorf("%d result lines on stdout, want 3000", n)
	}
	term := drawn.String()
	for _, want := range []string{"submitted 3000/3000", "completed", "100%", "3000/3000", "tasks/s"} {
		if !strings.Contains(term, want) {
			t.Errorf("terminal output lacks %q: %q", want, term)
		}
	}

	code, out2, errOut := run(t, "", "submit", "--server", s.base, "-f", in, "--wait", "--batch-size", "500")
	if code != 0 || withoutAccepted(errOut) != "" || strings.Count(errOut, " accepted (lines ") != 6 || out2 != out.String() {
		t.Errorf("without a terminal: exit %d, stderr %q (want the 6 batch IDs only), same results %v", code, errOut, out2 == out.String())
	}
}

func TestAPIKeyIsSentAndNeverShown(t *testing.T) {
	// Not parallel: it sets an environment variable.
	const key = "s3cret-key"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+key {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":{"code":"unauthorized","message":"unknown API key"}}`)
			return
		}
		if r.URL.Path == "/v1/status" {
			io.WriteString(w, `{"workers_alive":1,"slots":4,"busy":0,"workers":[],"queues":[],"backlog_units":0,"oldest_pending_seconds":0}`)
			return
		}
		io.WriteString(w, `{"status":"ok"}`)
	}))
	defer srv.Close()
	if code, _, errOut := run(t, "", "health", "--server", srv.URL); code != cli.ExitNotFound || !strings.Contains(errOut, "unauthorized") ||
		!strings.Contains(errOut, "--api-key KEY or set PUZZLEQ_API_KEY") {
		t.Errorf("without a key: exit %d, stderr %q", code, errOut)
	}
	if code, out, errOut := run(t, "", "health", "--server", srv.URL, "--api-key", key); code != 0 {
		t.Errorf("--api-key: exit %d, out %q, stderr %q", code, out, errOut)
	}
	t.Setenv("PUZZLEQ_API_KEY", key)
	if code, out, errOut := run(t, "", "health", "--server", srv.URL); code != 0 {
		t.Errorf("$PUZZLEQ_API_KEY: exit %d, out %q, stderr %q", code, out, errOut)
	}
	if _, out, _ := run(t, "", "--help"); strings.Contains(out, key) {
		t.Errorf("--help shows the API key: %q", out)
	}
}

// acceptedLine is the stderr line of a batch submit --wait accepted.
var acceptedLine = regexp.MustCompile(`(?m)^puzzlectl: batch [0-9a-f]{32} accepted \(lines \d+-\d+\)\n`)

// withoutAccepted is stderr without those lines.
func withoutAccepted(s string) string { return acceptedLine.ReplaceAllString(s, "") }
