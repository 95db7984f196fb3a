// Package browser_test drives the dashboard (internal/ui) in a real
// headless Chromium over the DevTools protocol, against an in-process
// stack (internal/stacktest): sign-in with a key, the views at their own
// URLs (jobs, a job, an item, workers) with Back and Forward, a batch with
// a failing item submitted from the page, its progress to done, tenant
// isolation (a deep link to another key's batch), the results download,
// a job's items page by page, the search by ID and by custom_id, single
// tasks beside the batches, retry, cancel behind a confirm, and sign-out. It skips, saying
// why, when no Chromium is installed (.ci/run installs Debian's).
// Screenshots go to $PUZZLEQ_ARTIFACTS/browser, or to a temporary
// directory; the test logs the path.
package browser_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

const (
	aliceKey = "alice-browser-key-0001"
	bobKey   = "bob-browser-key-00002"
)

// batchNDJSON has two items that complete and one that fails: a sweep
// search allowed a single node cannot finish (budget_exceeded).
const batchNDJSON = `{"custom_id":"easy-1","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}
{"custom_id":"easy-2","kind":"sweep","puzzle":{"board":["..","*.","*."]}}
{"custom_id":"too-hard","kind":"sweep","puzzle":{"board":["........","........","........"]},"options":{"max_nodes":1}}`

// chromium finds the browser: $PUZZLEQ_CHROMIUM, or chromium or
// chromium-browser on PATH, or /usr/bin/chromium; "" when there is none.
func chromium() string {
	if p := os.Getenv("PUZZLEQ_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// page is one browser tab on the dashboard, with the test's helpers.
type page struct {
	t         *testing.T
	ctx       context.Context
	shots     string // screenshot directory
	downloads string // download directory

	mu         sync.Mutex
	exceptions []string // the page's uncaught exceptions
}

// newPage starts a headless Chromium with a fresh profile and opens one
// tab; both end with the test.
func newPage(t *testing.T) *page {
	t.Helper()
	bin := chromium()
	if bin == "" {
		t.Skip("no Chromium: install Debian's chromium package (.ci/run does) or set PUZZLEQ_CHROMIUM")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
		// As root (CI) Chromium refuses to start with its sandbox; the
		// pages it loads are this test's own.
		chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true),
		// The machine's network is closed: no background fetches.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser, with no timeout
		t.Skipf("Chromium at %s does not start: %v", bin, err)
	}
	p := &page{t: t, ctx: ctx, shots: artifactDir(t), downloads: t.TempDir()}
	// An uncaught exception or unhandled rejection in the page's script
	// fails the test, wherever it happened.
	go func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			if m.IsException() {
				p.mu.Lock()
				p.exceptions = append(p.exceptions, fmt.Sprintf("%s:%d %s", m.URL, m.Line+1, m.Text))
				p.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.exceptions {
			t.Errorf("the page threw: %s", e)
		}
	})
	if _, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: p.downloads}); err != nil {
		t.Fatalf("set the download directory: %v", err)
	}
	return p
}

// artifactDir is where screenshots go: $PUZZLEQ_ARTIFACTS/browser, or a
// directory of its own under the system's temporary one, kept after the
// test so a failure's screenshots can be looked at.
func artifactDir(t *testing.T) string {
	t.Helper()
	var dir string
	if root := os.Getenv("PUZZLEQ_ARTIFACTS"); root != "" {
		dir = filepath.Join(root, "browser")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	} else {
		d, err := os.MkdirTemp("", "puzzleq-browser-")
		if err != nil {
			t.Fatal(err)
		}
		dir = d
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// do runs actions within 20 s.
func (p *page) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.fail(what, err)
	}
}

// eval evaluates a JavaScript expression and decodes its value into T.
func eval[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		p.fail("evaluate "+expr, err)
	}
	return v
}

// waitFor polls a JavaScript predicate until it is truthy, for up to d.
func (p *page) waitFor(what, expr string, d time.Duration) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, d+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(d))); err != nil {
		p.fail("wait for "+what+" ("+expr+")", err)
	}
}

// fail takes a screenshot of the page as it is and fails the test.
func (p *page) fail(what string, err error) {
	p.t.Helper()
	p.shot("failure")
	body, _ := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	p.t.Fatalf("%s: %v\npage text:\n%s", what, err, body)
}

