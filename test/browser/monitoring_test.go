package browser_test

import (
	"context"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/puzzleq/puzzleq/internal/app"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/tasks"
)

// TestMonitoringInChromium loads the asynqmon dashboard at /monitoring/
// in headless Chromium and checks that it lists our queues, read-only.
func TestMonitoringInChromium(t *testing.T) {
	browser := chromium()
	if browser == "" {
		t.Skip("no Chromium: install Debian's chromium package (.ci/run does) or set PUZZLEQ_CHROMIUM")
	}
	st := stacktest.Start(t, stacktest.Options{Workers: 1, Env: map[string]string{"LOG_LEVEL": "error"}})
	stacktest.SolveSome(t, st.URL)

	queues := append(slices.Clone(tasks.Queues), tasks.CheapQueues...)
	// The page fetches the queues after it loads; on a loaded machine the
	// virtual time budget may run out first, so try up to three times.
	var dom []byte
	var text string
	for attempt := 1; ; attempt++ {
		dom = dumpDOM(t, browser, st.URL+app.MonitoringPath)
		text = visibleText(string(dom))
		missing := !strings.Contains(text, "Queue Size")
		for _, q := range queues {
			missing = missing || !regexp.MustCompile(`\b`+regexp.QuoteMeta(q)+`\b`).MatchString(text)
		}
		if !missing {
			break
		}
		if attempt == 3 {
			t.Fatalf("the queues page does not list every queue of %v; page text: %.2000s", queues, text)
		}
		t.Logf("attempt %d: the page is not complete yet; page text: %.300s", attempt, text)
	}
	if !strings.Contains(string(dom), `FLAG_READ_ONLY="true"`) {
		t.Errorf("the dashboard is not in read-only mode")
	}
	t.Logf("Chromium rendered %s%s listing %v", st.URL, app.MonitoringPath, queues)

	// Read-only: asynqmon refuses anything but GET.
	req, _ := http.NewRequest(http.MethodDelete, st.URL+app.MonitoringPath+"api/queues/"+tasks.QueueBulk, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode < 400 {
		t.Errorf("DELETE of a queue through the dashboard: %s, want refused", resp.Status)
	}
}

// dumpDOM loads url in headless Chromium and returns the DOM after the
// page's scripts ran.
func dumpDOM(t *testing.T, browser, url string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
		"--disable-dev-shm-usage", "--user-data-dir="+t.TempDir(), "--virtual-time-budget=15000",
		"--dump-dom", url)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	dom, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	return dom
}

var (
	tagsRe  = regexp.MustCompile(`(?s)<(script|style)[^>]*>.*?</(script|style)>|<[^>]*>`)
	spaceRe = regexp.MustCompile(`\s+`)
)

// visibleText is html's text without tags, scripts and styles, its
// spaces collapsed.
func visibleText(html string) string {
	return strings.TrimSpace(spaceRe.ReplaceAllString(tagsRe.ReplaceAllString(html, " "), " "))
}

// TestOperatorSignInLooksLikeTheDashboard opens the operators' sign-in page
// in headless Chromium: it loads the jobs dashboard's style sheet under its
// own Content-Security-Policy (so it is styled, not bare HTML), links the
// tenants' sign-in, and the tenants' sign-in links it back.
func TestOperatorSignInLooksLikeTheDashboard(t *testing.T) {
	p := newPage(t)
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:" + aliceKey, "OPERATOR_KEYS": "ops:ops-browser-key-000003"})
	p.do("open the operators' sign-in", chromedp.Navigate(s.URL+app.MonitoringPath+"login"))
	p.waitFor("the style sheet applied", `getComputedStyle(document.querySelector("header")).borderBottomStyle === "solid" && `+
		`getComputedStyle(document.querySelector("#signin")).display !== "none"`, 5*time.Second)
	if href := eval[string](p, `document.querySelector('#signin a[href="/ui/"]') ? "/ui/" : ""`); href != "/ui/" {
		t.Error("the operators' sign-in does not link the tenants' one")
	}
	p.shot("8-operator-signin")
	p.do("open the tenants' sign-in", chromedp.Navigate(s.URL+"/ui/"))
	p.waitFor("the sign-in", `!document.getElementById("signin").hidden`, 5*time.Second)
	if n := eval[int](p, `document.querySelectorAll('#signin a[href="/monitoring/login"]').length`); n != 1 {
		t.Error("the tenants' sign-in does not link the operators' one")
	}
}
