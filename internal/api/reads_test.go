package api

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// The tests in this file drive the read side of batches (items, /results,
// /output) and the reconciler on a real redis-server, with batches staged
// and run through the store itself (BatchWriter, CommitBatch, StartUnit,
// FinishUnit), as the ingest path and a worker do.

// The API keys of the tests: a batch of alice's is not bob's to see.
const (
	aliceKey = "alice-key-0123456789"
	bobKey   = "bob-key-0123456789ab"
)

// readStack is a Server on a real Redis with its event listener running,
// and the store and asynq queue behind it.
type readStack struct {
	srv  *Server
	st   *store.Store
	hub  *store.Hub
	enq  *asynq.Client
	insp *asynq.Inspector
	rdb  *redis.Client
}

func newReadStack(t testing.TB, tune ...func(*Options)) *readStack {
	t.Helper()
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	st := store.New(rdb, store.Options{Prefix: "rd:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	hub := store.NewHub()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); st.ListenEvents(ctx, hub) }()
	t.Cleanup(func() { cancel(); <-done })
	enq := asynq.NewClientFromRedisClient(rdb)
	opts := OptionsForTest()
	opts.ChunkSize = 2
	opts.Keys = []APIKey{{Name: "alice", Key: aliceKey}, {Name: "bob", Key: bobKey}}
	for _, f := range tune {
		f(&opts)
	}
	srv := New(st, hub, prometheus.NewRegistry(), nil, opts)
	// Wait until the subscription is up, so no event of the test is lost.
	for i := 0; ; i++ {
		n, err := rdb.PubSubNumSub(context.Background(), "rd:events").Result()
		if err == nil && n["rd:events"] > 0 {
			break
		}
		if i == 200 {
			t.Fatalf("the event listener did not subscribe: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &readStack{srv: srv, st: st, hub: hub, enq: enq, insp: asynq.NewInspectorFromRedisClient(rdb), rdb: rdb}
}

// sliding8 is the canonical request of an 8-puzzle, distinct per i.
func sliding8(t testing.TB, i int) []byte {
	t.Helper()
	body := testgen.EightPuzzle(i)
	parsed, err := puzzle.Decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return parsed.Payload()
}

// stage commits alice's batch of n cheap items, stride to a chunk, with
// customID(i) as item i's custom_id, and returns its ID.
func (s *readStack) stage(t *testing.T, n, stride int, customID func(int) string) string {
	t.Helper()
	ctx := context.Background()
	id := newID()
	w := s.st.NewBatchWriter(id, stride)
	for i := range n {
		it := store.StagedItem{Kind: puzzle.KindSliding, Request: sliding8(t, i), Timeout: time.Minute}
		if customID != nil {
			it.CustomID = customID(i)
		}
		if err := w.Add(ctx, it); err != nil {
			t.Fatalf("stage item %d: %v", i, err)
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.st.CommitBatch(ctx, w, store.CommitBatch{ID: id, Owner: "alice"}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return id
}

// run delivers chunk j of batch id as a worker does, ending its items
// with outs, and returns how many items that ended.
func (s *readStack) run(t *testing.T, id string, j int, outs ...worker.ItemOutcome) int {
	t.Helper()
	ctx := context.Background()
	ref := tasks.UnitRef{BatchID: id, Unit: tasks.ChunkUnit(j), Timeout: time.Minute}
	w, err := s.st.StartUnit(ctx, ref)
	if err != nil {
		t.Fatalf("start %s: %v", ref.Unit, err)
	}
	n, err := s.st.FinishUnit(ctx, ref, w.Mark, outs)
	if err != nil {
		t.Fatalf("finish %s: %v", ref.Unit, err)
	}
	return n
}

func completed(i int, result string) worker.ItemOutcome {
	return worker.ItemOutcome{Index: i, State: apitype.TaskStateCompleted, Result: json.RawMessage(result)}
}

func failed(i int, code, msg string) worker.ItemOutcome {
	return worker.ItemOutcome{Index: i, State: apitype.TaskStateFailed, Code: code, Msg: msg}
}

// do sends a request as the owner of key ("" for none).
func (s *readStack) do(t *testing.T, method, path, key string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	s.serve(t, w, req)
	return w
}

// serve serves req to w. A stream the handler cuts after its first byte
// ends in panic(http.ErrAbortHandler), which net/http's server turns into
// a closed connection; served straight to a recorder it would abort the
// whole test binary, so it is recovered here and fails the test that
// made the request, saying so, since a recorder's 200 and short body
// would otherwise pass for a whole answer.
func (s *readStack) serve(t *testing.T, w *httptest.ResponseRecorder, req *http.Request) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			if r != http.ErrAbortHandler {
				panic(r)
			}
			t.Errorf("%s %s: the stream was cut after %d bytes (status %d)", req.Method, req.URL, w.Body.Len(), w.Code)
		}
	}()
	s.srv.Handler().ServeHTTP(w, req)
}

// want checks a response's status, and returns its body decoded as T.
func want[T any](t *testing.T, w *httptest.ResponseRecorder, status int) T {
	t.Helper()
	var v T
	if w.Code != status {
		t.Fatalf("status %d, want %d: %s", w.Code, status, w.Body)
	}
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, w.Body)
	}
	return v
}

// wantError checks an error answer's status, code and field.
func wantError(t *testing.T, w *httptest.ResponseRecorder, status int, code, field string) apitype.Error {
	t.Helper()
	e := want[apitype.ErrorBody](t, w, status).Error
	if e.Code != code || e.Field != field {
		t.Fatalf("error %+v, want code %q field %q", e, code, field)
	}
	return e
}

// waiting blocks until a long poll is subscribed to the hub.
func (s *readStack) waiting(t *testing.T) {
	t.Helper()
	for i := 0; s.hub.Waiting() == 0; i++ {
		if i == 500 {
			t.Fatal("no long poll subscribed within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// background serves a request in a goroutine; the channel gets the answer.
func (s *readStack) background(t *testing.T, path string) <-chan *httptest.ResponseRecorder {
	t.Helper()
	ch := make(chan *httptest.ResponseRecorder, 1)
	req := httptest.NewRequest("GET", path, nil)
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	go func() {
		w := httptest.NewRecorder()
		defer func() { ch <- w }()
		s.serve(t, w, req)
	}()
	return ch
}

func strp(s string) *string { return &s }

func TestItemIsATask(t *testing.T) {
	t.Parallel()
	s := newReadStack(t)
	id := s.stage(t, 3, 2, func(i int) string { return []string{"first", "", "third"}[i] })

	tk := want[apitype.Task](t, s.do(t, "GET", "/v1/tasks/"+apitype.ItemID(id, 1), aliceKey), 200)
	if tk.ID != apitype.ItemID(id, 1) || tk.State != apitype.TaskStatePending || tk.BatchID == nil || *tk.BatchID != id ||
		tk.CustomID != nil || tk.Kind != "sliding" {
		t.Fatalf("pending item: %+v", tk)
	}
	tk = want[apitype.Task](t, s.do(t, "GET", "/v1/tasks/"+apitype.ItemID(id, 2), aliceKey), 200)
	if tk.CustomID == nil || *tk.CustomID != "third" {
		t.Fatalf("item 2's custom_id: %v, want third", tk.CustomID)
	}

	// A long poll on item 1 is woken by its chunk's finish, not by the
	// re-read every recheckEvery.
	start := time.Now()
	ch := s.background(t, "/v1/tasks/"+apitype.ItemID(id, 1)+"?wait=30s")
	s.waiting(t)
	if n := s.run(t, id, 0, completed(0, `{"moves":0,"solvable":true,"path":""}`), completed(1, `{"moves":1,"solvable":true,"path":"R"}`)); n != 2 {
		t.Fatalf("finish ended %d items, want 2", n)
	}
	w := <-ch
	if took := time.Since(start); took >= recheckEvery {
		t.Fatalf("the wait took %s: not woken by the chunk's event", took)
	}
	tk = want[apitype.Task](t, w, 200)
	if tk.State != apitype.TaskStateCompleted || string(tk.Result) != `{"moves":1,"solvable":true,"path":"R"}` {
		t.Fatalf("after the wait: %+v %s", tk, tk.Result)
	}

	// Not an item of the batch, or not an item ID at all: 404.
	for _, p := range []string{apitype.ItemID(id, 3), id + "-01", id + "-", id + "--1", id + "-1x", strings.ToUpper(id) + "-1"} {
		wantError(t, s.do(t, "GET", "/v1/tasks/"+p, aliceKey), 404, apitype.CodeNotFound, "")
	}
}

func TestItemsAreTheOwnersOnly(t *testing.T) {
	t.Parallel()
	s := newReadStack(t)
	id := s.stage(t, 2, 2, nil)
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/tasks/" + apitype.ItemID(id, 0)},
		{"GET", "/v1/tasks/" + apitype.ItemID(id, 0) + "?wait=1s"},
		{"DELETE", "/v1/tasks/" + apitype.ItemID(id, 0)},
		{"GET", "/v1/batches/" + id},
		{"DELETE", "/v1/batches/" + id},
		{"GET", "/v1/batches/" + id + "/results"},
		{"GET", "/v1/batches/" + id + "/output"},
	} {
		wantError(t, s.do(t, r.method, r.path, bobKey), 404, apitype.CodeNotFound, "")
	}
	// Bob's DELETEs changed nothing.
	b := want[apitype.Batch](t, s.do(t, "GET", "/v1/batches/"+id, aliceKey), 200)
	if b.Counts.Pending != 2 {
		t.Fatalf("after bob's cancels: %+v", b.Counts)
	}
}

func TestCancelItemAndBatch(t *testing.T) {
	t.Parallel()
	s := newReadStack(t)
	id := s.stage(t, 5, 2, func(i int) string { return fmt.Sprint("c", i) })
	s.run(t, id, 0, completed(0, `{"moves":0,"solvable":true,"path":""}`), failed(1, apitype.CodeTimeout, "too slow"))
	// A redelivered unit ends and counts nothing twice.
	if n := s.run(t, id, 0, completed(0, `{"moves":0,"solvable":true,"path":""}`), completed(1, `{"moves":9,"solvable":true,"path":"RRRRRRRRR"}`)); n != 0 {
		t.Fatalf("a redelivered unit ended %d items, want 0", n)
	}

	tk := want[apitype.Task](t, s.do(t, "DELETE", "/v1/tasks/"+apitype.ItemID(id, 2), aliceKey), 200)
	if tk.State != apitype.TaskStateCanceled || tk.Error == nil || tk.Error.Code != apitype.CodeCanceled || tk.CustomID == nil || *tk.CustomID != "c2" {
		t.Fatalf("canceled item: %+v", tk)
	}
	// Too late for the items that completed or failed; a repeat for the
	// canceled one (a retry whose first answer was lost) is answered as
	// the first was.
	for _, i := range []int{0, 1} {
		wantError(t, s.do(t, "DELETE", "/v1/tasks/"+apitype.ItemID(id, i), aliceKey), 409, apitype.CodeConflict, "")
	}
	if tk := want[apitype.Task](t, s.do(t, "DELETE", "/v1/tasks/"+apitype.ItemID(id, 2), aliceKey), 200); tk.State != apitype.TaskStateCanceled {
		t.Fatalf("repeated item cancel: %+v", tk)
	}
	bc := want[apitype.BatchCanceled](t, s.do(t, "DELETE", "/v1/batches/"+id, aliceKey), 200)
	if bc.Canceled != 2 {
		t.Fatalf("batch cancel canceled %d, want 2 (items 3 and 4)", bc.Canceled)
	}
	// The batch has ended by this cancel: a retry of it is a 200 that
	// cancels nothing more, not a 409 that reads like a failure.
	if bc := want[apitype.BatchCanceled](t, s.do(t, "DELETE", "/v1/batches/"+id, aliceKey), 200); bc.Canceled != 0 {
		t.Fatalf("repeated batch cancel canceled %d, want 0", bc.Canceled)
	}

	// A batch that ended without a cancel has nothing to cancel: 409.
	done := s.stage(t, 2, 2, nil)
	s.run(t, done, 0, completed(0, `{"moves":0,"solvable":true,"path":""}`), completed(1, `{"moves":0,"solvable":true,"path":""}`))
	wantError(t, s.do(t, "DELETE", "/v1/batches/"+done, aliceKey), 409, apitype.CodeConflict, "")
	// A unit delivered after the cancel changes nothing either.
	if n := s.run(t, id, 1, completed(2, `{"moves":0,"solvable":true,"path":""}`), completed(3, `{"moves":0,"solvable":true,"path":""}`)); n != 0 {
		t.Fatalf("a unit run after the cancel ended %d items, want 0", n)
	}

	b := want[apitype.Batch](t, s.do(t, "GET", "/v1/batches/"+id, aliceKey), 200)
	wantCounts := apitype.Counts{Completed: 1, Failed: 1, Canceled: 3}
	if b.Counts != wantCounts || !b.Done || b.Total != 5 || len(b.Tasks) != 5 || b.NextCursor != nil {
		t.Fatalf("batch: counts %+v done %v total %d tasks %d, want %+v done", b.Counts, b.Done, b.Total, len(b.Tasks), wantCounts)
	}
	wantStates := []apitype.TaskState{"completed", "failed", "canceled", "canceled", "canceled"}
	for i, tk := range b.Tasks {
		if tk.ID != apitype.ItemID(id, i) || tk.State != wantStates[i] || tk.CustomID == nil || *tk.CustomID != fmt.Sprint("c", i) {
			t.Errorf("task %d: %+v, want %s", i, tk, wantStates[i])
		}
	}
	// Pages: cursor and limit as for any batch.
	p := want[apitype.Batch](t, s.do(t, "GET", "/v1/batches/"+id+"?limit=2&cursor=2", aliceKey), 200)
	if len(p.Tasks) != 2 || p.Tasks[0].ID != apitype.ItemID(id, 2) || p.NextCursor == nil || *p.NextCursor != "4" {
		t.Fatalf("page 2: %d tasks, next %v", len(p.Tasks), p.NextCursor)
	}
	p = want[apitype.Batch](t, s.do(t, "GET", "/v1/batches/"+id+"?cursor=4", aliceKey), 200)
	if len(p.Tasks) != 1 || p.NextCursor != nil {
		t.Fatalf("last page: %d tasks, next %v", len(p.Tasks), p.NextCursor)
	}
	p = want[apitype.Batch](t, s.do(t, "GET", "/v1/batches/"+id+"?cursor=9", aliceKey), 200)
	if len(p.Tasks) != 0 || p.NextCursor != nil {
		t.Fatalf("past the end: %d tasks, next %v", len(p.Tasks), p.NextCursor)
	}
}

// lines decodes an NDJSON body.
func lines(t *testing.T, body []byte) []apitype.ResultLine {
	t.Helper()
	var out []apitype.ResultLine
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 8<<20)
	for sc.Scan() {
		var l apitype.ResultLine
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("line %d: %v: %.200s", len(out), err, sc.Bytes())
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(body) > 0 && body[len(body)-1] != '\n' {
		t.Fatalf("the body does not end in a newline")
	}
	return out
}

func TestResults(t *testing.T) {
	t.Parallel()
	s := newReadStack(t)
	id := s.stage(t, 5, 2, func(i int) string { return []string{"a", "", "c", "d", ""}[i] })
	r0 := `{"moves":0,"solvable":true,"path":""}`
	s.run(t, id, 0, completed(0, r0), failed(1, apitype.CodeTimeout, "too slow"))
	want[apitype.Task](t, s.do(t, "DELETE", "/v1/tasks/"+apitype.ItemID(id, 4), aliceKey), 200)

	w := s.do(t, "GET", "/v1/batches/"+id+"/results", aliceKey)
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/x-ndjson" || w.Header().Get("Content-Encoding") != "" {
		t.Fatalf("results: %d %v", w.Code, w.Header())
	}
	plain := w.Body.Bytes()
	got := lines(t, plain)
	wantLines := []apitype.ResultLine{
		{Index: 0, CustomID: strp("a"), State: "completed", Result: json.RawMessage(r0)},
		{Index: 1, State: "failed", Error: &apitype.TaskError{Code: apitype.CodeTimeout, Message: "too slow"}},
		{Index: 2, CustomID: strp("c"), State: "pending"},
		{Index: 3, CustomID: strp("d"), State: "pending"},
		{Index: 4, State: "canceled", Error: &apitype.TaskError{Code: apitype.CodeCanceled}},
	}
	if len(got) != len(wantLines) {
		t.Fatalf("%d lines, want %d:\n%s", len(got), len(wantLines), plain)
	}
	for i, wl := range wantLines {
		g := got[i]
		if g.Index != wl.Index || g.ID != apitype.ItemID(id, i) || fmt.Sprint(g.CustomID != nil) != fmt.Sprint(wl.CustomID != nil) ||
			(g.CustomID != nil && *g.CustomID != *wl.CustomID) || g.State != wl.State || string(g.Result) != string(wl.Result) ||
			(g.Error == nil) != (wl.Error == nil) || (g.Error != nil && (g.Error.Code != wl.Error.Code || wl.Error.Message != "" && g.Error.Message != wl.Error.Message)) {
			t.Errorf("line %d: %+v, want %+v", i, g, wl)
		}
	}

	// ?state= filters.
	f := lines(t, s.do(t, "GET", "/v1/batches/"+id+"/results?state=failed", aliceKey).Body.Bytes())
	if len(f) != 1 || f[0].Index != 1 {
		t.Fatalf("state=failed: %+v", f)
	}
	if f := lines(t, s.do(t, "GET", "/v1/batches/"+id+"/results?state=active", aliceKey).Body.Bytes()); len(f) != 0 {
		t.Fatalf("state=active: %+v", f)
	}
	// ?from= starts at an index, mid chunk or on a chunk's first item,
	// and past the end it lists nothing.
	for from, first := range map[string]int{"0": 0, "1": 1, "2": 2, "3": 3, "4": 4, "5": -1, "9": -1} {
		f := lines(t, s.do(t, "GET", "/v1/batches/"+id+"/results?from="+from, aliceKey).Body.Bytes())
		if first < 0 {
			if len(f) != 0 {
				t.Fatalf("from=%s: %+v, want nothing", from, f)
			}
			continue
		}
		if len(f) != 5-first || f[0].Index != first || f[len(f)-1].Index != 4 {
			t.Fatalf("from=%s: %+v, want items %d to 4", from, f, first)
		}
	}
	if f := lines(t, s.do(t, "GET", "/v1/batches/"+id+"/results?from=2&state=pending", aliceKey).Body.Bytes()); len(f) != 2 || f[0].Index != 2 {
		t.Fatalf("from=2&state=pending: %+v", f)
	}
	for _, bad := range []string{"-1", "x", "01", ""} {
		wantError(t, s.do(t, "GET", "/v1/batches/"+id+"/results?from="+bad, aliceKey), 400, apitype.CodeInvalidRequest, "from")
	}
	wantError(t, s.do(t, "GET", "/v1/batches/"+id+"/results?state=done", aliceKey), 400, apitype.CodeInvalidRequest, "state")
	wantError(t, s.do(t, "GET", "/v1/batches/"+id+"/results?status=failed", aliceKey), 400, apitype.CodeInvalidRequest, "status")
	wantError(t, s.do(t, "GET", "/v1/batches/"+id+"/results?wait=forever", aliceKey), 400, apitype.CodeInvalidRequest, "wait")

	// gzip when the client takes it, the same lines once inflated.
	for _, ae := range []string{"gzip", "br, gzip;q=0.5", "*"} {
		g := s.do(t, "GET", "/v1/batches/"+id+"/results", aliceKey, "Accept-Encoding", ae)
		if g.Code != 200 || g.Header().Get("Content-Encoding") != "gzip" {
			t.Fatalf("Accept-Encoding %q: %d %v", ae, g.Code, g.Header())
		}
		zr, err := gzip.NewReader(g.Body)
		if err != nil {
			t.Fatal(err)
		}
		inflated, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(inflated, plain) {
			t.Fatalf("Accept-Encoding %q: inflated body differs:\n%s\nwant\n%s", ae, inflated, plain)
		}
	}
	for _, ae := range []string{"gzip;q=0", "identity", "br"} {
		if g := s.do(t, "GET", "/v1/batches/"+id+"/results", aliceKey, "Accept-Encoding", ae); g.Header().Get("Content-Encoding") != "" || !bytes.Equal(g.Body.Bytes(), plain) {
			t.Fatalf("Accept-Encoding %q: %v", ae, g.Header())
		}
	}

	// ?wait= holds until the batch is done, then streams it whole.
	ch := s.background(t, "/v1/batches/"+id+"/results?wait=30s")
	s.waiting(t)
	s.run(t, id, 1, completed(2, r0), failed(3, apitype.CodeBudgetExceeded, "out of nodes"))
	done := lines(t, (<-ch).Body.Bytes())
	if len(done) != 5 || done[2].State != "completed" || done[3].State != "failed" {
		t.Fatalf("after the wait: %+v", done)
	}
	if n := s.srv.admit.InUse(); n != 0 {
		t.Fatalf("the pool holds %d bytes after the downloads", n)
	}
}

// TestResultsInPieces: results larger than a piece are read a piece at a
// time and come out whole and in order.
func TestResultsInPieces(t *testing.T) {
	t.Parallel()
	s := newReadStack(t)
	const n, stride = 12, 6
	id := s.stage(t, n, stride, nil)
	results := make([]string, n)
	for j := 0; j < n/stride; j++ {
		var outs []worker.ItemOutcome
		for i := j * stride; i < (j+1)*stride; i++ {
			// 100 KiB each: a piece of 256 KiB holds two.
			results[i] = fmt.Sprintf(`{"moves":%d,"solvable":true,"path":"%s"}`, i, strings.Repeat("U", 100<<10))
			outs = append(outs, completed(i, results[i]))
		}
		s.run(t, id, j, outs...)
	}
	plain := s.do(t, "GET", "/v1/batches/"+id+"/results", aliceKey).Body.Bytes()
	zw := s.do(t, "GET", "/v1/batches/"+id+"/results", aliceKey, "Accept-Encoding", "gzip")
	zr, err := gzip.NewReader(zw.Body)
	if err != nil {
		t.Fatal(err)
	}
	if inflated, err := io.ReadAll(zr); err != nil || !bytes.Equal(inflated, plain) {
		t.Fatalf("gzipped results: %v, %d bytes inflated, want the %d plain ones", err, len(inflated), len(plain))
	}
	got := lines(t, plain)
	if len(got) != n {
		t.Fatalf("%d lines, want %d", len(got), n)
	}
	for i, l := range got {
		if l.Index != i || string(l.Result) != results[i] {
			t.Errorf("line %d: index %d, result of %d bytes, want item %d's %d", i, l.Index, len(l.Result), i, len(results[i]))
		}
	}
	out := s.do(t, "GET", "/v1/batches/"+id+"/output", aliceKey)
	if out.Code != 200 || out.Body.String() != strings.Join(results, "\n")+"\n" {
		t.Fatalf("output: %d, %d bytes", out.Code, out.Body.Len())
	}
	if n := s.srv.admit.InUse(); n != 0 {
		t.Fatalf("the pool holds %d bytes after the downloads", n)
	}
}

// bigBatch stages and completes alice's batch of n items of size bytes
// of result each, stride to a chunk, and returns its ID.
func (s *readStack) bigBatch(t *testing.T, n, stride, size int) string {
	t.Helper()
	id := s.stage(t, n, stride, nil)
	for j := 0; j*stride < n; j++ {
		var outs []worker.ItemOutcome
		for i := j * stride; i < min(n, (j+1)*stride); i++ {
			outs = append(outs, completed(i, fmt.Sprintf(`{"moves":%d,"solvable":true,"path":"%s"}`, i, strings.Repeat("L", size))))
		}
		s.run(t, id, j, outs...)
	}
	return id
}

// smallBuffers serves h over TCP with socket buffers so small that a
// stream of megabytes goes only as fast as its client reads, and returns
// a client whose connections have small buffers too. Not smaller than
// these: below loopback's 64 KiB segment, TCP's silly-window avoidance
// stalls a connection for its 200 ms probe timer.
func smallBuffers(t *testing.T, h http.Handler) (*httptest.Server, *http.Client) {
	t.Helper()
	hs := httptest.NewUnstartedServer(h)
	hs.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if tc, ok := c.(*net.TCPConn); ok && st == http.StateNew {
			_ = tc.SetWriteBuffer(128 << 10)
		}
	}
	hs.Start()
	t.Cleanup(hs.Close)
	d := &net.Dialer{}
	tr := &http.Transport{DisableCompression: true, ReadBufferSize: 4 << 10,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(256 << 10)
			}
			return c, err
		}}
	t.Cleanup(tr.CloseIdleConnections)
	return hs, &http.Client{Transport: tr}
}

// TestSlowDownloadIsNotCut: a download that takes several times
// REQUEST_TIMEOUT, because its client reads slowly but steadily, is not
// cut: the deadline of a stream is on its progress, not its length.
func TestSlowDownloadIsNotCut(t *testing.T) {
	t.Parallel()
	// REQUEST_TIMEOUT bounds each step of the stream: a Redis read of a
	// piece, a write its client drains. A loaded machine (go test -race
	// beside the rest of the suite on 2 cores) has starved one of those,
	// or the client's read between them, past 1 s (7 cuts in 45 runs)
	// and past 3 s (1 in 10), so it is 5 s. The client's pace follows
	// from it: 32 KiB every timeout/56, 4 MiB in 2.3 times the timeout
	// at least, several times the buffers, so the server's writes wait
	// on the reads all along.
	const timeout = 5 * time.Second
	s := newReadStack(t, func(o *Options) { o.RequestTimeout = timeout })
	id := s.bigBatch(t, 16, 4, 256<<10) // 4 MiB of results
	hs, client := smallBuffers(t, s.srv.Handler())
	var wg sync.WaitGroup
	for _, path := range []string{"/results", "/output"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", hs.URL+"/v1/batches/"+id+path, nil)
			req.Header.Set("Authorization", "Bearer "+aliceKey)
			start := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("%s: %v", path, err)
				return
			}
			defer resp.Body.Close()
			var got bytes.Buffer
			buf := make([]byte, 32<<10)
			for {
				n, err := resp.Body.Read(buf)
				got.Write(buf[:n])
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Errorf("%s cut after %d bytes and %s: %v", path, got.Len(), time.Since(start), err)
					return
				}
				time.Sleep(timeout / 56)
			}
			took := time.Since(start)
			if took < 2*timeout {
				// The client was not slow enough for the test to mean
				// anything: the buffers took the whole answer.
				t.Errorf("%s: the download took %s, less than twice REQUEST_TIMEOUT", path, took)
			}
			if n := strings.Count(got.String(), "\n"); resp.StatusCode != 200 || n != 16 {
				t.Errorf("%s: %d with %d lines, want 200 with 16", path, resp.StatusCode, n)
			}
		}()
	}
	wg.Wait()
}

