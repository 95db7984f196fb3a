package browser_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// TestHistoryChartedInBrowser runs a batch and a single task on a real
// stack, opens the dashboard's history at its URL, and reads the charts as
// drawn: the minute's completed and failed bars carry the batch's and the
// task's counts, and the latency chart has the single task's point.
func TestHistoryChartedInBrowser(t *testing.T) {
	p := newPage(t)
	s := stacktest.StartWith(t, 1, map[string]string{"HISTORY_INTERVAL": "200ms"})
	code, body, _ := s.DoH("POST", "/v1/batches", batchNDJSON, "Content-Type", "application/x-ndjson")
	if code != http.StatusAccepted {
		t.Fatalf("batch: %d %s", code, body)
	}
	id := stacktest.Decode[apitype.BatchCreated](t, body).ID
	if code, body := s.Do("GET", "/v1/batches/"+id+"?wait=20s", nil); code != http.StatusOK {
		t.Fatalf("batch wait: %d %s", code, body)
	}
	if code, body := s.Do("POST", "/v1/tasks?wait=20s", `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`); code != http.StatusOK {
		t.Fatalf("single task: %d %s", code, body)
	}

	p.do("open the history", chromedp.Navigate(s.URL+"/ui/#/history"))
	// The batch's 2 completed and 1 failed, and the single task: 3
	// completed and 1 failed in all, in one minute or across two.
	sum := func(sel string) string {
		return `[...document.querySelectorAll(` + js(sel) + `)].reduce((n, e) => n + Number(e.dataset.value), 0)`
	}
	p.waitFor("the batch and the task in the chart", sum("[data-chart=throughput] rect.bar-completed")+` === 3 && `+
		sum("[data-chart=throughput] rect.bar-failed")+` === 1`, 15*time.Second)
	if n := eval[int](p, `document.querySelectorAll("[data-chart=latency] circle.line-p50").length`); n < 1 {
		t.Errorf("the latency chart has %d p50 points; want the single task's minute", n)
	}
	if got := eval[string](p, `document.querySelector(".chart-summary").textContent`); got != "3 completed, 1 failed in the last 60 minutes (every key)." {
		t.Errorf("summary %q", got)
	}
	if n := eval[int](p, `document.querySelectorAll("[data-chart=throughput] title").length`); n < 2 {
		t.Errorf("%d titles in the throughput chart; every bar names its minute and counts", n)
	}
	p.shot("7-history")
}

