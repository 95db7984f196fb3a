package api_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	pqclient "github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// TestHistoryOnAStack runs single tasks (solved and answered from the
// cache) and a batch as one key on a real stack, and reads the history
// back: the key's own minutes count every task that ended, its singles'
// latency and its pending sample; another key sees none of it, the
// operators' route sees it all, and a tenant key cannot open that route.
func TestHistoryOnAStack(t *testing.T) {
	t.Parallel()
	const alice, bob, ops = "alice-key-0123456789", "bob-key-0123456789ab", "ops-key-0123456789abc"
	s := stacktest.StartWith(t, 1, map[string]string{
		"API_KEYS": "alice:" + alice + ",bob:" + bob, "OPERATOR_KEYS": "ops:" + ops,
		"HISTORY_INTERVAL": "200ms", "KEY_PREFIX": "hist:",
	})
	// Three distinct 8-puzzles, one of them twice: the second is a
	// cache hit the API answers itself.
	boards := []string{"[[1,0,3],[4,2,5],[7,8,6]]", "[[1,2,3],[4,0,5],[7,8,6]]", "[[1,2,3],[4,5,6],[7,0,8]]", "[[1,2,3],[4,5,6],[7,0,8]]"}
	for _, b := range boards {
		code, body, _ := s.DoAs(alice, "POST", "/v1/tasks?wait=10s", `{"kind":"sliding","puzzle":{"board":`+b+`}}`)
		if code != http.StatusOK {
			t.Fatalf("single task: %d %s", code, body)
		}
	}
	ndjson := `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}` + "\n" + overBudget + "\n"
	code, body, _ := s.DoAs(alice, "POST", "/v1/batches", ndjson, "Content-Type", "application/x-ndjson")
	if code != http.StatusAccepted {
		t.Fatalf("batch: %d %s", code, body)
	}
	id := stacktest.Decode[apitype.BatchCreated](t, body).ID
	if code, body, _ := s.DoAs(alice, "GET", "/v1/batches/"+id+"?wait=10s", nil); code != http.StatusOK {
		t.Fatalf("batch wait: %d %s", code, body)
	}

	sum := func(h apitype.History) (completed, failed, singles int64, p50 *float64, pending bool) {
		for _, p := range h.Minutes {
			completed += p.Completed
			failed += p.Failed
			singles += p.Singles
			if p.P50Ms != nil {
				p50 = p.P50Ms
			}
			pending = pending || p.Pending != nil
		}
		return
	}
	// The workers write every 200 ms; wait for all of it.
	var h apitype.History
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		h = getAs[apitype.History](t, s, alice, "/v1/history?minutes=3", http.StatusOK)
		if c, f, n, _, p := sum(h); c == 5 && f == 1 && n == 4 && p {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice's history after 10 s: %+v; want 5 completed, 1 failed, 4 singles and a pending sample", h)
		}
	}
	_, _, _, p50, _ := sum(h)
	if h.Scope != apitype.HistoryScopeKey || len(h.Minutes) != 3 || p50 == nil || *p50 < 1 || *p50 > 10000 {
		t.Errorf("alice's history: scope %q, %d minutes, p50 %v", h.Scope, len(h.Minutes), p50)
	}
	last := h.Minutes[len(h.Minutes)-1].Time
	if now := time.Now().UTC().Truncate(time.Minute); !last.Equal(now) && !last.Equal(now.Add(-time.Minute)) {
		t.Errorf("the last point is %s; want the current minute (%s)", last, now)
	}
	if c, f, n, _, _ := sum(getAs[apitype.History](t, s, bob, "/v1/history?minutes=3", http.StatusOK)); c+f+n != 0 {
		t.Errorf("bob's history counts alice's tasks: %d completed, %d failed, %d singles", c, f, n)
	}
	all := getAs[apitype.History](t, s, ops, "/history?minutes=3", http.StatusOK)
	if c, f, _, _, _ := sum(all); all.Scope != apitype.HistoryScopeAll || c != 5 || f != 1 {
		t.Errorf("the operators' history: scope %q, %d completed, %d failed; want all of alice's", all.Scope, c, f)
	}
	if code, body, _ := s.DoAs(alice, "GET", "/history", nil); code != http.StatusForbidden {
		t.Errorf("a tenant key on /history: %d %s; want 403", code, body)
	}
	for _, q := range []string{"0", "1441", "x"} {
		code, body, _ := s.DoAs(alice, "GET", "/v1/history?minutes="+q, nil)
		if e := stacktest.Decode[apitype.ErrorBody](t, body); code != http.StatusBadRequest || e.Error.Field != "minutes" {
			t.Errorf("minutes=%s: %d %s; want 400 on the field minutes", q, code, body)
		}
	}
	if got := fmt.Sprint(len(getAs[apitype.History](t, s, alice, "/v1/history", http.StatusOK).Minutes)); got != "60" {
		t.Errorf("the default span is %s minutes, want 60", got)
	}
	// History reads are bounded per key: two reads of 1,400 minutes fit
	// bob's budget of 2,880 (he read 3 above), a third waits.
	for i := range 3 {
		code, body, h := s.DoAs(bob, "GET", "/v1/history?minutes=1400", nil)
		switch {
		case i < 2 && code != http.StatusOK:
			t.Fatalf("day read %d: %d %s", i+1, code, body)
		case i == 2 && (code != http.StatusTooManyRequests || h.Get("Retry-After") == ""):
			t.Fatalf("third day read in a row: %d %s (Retry-After %q); want 429 with Retry-After", code, body, h.Get("Retry-After"))
		}
	}
	if code, body, _ := s.DoAs(alice, "GET", "/v1/history?minutes=60", nil); code != http.StatusOK {
		t.Errorf("alice's hour after bob spent his budget: %d %s; each key has its own", code, body)
	}
	// The Go client reads the same.
	ch, err := pqclient.New(s.URL, pqclient.WithAPIKey(alice)).History(context.Background(), 3)
	if c, f, n, _, _ := sum(*ch); err != nil || ch.Scope != apitype.HistoryScopeKey || len(ch.Minutes) != 3 || c != 5 || f != 1 || n != 4 {
		t.Errorf("client.History: %+v, %v", ch, err)
	}
}