// shot saves a full-page screenshot as name.png.
func (p *page) shot(name string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
		return
	}
	path := filepath.Join(p.shots, name+".png")
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		p.t.Errorf("save screenshot: %v", err)
		return
	}
	p.t.Logf("screenshot %s", path)
}

// js quotes s as a JavaScript string literal.
func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestDashboardInBrowser(t *testing.T) {
	p := newPage(t)
	// Chunks of 2 items make the 250-item job below 125 chunks, more than
	// one page of a custom_id search reads (64), so the search box must
	// follow the search's cursors to find an item deep in it.
	s := stacktest.StartWith(t, 1, map[string]string{"API_KEYS": "alice:" + aliceKey + ",bob:" + bobKey, "CHUNK_SIZE": "2"})

	// Bob's batch, through the API: alice must never see it.
	code, b, _ := s.DoAs(bobKey, "POST", "/v1/batches", `{"tasks":[{"custom_id":"bobs","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}]}`)
	if code != 202 {
		t.Fatalf("bob's batch: %d %s", code, b)
	}
	bobsBatch := stacktest.Decode[apitype.BatchCreated](t, b).ID

	// / redirects to the dashboard, which asks for a key.
	p.do("open /", chromedp.Navigate(s.URL+"/"))
	if u := eval[string](p, `location.pathname`); u != "/ui/" {
		t.Errorf("/ led to %s, want /ui/", u)
	}
	p.waitFor("the sign-in form", `!document.getElementById("signin").hidden`, 5*time.Second)
	p.shot("1-sign-in")

	// A wrong key is refused and sets no cookie.
	p.do("sign in with a wrong key",
		chromedp.SendKeys(chromedp.ID("key"), "not-a-key"),
		chromedp.Click(chromedp.ID("signin-btn")))
	p.waitFor("the refusal", `document.getElementById("signin-error").textContent.includes("unknown API key")`, 5*time.Second)

	p.do("sign in as alice",
		chromedp.SendKeys(chromedp.ID("key"), aliceKey),
		chromedp.Click(chromedp.ID("signin-btn")))
	p.waitFor("the dashboard", `!document.getElementById("dash").hidden && document.getElementById("whoami").textContent === "signed in as alice"`, 5*time.Second)
	// The session cookie is HttpOnly: the page's script cannot read it,
	// and the key is not kept anywhere the page can read.
	if c := eval[string](p, `document.cookie`); strings.Contains(c, "puzzleq_session") {
		t.Errorf("document.cookie = %q: the session cookie is readable by script", c)
	}
	if st := eval[string](p, `JSON.stringify(localStorage) + JSON.stringify(sessionStorage)`); strings.Contains(st, aliceKey) {
		t.Errorf("web storage holds the key: %s", st)
	}

	// The workers' view (GET /v1/status) shows the stack's one worker,
	// in the singular, by its name.
	p.visit("#/workers", "workers")
	p.waitFor("a worker alive", `document.getElementById("workers-alive") && document.getElementById("workers-alive").textContent === "1"`, 10*time.Second)
	if got := eval[string](p, `document.querySelector("#status p").textContent`); !strings.HasPrefix(got, "1 worker alive · ") {
		t.Errorf("the status line = %q, want 1 worker alive", got)
	}
	// The worker goes by the name its logs give it.
	if got := eval[string](p, `document.querySelector("#workers tbody td").textContent`); got != s.Workers[0].ID() {
		t.Errorf("the workers table names %q, want the worker's ID %q", got, s.Workers[0].ID())
	}
	// Its queue table shows runs waiting for a solver slot apart from
	// retries, which asynq counts together.
	p.waitFor("the queues' columns", `[...document.querySelectorAll("#queues th")].map(e => e.textContent).join(",") === "queue,pending,active,waiting,retry,oldest pending"`, 10*time.Second)
	p.shot("2-workers")

	// Submit the batch from the jobs view: the box clears, and the job's
	// view opens at its own URL.
	p.visit("#/jobs", "jobs")
	p.do("submit a batch",
		chromedp.SetValue(chromedp.ID("ndjson"), batchNDJSON),
		chromedp.Click(chromedp.ID("submit-btn")))
	p.waitFor("the batch's ID", `document.getElementById("submit-msg").dataset.id`, 10*time.Second)
	id := eval[string](p, `document.getElementById("submit-msg").dataset.id`)
	if !apitype.IsID(id) {
		t.Fatalf("submitted batch ID %q", id)
	}
	p.waitView("job")
	if h := eval[string](p, `location.hash`); h != "#/jobs/"+id {
		t.Errorf("after the submit the URL is %s, want #/jobs/%s", h, id)
	}
	if v := eval[string](p, `document.getElementById("ndjson").value`); v != "" {
		t.Errorf("the submit box still holds %q after the submit", v)
	}
	p.waitFor("the job's view to finish", `document.getElementById("job").dataset.done === "true"`, 30*time.Second)
	// The job's view followed its event stream (GET /v1/batches/{id}/events),
	// and says nothing of being live once the batch is done.
	p.waitFor("the job's event stream", `document.getElementById("job").dataset.followed === "events"`, 5*time.Second)
	p.waitFor("no live label on a done batch", `document.getElementById("job").dataset.live === "done" && document.getElementById("job-live").textContent === ""`, 5*time.Second)
	p.shot("3-batch-done")

	// Back: the jobs view again, with the batch's row.
	p.do("back", chromedp.Evaluate[chromedp.Void](`history.back()`))
	p.waitView("jobs")
	row := `document.querySelector('#jobs tr[data-id=` + js(id) + `]')`
	p.waitFor("the batch's row", row+` && `+row+`.dataset.done === "true"`, 10*time.Second)
	// Jobs come from GET /v1/batches, not this browser's memory.
	if src := eval[string](p, `document.getElementById("jobs-source").textContent`); src != "" {
		t.Errorf("the jobs list says %q: it fell back from GET /v1/batches", src)
	}
	if counts := eval[string](p, row+`.querySelector(".counts").textContent`); counts != "completed 2, failed 1" {
		t.Errorf("the row's counts = %q, want completed 2, failed 1", counts)
	}
	if pct := eval[string](p, row+`.querySelector(".bar").dataset.pct`); pct != "100" {
		t.Errorf("the row's progress = %s%%, want 100", pct)
	}
	// Only alice's jobs are listed.
	p.waitFor("bob's batch to be gone", `!document.querySelector('#jobs tr[data-id=`+js(bobsBatch)+`]')`, 5*time.Second)
	if ids := eval[[]string](p, `[...document.querySelectorAll("#jobs tbody tr")].map(r => r.dataset.id)`); len(ids) != 1 || ids[0] != id {
		t.Errorf("alice's dashboard lists %v, want only %s", ids, id)
	}
	// Forward: the job again; and a job's link from before the views,
	// #<batch id>, opens it at its new URL.
	p.do("forward", chromedp.Evaluate[chromedp.Void](`history.forward()`))
	p.waitView("job")
	p.visit("#/jobs", "jobs")
	p.visit("#"+id, "job")
	p.waitFor("the old link's job", `location.hash === `+js("#/jobs/"+id)+` && document.getElementById("job-id").textContent === `+js(id), 5*time.Second)

	// The failed item, filtered by state, with its custom_id and error.
	p.waitFor("the job's items", `document.getElementById("job").dataset.page === "1"`, 10*time.Second)
	p.do("filter failed items", chromedp.SetValue(chromedp.ID("state-filter"), "failed"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("state-filter").dispatchEvent(new Event("change"))`))
	p.waitFor("only failed items", `(() => { const r = [...document.querySelectorAll("#items tbody tr")];
		return r.length === 1 && r[0].dataset.state === "failed"; })()`, 10*time.Second)
	p.shot("4-failed-items")
	if got := eval[string](p, `document.querySelector("#items tbody tr .custom-id").textContent`); got != "too-hard" {
		t.Errorf("the failed item's custom_id = %q, want too-hard", got)
	}
	if got := eval[string](p, `document.querySelector("#items tbody tr td.error").textContent`); !strings.HasPrefix(got, "budget_exceeded: ") {
		t.Errorf("the failed item's error = %q, want budget_exceeded", got)
	}
	p.do("all items", chromedp.SetValue(chromedp.ID("state-filter"), ""),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("state-filter").dispatchEvent(new Event("change"))`))
	p.waitFor("all three items", `document.querySelectorAll("#items tbody tr").length === 3`, 10*time.Second)

	// Download the results: one NDJSON line per item, in order.
	p.do("download the results", chromedp.Click(chromedp.ID("download")))
	lines := p.download(id + ".results.ndjson")
	if len(lines) != 3 {
		t.Fatalf("downloaded %d lines, want 3: %q", len(lines), lines)
	}
	for i, want := range []struct{ id, state string }{{"easy-1", "completed"}, {"easy-2", "completed"}, {"too-hard", "failed"}} {
		var l apitype.ResultLine
		if err := json.Unmarshal([]byte(lines[i]), &l); err != nil || l.Index != i || l.CustomID == nil || *l.CustomID != want.id || string(l.State) != want.state {
			t.Errorf("downloaded line %d = %s (%v), want %s %s", i, lines[i], err, want.id, want.state)
		}
	}

	// A write without the dashboard's header is refused even from the
	// page itself (the CSRF check), and bob's batch is a 404 for alice.
	if st := eval[int](p, `fetch("/v1/batches/`+id+`", {method: "DELETE"}).then(r => r.status)`); st != 403 {
		t.Errorf("a DELETE without the UI header from the page: %d, want 403", st)
	}
	if st := eval[int](p, `fetch("/v1/batches/`+bobsBatch+`", {headers: {"X-Puzzleq-UI": "1"}}).then(r => r.status)`); st != 404 {
		t.Errorf("alice's session reads bob's batch: %d, want 404", st)
	}

	// Retry the failed item: it runs again (and fails again: its budget
	// has not changed).
	failedItem := apitype.ItemID(id, 2)
	before := itemEnd(t, s, failedItem)
	if label := eval[string](p, `document.getElementById("retry-btn").textContent`); !strings.Contains(label, "failed and canceled") {
		t.Errorf("the retry button says %q: it retries canceled items too", label)
	}
	p.do("retry", chromedp.Click(chromedp.ID("retry-btn")))
	p.waitFor("the retry's answer", `document.getElementById("job-msg").textContent !== ""`, 10*time.Second)
	if msg := eval[string](p, `document.getElementById("job-msg").textContent`); msg != "retrying 1 item (failed and canceled)" {
		t.Fatalf("retry message %q, want retrying 1 item (failed and canceled)", msg)
	}
	deadline := time.Now().Add(30 * time.Second)
	for itemEnd(t, s, failedItem) == before {
		if time.Now().After(deadline) {
			t.Fatalf("the retried item %s did not run again within 30 s", failedItem)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.waitFor("the retried batch to finish", `document.getElementById("job").dataset.done === "true" &&
		document.getElementById("job-counts").textContent.startsWith("completed 2, failed 1 ")`, 30*time.Second)
	p.shot("5-retried")

	// An item opens from the job's list at its own URL; Back returns to
	// the job.
	p.do("open the first item", chromedp.Evaluate[chromedp.Void](`location.hash = document.querySelector("#items tbody tr a").getAttribute("href")`))
	p.waitView("item")
	p.waitFor("the item drawn", `document.getElementById("item").dataset.id === `+js(apitype.ItemID(id, 0))+
		` && document.getElementById("item").dataset.ready === "completed"`, 10*time.Second)
	if h := eval[string](p, `document.getElementById("item-batch").getAttribute("href")`); h != "#/jobs/"+id {
		t.Errorf("the item's link to its batch is %s", h)
	}
	p.shot("6-item")
	p.do("back to the job", chromedp.Evaluate[chromedp.Void](`history.back()`))
	p.waitView("job")
	p.waitFor("the job again", `location.hash === `+js("#/jobs/"+id)+` && document.getElementById("job").dataset.page === "1"`, 10*time.Second)

	// Search, on the job's view: by custom_id, by item ID, by batch ID;
	// and a custom_id no item has.
	p.search("too-hard")
	p.waitView("item")
	p.waitFor("the item found by custom_id", `document.getElementById("item").dataset.id === `+js(apitype.ItemID(id, 2)), 10*time.Second)
	p.do("back to the job", chromedp.Evaluate[chromedp.Void](`history.back()`))
	p.waitView("job")
	p.search("nobody")
	p.waitFor("no match", `document.getElementById("search-msg").textContent === 'no item of this job has the custom_id "nobody"'`, 10*time.Second)
	p.search(strings.Repeat("x", 65))
	p.waitFor("too long", `document.getElementById("search-msg").textContent.includes("64 bytes")`, 10*time.Second)
	p.search(apitype.ItemID(id, 1))
	p.waitView("item")
	p.waitFor("the item found by ID", `document.getElementById("item").dataset.id === `+js(apitype.ItemID(id, 1)), 10*time.Second)
	p.search(id)
	p.waitView("job")
	if h := eval[string](p, `location.hash`); h != "#/jobs/"+id {
		t.Errorf("searching a batch's ID led to %s", h)
	}

	// Every item of a job of 250, a page of 100 at a time: three pages,
	// each item once; Previous goes back a page.
	var big strings.Builder
	for i := range 250 {
		fmt.Fprintf(&big, `{"custom_id":"big-%d","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`+"\n", i)
	}
	code, b, _ = s.DoAs(aliceKey, "POST", "/v1/batches", big.String(), "Content-Type", "application/x-ndjson")
	if code != 202 {
		t.Fatalf("the big batch: %d %s", code, b)
	}
	bigID := stacktest.Decode[apitype.BatchCreated](t, b).ID
	if code, b, _ := s.DoAs(aliceKey, "GET", "/v1/batches/"+bigID+"?limit=1&wait=30s", nil); code != 200 || !stacktest.Decode[apitype.Batch](t, b).Done {
		t.Fatalf("the big batch did not finish: %d %s", code, b)
	}
	p.visit("#/jobs/"+bigID, "job")
	seen := map[string]int{}
	var pages [][]string
	for page := 1; page <= 3; page++ {
		if page > 1 {
			p.do("next page", chromedp.Click(chromedp.ID("next-btn")))
		}
		p.waitFor(fmt.Sprintf("page %d", page), fmt.Sprintf(`document.getElementById("job").dataset.page === "%d"`, page), 10*time.Second)
		ids := eval[[]string](p, `[...document.querySelectorAll("#items tbody tr")].map(r => r.dataset.id)`)
		pages = append(pages, ids)
		for _, x := range ids {
			seen[x]++
		}
		more := eval[string](p, `document.getElementById("job").dataset.more`)
		if next := !eval[bool](p, `document.getElementById("next-btn").disabled`); next != (page < 3) || (more == "true") != (page < 3) {
			t.Errorf("page %d: Next enabled %v, more %s", page, next, more)
		}
		if prev := !eval[bool](p, `document.getElementById("prev-btn").disabled`); prev != (page > 1) {
			t.Errorf("page %d: Previous enabled %v", page, prev)
		}
	}
	p.shot("7-page-3")
	if len(pages[0]) != 100 || len(pages[1]) != 100 || len(pages[2]) != 50 {
		t.Errorf("pages of %d, %d and %d items, want 100, 100 and 50", len(pages[0]), len(pages[1]), len(pages[2]))
	}
	for i := range 250 {
		if n := seen[apitype.ItemID(bigID, i)]; n != 1 {
			t.Errorf("item %d seen %d times, want once", i, n)
		}
	}
	if len(seen) != 250 {
		t.Errorf("%d items seen, want 250", len(seen))
	}
	p.do("previous page", chromedp.Click(chromedp.ID("prev-btn")))
	p.waitFor("page 2 again", `document.getElementById("job").dataset.page === "2"`, 10*time.Second)
	if ids := eval[[]string](p, `[...document.querySelectorAll("#items tbody tr")].map(r => r.dataset.id)`); strings.Join(ids, ",") != strings.Join(pages[1], ",") {
		t.Errorf("page 2 again holds %v", ids)
	}
	// An item of page 2, and Back: page 2 still.
	p.do("open an item of page 2", chromedp.Evaluate[chromedp.Void](`location.hash = document.querySelector("#items tbody tr a").getAttribute("href")`))
	p.waitView("item")
	p.do("back to page 2", chromedp.Evaluate[chromedp.Void](`history.back()`))
	p.waitView("job")
	p.waitFor("page 2 after Back", `document.getElementById("job").dataset.page === "2" && document.querySelector("#items tbody tr").dataset.id === `+js(pages[1][0]), 10*time.Second)
	// A custom_id deep in the batch, past the first page of the search,
	// and one it does not hold, which takes every page.
	p.search("big-217")
	p.waitFor("big-217", `document.body.dataset.view === "item" && document.getElementById("item").dataset.id === `+js(apitype.ItemID(bigID, 217)), 10*time.Second)
	p.do("back to the big job", chromedp.Evaluate[chromedp.Void](`history.back()`))
	p.waitView("job")
	p.search("big-250")
	p.waitFor("no big-250", `document.getElementById("search-msg").textContent === 'no item of this job has the custom_id "big-250"'`, 10*time.Second)

	// Single tasks are listed beside the batches, each opening its
	// drawing.
	code, b, _ = s.DoAs(aliceKey, "POST", "/v1/tasks?wait=10s", `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`)
	if code != 200 {
		t.Fatalf("alice's task: %d %s", code, b)
	}
	task := stacktest.Decode[apitype.Task](t, b).ID
	p.visit("#/jobs", "jobs")
	trow := `document.querySelector('#tasks tr[data-id=` + js(task) + `]')`
	p.waitFor("the single task's row", trow, 10*time.Second)
	p.shot("8-jobs-and-tasks")
	if h := eval[string](p, trow+`.querySelector("a").getAttribute("href")`); h != "#/items/"+task {
		t.Errorf("the task's link is %s", h)
	}
	p.do("open the task", chromedp.Evaluate[chromedp.Void](`location.hash = `+trow+`.querySelector("a").getAttribute("href")`))
	p.waitView("item")
	p.waitFor("the task", `document.getElementById("item").dataset.id === `+js(task)+` && document.getElementById("item").dataset.ready === "completed"`, 10*time.Second)
	p.visit("#/jobs", "jobs")
	p.search(task)
	p.waitView("item")
	p.waitFor("the task by search", `location.hash === `+js("#/items/"+task), 10*time.Second)

	// A deep link to another key's batch: not found, nothing to act on,
	// and no more requests for it.
	p.visit("#/jobs/"+bobsBatch, "job")
	p.waitFor("not found", `document.getElementById("job-msg").textContent === "not found (or another key's)"`, 10*time.Second)
	p.shot("9-not-found")
	if dis := eval[bool](p, `document.getElementById("cancel-btn").disabled && document.getElementById("retry-btn").disabled`); !dis {
		t.Error("Cancel or Retry is enabled on a batch not found")
	}
	if shown := !eval[bool](p, `document.getElementById("download").hidden`); shown {
		t.Error("a download link for a batch not found")
	}
	p.do("clear the requests", chromedp.Evaluate[chromedp.Void](`performance.setResourceTimingBufferSize(10000); performance.clearResourceTimings()`))
	time.Sleep(3 * time.Second)
	if n := eval[int](p, `performance.getEntriesByType("resource").filter(e => e.name.includes(`+js(bobsBatch)+`)).length`); n != 0 {
		t.Errorf("%d requests for the batch not found in 3 s after its 404, want none", n)
	}

	// Cancel asks first: with the workers stopped a new batch stays
	// pending; the first confirm is dismissed and nothing is canceled,
	// the second accepted.
	dialogs := p.answerDialogs()
	if err := s.StopWorkers(); err != nil {
		t.Fatal(err)
	}
	p.visit("#/workers", "workers")
	p.waitFor("no worker alive", `document.getElementById("workers-alive") && document.getElementById("workers-alive").textContent === "0"`, 20*time.Second)
	if got := eval[string](p, `document.querySelector("#status p").textContent`); !strings.HasPrefix(got, "0 workers alive") {
		t.Errorf("the status line = %q, want 0 workers alive", got)
	}
	p.visit("#/jobs", "jobs")
	p.do("submit a batch to cancel",
		chromedp.SetValue(chromedp.ID("ndjson"), `{"custom_id":"never","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`),
		chromedp.Click(chromedp.ID("submit-btn")))
	p.waitFor("the second batch", `document.getElementById("submit-msg").dataset.id !== `+js(id), 10*time.Second)
	id2 := eval[string](p, `document.getElementById("submit-msg").dataset.id`)
	p.waitFor("the second batch's view", `document.getElementById("job-id").textContent === `+js(id2)+
		` && document.getElementById("job").dataset.done === "false" && !document.getElementById("cancel-btn").disabled`, 10*time.Second)
	dialogs.answer(false)
	p.do("cancel, dismissed", chromedp.Click(chromedp.ID("cancel-btn")))
	if msgs := dialogs.seen(); len(msgs) != 1 || !strings.Contains(msgs[0], id2) {
		t.Fatalf("dialogs %q, want one confirm naming %s", msgs, id2)
	}
	time.Sleep(time.Second)
	if done := eval[string](p, `document.getElementById("job").dataset.done`); done != "false" {
		t.Fatalf("a dismissed cancel canceled the batch (done %s)", done)
	}
	dialogs.answer(true)
	p.do("cancel", chromedp.Click(chromedp.ID("cancel-btn")))
	p.waitFor("the cancel", `document.getElementById("job").dataset.done === "true"`, 10*time.Second)
	p.shot("10-canceled")
	if got := eval[string](p, `document.getElementById("job-msg").textContent`); got != "canceled 1 item" {
		t.Errorf("cancel message %q", got)
	}
	if got := eval[string](p, `document.getElementById("page-note").textContent`); got != "page 1 · item 0" {
		t.Errorf("the pager of a batch of one says %q", got)
	}
	if !eval[bool](p, `!document.getElementById("download").hidden`) {
		t.Error("no download link on a batch found")
	}
	if n := len(dialogs.seen()); n != 2 {
		t.Errorf("%d confirms, want 2", n)
	}
	// Canceled items are no work done: the canceled batch has no rate.
	p.visit("#/jobs", "jobs")
	row2 := `document.querySelector('#jobs tr[data-id=` + js(id2) + `]')`
	p.waitFor("the canceled batch's row", row2+` && `+row2+`.dataset.done === "true"`, 10*time.Second)
	if r := eval[string](p, row2+`.querySelector(".rate").textContent`); r != "–" {
		t.Errorf("the canceled batch's rate is %q, want –", r)
	}

	// Delete asks too, then deletes the ended job and goes back to the
	// jobs, where it is no more; the API no longer finds it.
	p.visit("#/jobs/"+id2, "job")
	p.waitFor("Delete enabled on the canceled job", `document.getElementById("job-id").textContent === `+js(id2)+
		` && !document.getElementById("delete-btn").disabled`, 10*time.Second)
	p.do("delete", chromedp.Click(chromedp.ID("delete-btn")))
	p.waitView("jobs")
	if msgs := dialogs.seen(); len(msgs) != 3 || !strings.Contains(msgs[2], "Delete job "+id2) {
		t.Errorf("dialogs %q, want a third confirm deleting %s", msgs, id2)
	}
	p.waitFor("the deleted job's row gone", `!document.querySelector('#jobs tr[data-id=`+js(id2)+`]') && document.querySelector('#jobs tr[data-id=`+js(id)+`]')`, 10*time.Second)
	if st := eval[int](p, `fetch("/v1/batches/`+id2+`", {headers: {"X-Puzzleq-UI": "1"}}).then(r => r.status)`); st != 404 {
		t.Errorf("GET of the deleted batch: %d, want 404", st)
	}
	p.shot("11-deleted")
	// A single task that has ended is deleted from its page the same way.
	p.visit("#/items/"+task, "item")
	p.waitFor("Delete shown on the completed task", `document.getElementById("item").dataset.id === `+js(task)+
		` && !document.getElementById("item-delete-btn").hidden && document.getElementById("item-retry-btn").hidden`, 10*time.Second)
	p.do("delete the task", chromedp.Click(chromedp.ID("item-delete-btn")))
	p.waitView("jobs")
	if msgs := dialogs.seen(); len(msgs) != 4 || !strings.Contains(msgs[3], "Delete task "+task) {
		t.Errorf("dialogs %q, want a fourth confirm deleting %s", msgs, task)
	}
	p.waitFor("the deleted task's row gone", `!`+trow, 10*time.Second)
	if st := eval[int](p, `fetch("/v1/tasks/`+task+`", {headers: {"X-Puzzleq-UI": "1"}}).then(r => r.status)`); st != 404 {
		t.Errorf("GET of the deleted task: %d, want 404", st)
	}

	// Sign out: the cookie's session is gone, so the API refuses it.
	p.do("sign out", chromedp.Click(chromedp.ID("signout-btn")))
	p.waitFor("the sign-in form again", `!document.getElementById("signin").hidden`, 5*time.Second)
	if st := eval[int](p, `fetch("/v1/batches/`+id+`").then(r => r.status)`); st != 401 {
		t.Errorf("GET after sign-out: %d, want 401", st)
	}
}

// visit sets the page's location to the dashboard's fragment hash, as a
// link or a typed URL does, and waits for view to be the one shown.
func (p *page) visit(hash, view string) {
	p.t.Helper()
	p.do("visit "+hash, chromedp.Evaluate[chromedp.Void](`location.hash = `+js(hash)))
	p.waitView(view)
}

// waitView waits until view is the one view shown, and the nav bar with it.
func (p *page) waitView(view string) {
	p.t.Helper()
	p.waitFor("the "+view+" view", `(() => {
		const shown = [...document.querySelectorAll("#dash [data-view]")].filter(e => !e.hidden).map(e => e.dataset.view);
		return document.body.dataset.view === `+js(view)+` && shown.length === 1 && shown[0] === `+js(view)+
		` && !document.getElementById("nav").hidden && document.querySelector("#nav [aria-current=page]"); })()`, 10*time.Second)
}

// search types q into the nav bar's search box and submits it.
func (p *page) search(q string) {
	p.t.Helper()
	p.do("search "+q, chromedp.SetValue(chromedp.ID("search"), q), chromedp.Click(chromedp.ID("search-btn")))
}

// dialogs answers the page's JavaScript dialogs (confirm) as told, and
// keeps their messages.
type dialogs struct {
	mu     sync.Mutex
	accept bool
	msgs   []string
}

func (d *dialogs) answer(accept bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.accept = accept
}

func (d *dialogs) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.msgs...)
}

