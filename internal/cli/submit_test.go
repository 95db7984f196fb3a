package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/internal/cli"
)

// submitLine is one line of submit --wait's output, as a map so that a
// missing key can be told from an empty one.
func parseOutput(t *testing.T, out string) []map[string]json.RawMessage {
	t.Helper()
	var lines []map[string]json.RawMessage
	for i, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("output line %d: %v: %q", i+1, err, l)
		}
		lines = append(lines, m)
	}
	return lines
}

// customInput returns n request lines; every third has a custom_id
// ("job-<i>"), and the one at failAt asks for max_nodes 1 (the fake fails
// it). A blank line follows the tenth.
func customInput(n, failAt int) (lines []string, customs map[int]string) {
	customs = map[int]string{}
	for i, l := range slidingLines(n, 11) {
		if i == failAt {
			l = strings.TrimSuffix(l, "}") + `,"options":{"max_nodes":1}}`
		}
		if i%3 == 0 {
			customs[len(lines)+1] = fmt.Sprintf("job-%d", i)
			l = fmt.Sprintf(`{"custom_id":"job-%d",`, i) + strings.TrimPrefix(l, "{")
		}
		lines = append(lines, l)
		if i == 9 {
			lines = append(lines, "")
		}
	}
	return lines, customs
}

// An input within the server's limits is one NDJSON request under a
// puzzlectl idempotency key; its results are read as a stream (not
// gzipped: the server is on loopback, where gzip costs more than it saves),
// request after request while items end, and written in input order
// with the line number, custom_id where the input had one, the item's
// ID and its result or error. One failed item: exit status 1.
func TestSubmitSendsOneNDJSONBatchAndStreamsResults(t *testing.T) {
	t.Parallel()
	f := startFakeAPI(t, func(f *fakeAPI) { f.perPoll = 700 })
	lines, customs := customInput(3000, 1500)
	in := writeLines(t, lines)
	outPath := filepath.Join(t.TempDir(), "results.jsonl")
	code, stdout, stderr := run(t, "", "submit", "--server", f.URL, "-f", in, "--wait", "--out", outPath)
	if code != cli.ExitFailed || stdout != "" || !strings.Contains(stderr, "1 of 3000 tasks did not complete") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 1 and the count of failures", code, stdout, stderr)
	}
	posts, batches, polls := f.snapshot()
	if len(posts) != 1 || batches != 1 || posts[0].contentType != "application/x-ndjson" || posts[0].lines != 3000 ||
		!regexp.MustCompile(`^puzzlectl-[0-9a-f]{40}$`).MatchString(posts[0].key) {
		t.Fatalf("posts %+v, %d batches; want one NDJSON request of 3000 lines with a key", posts, batches)
	}
	// Each request starts where the last one stopped (from=), so no line
	// is read twice while the batch runs.
	if want := []string{"", "from=700", "from=1400", "from=2100", "from=2800"}; !slices.Equal(polls, want) {
		t.Errorf("/results requests %q; want %q (700 items end per request, each read once)", polls, want)
	}
	if f.gzipped != 0 {
		t.Errorf("%d of %d /results answers were gzipped from a loopback server", f.gzipped, len(polls))
	}
	data, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	out := parseOutput(t, string(data))
	if len(out) != 3000 {
		t.Fatalf("%d output lines, want 3000", len(out))
	}
	batchID := fmt.Sprintf("%032x", 1)
	for i, m := range out {
		line := i + 1
		if i >= 10 {
			line++ // the blank line
		}
		var got struct {
			Line     int              `json:"line"`
			CustomID *string          `json:"custom_id"`
			ID       string           `json:"id"`
			State    client.TaskState `json:"state"`
			Result   json.RawMessage  `json:"result"`
			Error    *client.TaskError
		}
		raw, _ := json.Marshal(m)
		json.Unmarshal(raw, &got)
		want, has := customs[line]
		_, hasKey := m["custom_id"]
		if got.Line != line || hasKey != has || (has && (got.CustomID == nil || *got.CustomID != want)) || got.ID != client.ItemID(batchID, i) {
			t.Fatalf("output line %d: %s; want line %d, custom_id %q (%v)", i+1, raw, line, want, has)
		}
		if i == 1500 {
			if got.State != client.StateFailed || m["error"] == nil || m["result"] != nil {
				t.Fatalf("output line %d: %s; want the failure", i+1, raw)
			}
			continue
		}
		if got.State != client.StateCompleted || string(got.Result) != fmt.Sprintf(`{"item":%d}`, i) || m["error"] != nil {
			t.Fatalf("output line %d: %s", i+1, raw)
		}
	}
	// The key order of today's format, with custom_id after the line.
	first := strings.SplitN(string(data), "\n", 2)[0]
	if !strings.HasPrefix(first, `{"line":1,"custom_id":"job-0","id":"`+batchID+`-0","state":"completed","result":{"item":0}}`) {
		t.Errorf("first line %s", first)
	}
}