// TestStalledDownloadIsCut: a client that stops reading holds its piece
// of the pool for REQUEST_TIMEOUT, not for ever: then the stream is cut
// and gives its bytes back.
func TestStalledDownloadIsCut(t *testing.T) {
	t.Parallel()
	// The client must get the answer's head before the stalled stream
	// is cut: a loaded machine has taken past 300 ms to, and the cut
	// then came first (the request failed with EOF).
	const timeout = time.Second
	s := newReadStack(t, func(o *Options) { o.RequestTimeout = timeout })
	id := s.bigBatch(t, 16, 4, 256<<10)
	hs, client := smallBuffers(t, s.srv.Handler())
	req, _ := http.NewRequest("GET", hs.URL+"/v1/batches/"+id+"/results", nil)
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if s.srv.admit.InUse() == 0 {
		t.Fatalf("the stream holds nothing of the pool while it writes")
	}
	// Read nothing more, and wait (bounded) for the server to give up.
	for i := 0; s.srv.admit.InUse() != 0; i++ {
		if i == 200 {
			t.Fatalf("the stalled stream still holds %d bytes of the pool after 10s, %v past its REQUEST_TIMEOUT", s.srv.admit.InUse(), 10*time.Second-timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatalf("the stalled stream ended as if complete")
	}
}

// TestFullPoolIsBusy: a download that cannot get room in the pool within
// REQUEST_TIMEOUT, because others hold it, is told to retry (503), not
// hung or cut.
func TestFullPoolIsBusy(t *testing.T) {
	t.Parallel()
	s := newReadStack(t, func(o *Options) { o.RequestTimeout = 200 * time.Millisecond; o.MaxBytesInFlight = 1 << 20 })
	id := s.bigBatch(t, 2, 2, 1<<10)
	other := s.srv.admit.Ticket("") // the oldest holder, which never lets go
	if err := other.Take(context.Background(), 1<<20); err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	for _, path := range []string{"/results", "/output"} {
		w := s.do(t, "GET", "/v1/batches/"+id+path, aliceKey)
		wantError(t, w, 503, apitype.CodeUnavailable, "")
		if w.Header().Get("Retry-After") == "" {
			t.Errorf("%s: 503 without Retry-After", path)
		}
	}
}

func TestOutputPointsToResults(t *testing.T) {
	t.Parallel()
	s := newReadStack(t)
	id := s.stage(t, 3, 2, nil)
	e := wantError(t, s.do(t, "GET", "/v1/batches/"+id+"/output", aliceKey), 409, apitype.CodeIncomplete, "")
	if !strings.Contains(e.Message, "/v1/batches/"+id+"/results") {
		t.Fatalf("not done: %q does not point to /results", e.Message)
	}
	r := `{"moves":0,"solvable":true,"path":""}`
	s.run(t, id, 0, completed(0, r), failed(1, apitype.CodeTimeout, "too slow"))
	s.run(t, id, 1, completed(2, r))
	e = wantError(t, s.do(t, "GET", "/v1/batches/"+id+"/output", aliceKey), 409, apitype.CodeIncomplete, "")
	if !strings.Contains(e.Message, "case 2 did not complete (failed)") || !strings.Contains(e.Message, "/v1/batches/"+id+"/results") {
		t.Fatalf("failed case: %q", e.Message)
	}
}

// TestAcceptsGzip: Accept-Encoding as RFC 9110 reads it.
func TestAcceptsGzip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		h    string
		want bool
	}{
		{"", false}, {"gzip", true}, {"GZIP", true}, {"x-gzip", true}, {"deflate, gzip", true},
		{"gzip;q=0", false}, {"gzip; q=0.0", false}, {"gzip;q=0.001", true}, {"*", true}, {"*;q=0", false},
		{"gzip;q=0, *", false}, {"*, gzip;q=0", false}, {"identity", false}, {"br;q=1, gzip;q=bad", false},
	} {
		if got := acceptsGzip(tc.h); got != tc.want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", tc.h, got, tc.want)
		}
	}
}