// answerDialogs answers every dialog the page opens from now on, on a
// goroutine of its own: the click that opens one waits for the answer.
func (p *page) answerDialogs() *dialogs {
	d := &dialogs{}
	events := chromedp.Events(p.ctx, cdppage.JavascriptDialogOpening)
	go func() {
		for ev, err := range events {
			if err != nil {
				return
			}
			d.mu.Lock()
			d.msgs = append(d.msgs, ev.Message)
			accept := d.accept
			d.mu.Unlock()
			if _, err := chromedp.Call(p.ctx, cdppage.HandleJavaScriptDialog, cdppage.HandleJavaScriptDialogParams{Accept: accept}); err != nil {
				p.t.Logf("answer the dialog: %v", err)
			}
		}
	}()
	return d
}

// itemEnd returns when a batch item last ended, by the API, as alice;
// "" while it has not ended.
func itemEnd(t *testing.T, s *stacktest.Stack, itemID string) string {
	t.Helper()
	code, b, _ := s.DoAs(aliceKey, "GET", "/v1/tasks/"+itemID, nil)
	if code != 200 {
		t.Fatalf("GET %s: %d %s", itemID, code, b)
	}
	tk := stacktest.Decode[apitype.Task](t, b)
	if !tk.Terminal() || tk.CompletedAt == nil {
		return ""
	}
	return tk.CompletedAt.Format(time.RFC3339Nano)
}