// A lost answer to the POST is retried with the same key and body (the
// server replays the batch: one batch, not two), and a results stream
// that breaks is read again without writing a line twice.
func TestSubmitSurvivesLostAnswerAndBrokenStream(t *testing.T) {
	t.Parallel()
	f := startFakeAPI(t, func(f *fakeAPI) { f.dropPosts, f.cutResults = 1, 2 })
	in := writeLines(t, slidingLines(500, 5))
	code, stdout, stderr := run(t, "", "submit", "--server", f.URL, "-f", in, "--wait")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	posts, batches, polls := f.snapshot()
	if len(posts) != 2 || posts[0].key != posts[1].key || batches != 1 {
		t.Errorf("posts %+v, %d batches; want the same key twice and one batch", posts, batches)
	}
	if len(polls) != 3 {
		t.Errorf("%d /results requests, want 3 (two broken)", len(polls))
	}
	out := parseOutput(t, stdout)
	if len(out) != 500 {
		t.Fatalf("%d output lines, want 500", len(out))
	}
	for i, m := range out {
		if string(m["line"]) != fmt.Sprint(i+1) || string(m["result"]) != fmt.Sprintf(`{"item":%d}`, i) {
			t.Fatalf("output line %d: %v", i+1, m)
		}
	}
}

// --batch-size cuts the input into batches, each its own NDJSON request
// and key, and the results still come out in input order; the table
// format has a CUSTOM_ID column when the input has custom IDs.
func TestSubmitBatchSizeSplits(t *testing.T) {
	t.Parallel()
	f := startFakeAPI(t, func(f *fakeAPI) { f.perPoll = 40 })
	lines, _ := customInput(250, -1)
	in := writeLines(t, lines)
	code, stdout, stderr := run(t, "", "submit", "--server", f.URL, "-f", in, "--wait", "--batch-size", "100", "--parallel", "2", "-o", "table")
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	posts, batches, _ := f.snapshot()
	sizes, keys := map[int]int{}, map[string]bool{}
	for _, p := range posts {
		sizes[p.lines]++
		keys[p.key] = true
	}
	if len(posts) != 3 || batches != 3 || len(keys) != 3 || sizes[100] != 2 || sizes[50] != 1 {
		t.Fatalf("posts %+v; want 3 batches of 100, 100 and 50 lines with their own keys", posts)
	}
	rows := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(rows) != 251 || !strings.HasPrefix(rows[0], "LINE") || !strings.Contains(rows[0], "CUSTOM_ID") {
		t.Fatalf("%d rows, header %q", len(rows), rows[0])
	}
	batchOf := map[int]string{} // batches are numbered as they arrive, which --parallel 2 shuffles
	for i, row := range rows[1:] {
		f := strings.Fields(row)
		line := i + 1
		if i >= 10 {
			line++
		}
		id := ""
		if i%3 == 0 {
			if len(f) != 5 || f[0] != fmt.Sprint(line) || f[1] != fmt.Sprintf("job-%d", i) {
				t.Fatalf("row %d: %q", i+1, row)
			}
			id = f[2]
		} else if len(f) != 4 || f[0] != fmt.Sprint(line) {
			t.Fatalf("row %d: %q", i+1, row)
		} else {
			id = f[1]
		}
		b, index, ok := client.ParseItemID(id)
		if batchOf[i/100] == "" {
			batchOf[i/100] = b
		}
		if !ok || index != i%100 || b != batchOf[i/100] {
			t.Fatalf("row %d: %q; want item %d of batch %s", i+1, row, i%100, batchOf[i/100])
		}
	}
	if len(batchOf) != 3 || batchOf[0] == batchOf[1] || batchOf[1] == batchOf[2] || batchOf[0] == batchOf[2] {
		t.Errorf("batches %v", batchOf)
	}
}