// TestReadsOverTheKeyShare: with API keys a page of results ends at a
// quarter of the key's share (MAX_KEY_BYTES_IN_FLIGHT), so that it needs
// half of it; and a read that waits out REQUEST_TIMEOUT for room its own
// key's other requests hold is told so, 429 rate_limited with
// Retry-After, rather than 503 unavailable, which would blame the
// service. Once the key's other request ends the reads go through.
func TestReadsOverTheKeyShare(t *testing.T) {
	t.Parallel()
	// REQUEST_TIMEOUT is also the bound on each step of a read's
	// progress (a Redis read of a page, its JSON), which a loaded
	// machine (go test -race of the whole module on 2 cores) has taken
	// past 300 ms, cutting a read that had room. No figure here is
	// timed: the refused reads wait it out at once, so it costs the test
	// one REQUEST_TIMEOUT, not four.
	const timeout = 2 * time.Second
	s := newReadStack(t, func(o *Options) {
		o.RequestTimeout = timeout
		o.MaxBytesInFlight, o.MaxKeyBytesInFlight = 8<<20, 1<<20
	})
	// Four results of 200 KiB: past the page bound of 256 KiB after one.
	id := s.bigBatch(t, 4, 2, 200<<10)
	b := want[apitype.Batch](t, s.do(t, "GET", "/v1/batches/"+id+"?limit=1000", aliceKey), 200)
	if len(b.Tasks) != 1 || b.NextCursor == nil {
		t.Fatalf("a page of 200 KiB results with a 1 MiB share: %d tasks, next %v; want 1 and a cursor", len(b.Tasks), b.NextCursor)
	}

	// Another of alice's requests (an upload, say) holds her whole share.
	held := s.srv.admit.Ticket("alice")
	if err := held.Take(context.Background(), 1<<20); err != nil {
		t.Fatal(err)
	}
	paths := []string{"/v1/batches/" + id, "/v1/batches/" + id + "/items", "/v1/batches/" + id + "/results", "/v1/batches/" + id + "/output"}
	answers := make([]*httptest.ResponseRecorder, len(paths))
	var wg sync.WaitGroup
	for i, path := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = s.do(t, "GET", path, aliceKey)
		}()
	}
	wg.Wait()
	for i, w := range answers {
		wantError(t, w, http.StatusTooManyRequests, apitype.CodeRateLimited, "")
		if w.Header().Get("Retry-After") == "" {
			t.Errorf("GET %s: 429 without Retry-After", paths[i])
		}
	}
	held.Release()
	for _, path := range []string{"/v1/batches/" + id, "/v1/batches/" + id + "/results"} {
		if w := s.do(t, "GET", path, aliceKey); w.Code != http.StatusOK {
			t.Fatalf("GET %s after the share was given back: %d %.300s", path, w.Code, w.Body)
		}
	}
	if n := s.srv.admit.InUse(); n != 0 {
		t.Fatalf("the pool holds %d bytes after the reads", n)
	}
}