// download waits for the browser to save name in its download directory
// and returns its lines.
func (p *page) download(name string) []string {
	p.t.Helper()
	path := filepath.Join(p.downloads, name)
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
			return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		}
		if time.Now().After(deadline) {
			entries, _ := os.ReadDir(p.downloads)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			p.fail("download "+name, fmt.Errorf("not saved within 10 s; the directory has %v", names))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// With auth off (no keys) the dashboard needs no sign-in.
func TestDashboardAuthOffInBrowser(t *testing.T) {
	p := newPage(t)
	s := stacktest.StartWith(t, 1, nil)
	p.do("open /ui/", chromedp.Navigate(s.URL+"/ui/"))
	p.waitFor("the dashboard without sign-in", `!document.getElementById("dash").hidden && document.getElementById("signin").hidden`, 5*time.Second)
	if w := eval[string](p, `document.getElementById("whoami").textContent`); !strings.Contains(w, "auth off") {
		t.Errorf("whoami %q", w)
	}
	if hidden := eval[bool](p, `document.getElementById("signout-btn").hidden`); !hidden {
		t.Error("a sign-out button with auth off")
	}
	p.do("submit", chromedp.SetValue(chromedp.ID("ndjson"), batchNDJSON), chromedp.Click(chromedp.ID("submit-btn")))
	p.waitFor("the batch to finish", `document.getElementById("job").dataset.done === "true"`, 30*time.Second)
	p.shot("6-auth-off")
}