// Ctrl-C while waiting reports the batches submitted; the same command
// again replays them (same keys, no new batch) and a new --run-id makes
// new ones.
func TestSubmitResumeAfterInterrupt(t *testing.T) {
	t.Parallel()
	f := startFakeAPI(t, func(f *fakeAPI) { f.never = true })
	in := writeLines(t, slidingLines(300, 3))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		f.waitBatches(t, 3)
		time.Sleep(100 * time.Millisecond)
		cancel()
	}()
	code, out, errOut := runCtx(ctx, "", "submit", "--server", f.URL, "-f", in, "--wait", "--batch-size", "100", "--parallel", "2")
	if code == 0 || out != "" {
		t.Fatalf("interrupted run: exit %d, stdout %q", code, out)
	}
	ids := regexp.MustCompile(`(?m)^  ([0-9a-f]{32})$`).FindAllStringSubmatch(errOut, -1)
	if !strings.Contains(errOut, "interrupted") || !strings.Contains(errOut, "submitted 3 of 3 batches (300 of 300 tasks)") || len(ids) != 3 {
		t.Fatalf("interrupted run: stderr %q", errOut)
	}
	code, out, errOut = run(t, "", "submit", "--server", f.URL, "-f", in, "--batch-size", "100")
	if code != 0 {
		t.Fatalf("resumed run: exit %d, stderr %q", code, errOut)
	}
	for _, id := range ids {
		if !strings.Contains(out, id[1]) {
			t.Errorf("resumed run did not print batch %s: %q", id[1], out)
		}
	}
	if _, batches, _ := f.snapshot(); batches != 3 {
		t.Errorf("%d batches after resuming, want 3", batches)
	}
	code, out, errOut = run(t, "", "submit", "--server", f.URL, "-f", in, "--batch-size", "100", "--run-id", "again")
	if code != 0 || strings.Contains(out, ids[0][1]) {
		t.Fatalf("--run-id again: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, batches, _ := f.snapshot(); batches != 6 {
		t.Errorf("%d batches after a new --run-id, want 6", batches)
	}
}

// A line the server rejects is named by its line in the input, not in
// the body (which skips blank lines and starts at the batch's first), and
// the run exits 2 as for a line refused locally.
func TestSubmitServerRejectionNamesInputLine(t *testing.T) {
	t.Parallel()
	f := startFakeAPI(t, func(f *fakeAPI) { f.rejectLine = 3 })
	l := slidingLines(6, 2)
	// Batches of 3: input lines 2, 4, 5 and 7, 9, 10. The fake refuses
	// the first at its body's line 3: input line 5.
	in := writeLines(t, []string{"", l[0], "", l[1], l[2], "", l[3], "", l[4], l[5]})
	code, _, errOut := run(t, "", "submit", "--server", f.URL, "-f", in, "--batch-size", "3", "--parallel", "1")
	if code != cli.ExitUsage || !strings.Contains(errOut, "batch 1 (input line 5)") || !strings.Contains(errOut, "the server says no") {
		t.Fatalf("exit %d, stderr %q; want 2 naming input line 5", code, errOut)
	}
}

// On a terminal the bar is drawn and moves while results are awaited: fed
// by the batches' counts and by the results stream.
func TestSubmitProgressBarIsFed(t *testing.T) {
	t.Parallel()
	f := startFakeAPI(t, func(f *fakeAPI) { f.perPoll, f.hold = 500, 300*time.Millisecond })
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
	code := cli.Run(context.Background(), []string{"submit", "--server", f.URL, "-f", in, "--wait"}, strings.NewReader(""), &out, tty)
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
	// The bar moves through each chunk in steps, so any count short of
	// the total will do, not only a chunk's.
	if !regexp.MustCompile(`\b([1-9]\d{0,2}|[12]\d{3})/3000 completed`).MatchString(term) {
		t.Errorf("the bar never showed a partial count: %q", term)
	}
	if f.countReads() == 0 {
		t.Error("the bar never read the batch's counts")
	}
}

// solve through the API of more than a handful of boards is a run of
// NDJSON batches too: the results come back in order and are rendered as
// the format says; a case that failed is an error naming it.
func TestRemoteSolveStreamsResults(t *testing.T) {
	t.Parallel()
	f := startFakeAPI(t, func(f *fakeAPI) { f.perPoll = 4 })
	var in, want strings.Builder
	for i, l := range slidingLines(10, 4) {
		in.WriteString(l + "\n")
		fmt.Fprintf(&want, "{\"item\":%d}\n", i)
	}
	code, out, errOut := run(t, in.String(), "solve", "--server", f.URL, "--format", "json")
	if code != 0 || out != want.String() {
		t.Fatalf("exit %d, out %q, stderr %q; want %q", code, out, errOut, want.String())
	}
	if posts, _, polls := f.snapshot(); len(posts) != 1 || posts[0].lines != 10 || len(polls) != 3 {
		t.Errorf("posts %+v, %d /results requests; want one batch of 10 read in 3", posts, len(polls))
	}
	bad := strings.Replace(in.String(), "]]}}\n", `]]},"options":{"max_nodes":1}}`+"\n", 1)
	code, out, errOut = run(t, bad, "solve", "--server", f.URL, "--format", "json")
	if code != cli.ExitFailed || out != "" || !strings.Contains(errOut, "case 1: task ") || !strings.Contains(errOut, "budget_exceeded") {
		t.Fatalf("a failed case: exit %d, out %q, stderr %q", code, out, errOut)
	}
}
