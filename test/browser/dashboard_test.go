// Package browser_test drives the dashboard (internal/ui) in a real
// headless Chromium over the DevTools protocol, against an in-process
// stack (internal/stacktest): sign-in with a key, a batch with a failing
// item submitted from the page, its progress to done, tenant isolation,
// the results download, retry and cancel, and sign-out. It skips, saying
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
	s := stacktest.StartWith(t, 1, map[string]string{"API_KEYS": "alice:" + aliceKey + ",bob:" + bobKey})

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

	// The status panel (GET /v1/status) shows the stack's one worker.
	p.waitFor("a worker alive", `document.getElementById("workers-alive") && document.getElementById("workers-alive").textContent === "1"`, 10*time.Second)
	// Its queue table shows runs waiting for a solver slot apart from
	// retries, which asynq counts together.
	p.waitFor("the queues' columns", `[...document.querySelectorAll("#queues th")].map(e => e.textContent).join(",") === "queue,pending,active,waiting,retry,oldest pending"`, 10*time.Second)

	// Submit the batch from the page and watch it end.
	p.do("submit a batch",
		chromedp.SetValue(chromedp.ID("ndjson"), batchNDJSON),
		chromedp.Click(chromedp.ID("submit-btn")))
	p.waitFor("the batch's ID", `document.getElementById("submit-msg").dataset.id`, 10*time.Second)
	id := eval[string](p, `document.getElementById("submit-msg").dataset.id`)
	if !apitype.IsID(id) {
		t.Fatalf("submitted batch ID %q", id)
	}
	row := `document.querySelector('#jobs tr[data-id=` + js(id) + `]')`
	p.waitFor("the batch's row", row, 10*time.Second)
	p.waitFor("the batch to finish", row+`.dataset.done === "true"`, 30*time.Second)
	p.waitFor("the job's view to finish", `document.getElementById("job").dataset.done === "true"`, 10*time.Second)
	p.shot("2-batch-done")
	// The job's view followed its event stream (GET /v1/batches/{id}/events).
	p.waitFor("the job's event stream", `document.getElementById("job").dataset.live === "events"`, 5*time.Second)
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

	// The failed item, filtered by state, with its custom_id and error.
	p.do("filter failed items", chromedp.SetValue(chromedp.ID("state-filter"), "failed"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("state-filter").dispatchEvent(new Event("change"))`))
	p.waitFor("only failed items", `(() => { const r = [...document.querySelectorAll("#items tbody tr")];
		return r.length === 1 && r[0].dataset.state === "failed"; })()`, 10*time.Second)
	p.shot("3-failed-items")
	if got := eval[string](p, `document.querySelector("#items tbody tr .custom-id").textContent`); got != "too-hard" {
		t.Errorf("the failed item's custom_id = %q, want too-hard", got)
	}
	if got := eval[string](p, `document.querySelector("#items tbody tr td.error").textContent`); !strings.HasPrefix(got, "budget_exceeded: ") {
		t.Errorf("the failed item's error = %q, want budget_exceeded", got)
	}

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
	p.do("retry", chromedp.Click(chromedp.ID("retry-btn")))
	p.waitFor("the retry's answer", `document.getElementById("job-msg").textContent !== ""`, 10*time.Second)
	if msg := eval[string](p, `document.getElementById("job-msg").textContent`); msg != "retrying 1 items" {
		t.Fatalf("retry message %q, want retrying 1 items", msg)
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
	p.shot("4-retried")

	// Cancel: with the workers stopped a new batch stays pending, the
	// page says no worker is alive, and cancel ends it.
	if err := s.StopWorkers(); err != nil {
		t.Fatal(err)
	}
	p.waitFor("no worker alive", `document.getElementById("workers-alive") && document.getElementById("workers-alive").textContent === "0"`, 20*time.Second)
	p.do("submit a batch to cancel",
		chromedp.SetValue(chromedp.ID("ndjson"), `{"custom_id":"never","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`),
		chromedp.Click(chromedp.ID("submit-btn")))
	p.waitFor("the second batch", `document.getElementById("submit-msg").dataset.id !== `+js(id), 10*time.Second)
	id2 := eval[string](p, `document.getElementById("submit-msg").dataset.id`)
	p.waitFor("the second batch's view", `document.getElementById("job-id").textContent === `+js(id2)+
		` && document.getElementById("job").dataset.done === "false"`, 10*time.Second)
	p.do("cancel", chromedp.Click(chromedp.ID("cancel-btn")))
	p.waitFor("the cancel", `document.getElementById("job").dataset.done === "true"`, 10*time.Second)
	p.shot("5-canceled")
	if got := eval[string](p, `document.getElementById("job-msg").textContent`); got != "canceled 1 items" {
		t.Errorf("cancel message %q", got)
	}

	// Sign out: the cookie's session is gone, so the API refuses it.
	p.do("sign out", chromedp.Click(chromedp.ID("signout-btn")))
	p.waitFor("the sign-in form again", `!document.getElementById("signin").hidden`, 5*time.Second)
	if st := eval[int](p, `fetch("/v1/batches/`+id+`").then(r => r.status)`); st != 401 {
		t.Errorf("GET after sign-out: %d, want 401", st)
	}
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