// TestItemCanceledAndRetriedInBrowser cancels one single task from its
// item view: with no worker it stays pending, the view offers Cancel,
// which asks first, and the item then shows canceled and offers Cancel
// no more, nor Retry. A batch item canceled the same way offers Retry,
// which queues it again; a worker then completes it under its ID.
func TestItemCanceledAndRetriedInBrowser(t *testing.T) {
	p := newPage(t)
	s := stacktest.StartWith(t, 0, nil)
	code, body := s.Do("POST", "/v1/tasks", `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`)
	if code != http.StatusAccepted {
		t.Fatalf("single task: %d %s", code, body)
	}
	id := stacktest.Decode[apitype.Task](t, body).ID
	dialogs := p.answerDialogs()
	dialogs.answer(true)
	p.do("open the item", chromedp.Navigate(s.URL+"/ui/#/items/"+id))
	p.waitFor("Cancel offered", `!document.getElementById("item-cancel-btn").hidden`, 10*time.Second)
	p.do("cancel", chromedp.Click(chromedp.ID("item-cancel-btn")))
	p.waitFor("the item canceled", `document.getElementById("item-meta").textContent.includes("canceled") && `+
		`document.getElementById("item-cancel-btn").hidden`, 10*time.Second)
	if msgs := dialogs.seen(); len(msgs) != 1 || !strings.Contains(msgs[0], id) {
		t.Errorf("dialogs %q, want one confirm naming %s", msgs, id)
	}
	if got := s.WaitTask(id, 5*time.Second); got.State != apitype.TaskStateCanceled {
		t.Errorf("the API says %s, want canceled", got.State)
	}
	// A single task is run again by submitting it again: no Retry.
	if !eval[bool](p, `document.getElementById("item-retry-btn").hidden`) {
		t.Errorf("Retry offered on a canceled single task")
	}
	p.shot("9-item-canceled")

	// A batch item canceled, then retried from its view: it runs again
	// under its ID once a worker comes.
	code, body, _ = s.DoH("POST", "/v1/batches", `{"custom_id":"again","kind":"sliding","puzzle":{"board":[[1,2,3],[4,0,5],[7,8,6]]}}`+"\n",
		"Content-Type", "application/x-ndjson")
	if code != http.StatusAccepted {
		t.Fatalf("batch: %d %s", code, body)
	}
	item := apitype.ItemID(stacktest.Decode[apitype.BatchCreated](t, body).ID, 0)
	p.do("open the batch item", chromedp.Navigate(s.URL+"/ui/#/items/"+item))
	p.waitFor("Cancel offered on the item", `document.getElementById("item").dataset.id === `+js(item)+` && !document.getElementById("item-cancel-btn").hidden`, 10*time.Second)
	p.do("cancel the item", chromedp.Click(chromedp.ID("item-cancel-btn")))
	p.waitFor("Retry offered", `document.getElementById("item-meta").textContent.includes("canceled") && !document.getElementById("item-retry-btn").hidden`, 10*time.Second)
	p.do("retry the item", chromedp.Click(chromedp.ID("item-retry-btn")))
	p.waitFor("the item queued again", `document.getElementById("item-msg").textContent === "queued again" && `+
		`document.getElementById("item-meta").textContent.includes("pending") && document.getElementById("item-retry-btn").hidden`, 10*time.Second)
	s.AddWorker(nil)
	p.waitFor("the item completed", `document.getElementById("item-meta").textContent.includes("completed")`, 20*time.Second)
	if got := s.WaitTask(item, 5*time.Second); got.State != apitype.TaskStateCompleted || got.ID != item {
		t.Errorf("the API says %+v, want %s completed", got, item)
	}
	p.shot("9-item-retried")
}

// TestSearchFindsIDShapedCustomIDs searches, on a job's view, custom_ids
// that look like IDs (an md5 sum in capitals) or keep spaces, and ones
// typed with a stray space (an ID-shaped one, and one of 64 bytes that
// the space takes past the limit): the search opens the job's item that
// has each, not an item of that ID.
func TestSearchFindsIDShapedCustomIDs(t *testing.T) {
	p := newPage(t)
	s := stacktest.StartWith(t, 1, nil)
	const md5 = "D41D8CD98F00B204E9800998ECF8427E"
	long := strings.Repeat("x", 64)
	body := `{"custom_id":"` + md5 + `","kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}` + "\n" +
		`{"custom_id":" spaced ","kind":"sliding","puzzle":{"board":[[1,2,3],[4,0,5],[7,8,6]]}}` + "\n" +
		`{"custom_id":"` + long + `","kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}` + "\n"
	code, b, _ := s.DoH("POST", "/v1/batches", body, "Content-Type", "application/x-ndjson")
	if code != http.StatusAccepted {
		t.Fatalf("batch: %d %s", code, b)
	}
	id := stacktest.Decode[apitype.BatchCreated](t, b).ID
	for _, c := range []struct {
		q     string
		index int
	}{{md5, 0}, {" spaced ", 1}, {md5 + " ", 0}, {long + " ", 2}} {
		q := c.q
		p.do("open the job", chromedp.Navigate(s.URL+"/ui/#/jobs/"+id))
		p.waitView("job")
		p.do("search "+q, chromedp.SetValue(chromedp.ID("search"), q), chromedp.Click(chromedp.ID("search-btn")))
		want := "#/items/" + id + "-" + strconv.Itoa(c.index)
		p.waitFor("the item of custom_id "+q, `location.hash === `+js(want), 10*time.Second)
	}
}
