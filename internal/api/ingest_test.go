package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/tasks"
)

// The tests in this file drive POST /v1/batches on a real store, a real
// asynq client and a real redis-server, and read what a request left in
// Redis by SCAN, not by the handler's word.

// ingestRig is the API on a real store and queue, with one API key.
type ingestRig struct {
	t   *testing.T
	h   http.Handler
	rdb *redis.Client
	st  *store.Store
}

// ingestOptions are the rig's limits: chunks of 2 items, so that small
// batches already write several chunks before a late error.
func ingestOptions() api.Options {
	o := api.OptionsForTest()
	o.MaxBatchItems, o.ChunkSize, o.FeedDepth, o.MaxPendingPerKey = 20, 2, 3, 100
	o.Keys = []api.APIKey{{Name: "alice", Key: aliceKey}}
	return o
}

func newIngestRig(t *testing.T, opts api.Options) *ingestRig {
	t.Helper()
	r := redistest.Start(t)
	rdb := r.Client(t)
	st := store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	return &ingestRig{t: t, h: api.New(st, store.NewHub(), nil, nil, opts).Handler(), rdb: rdb, st: st}
}

// post sends a batch as alice with the given Content-Type.
func (r *ingestRig) post(path, contentType, body string, hdr ...string) (*httptest.ResponseRecorder, apitype.Error) {
	r.t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	r.h.ServeHTTP(rec, req)
	var e apitype.ErrorBody
	if rec.Code >= 400 {
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
			r.t.Fatalf("POST %s: %d with a body that is not an error object: %q", path, rec.Code, rec.Body.Bytes())
		}
	}
	return rec, e.Error
}

// keys returns puzzleq's keys in Redis (SCAN pq:*), sorted.
func (r *ingestRig) keys() []string {
	r.t.Helper()
	var out []string
	iter := r.rdb.Scan(context.Background(), 0, "pq:*", 100).Iterator()
	for iter.Next(context.Background()) {
		out = append(out, iter.Val())
	}
	if err := iter.Err(); err != nil {
		r.t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// nothingLeft asserts that a failed request left no key of puzzleq's.
func (r *ingestRig) nothingLeft(what string) {
	r.t.Helper()
	if k := r.keys(); len(k) != 0 {
		r.t.Errorf("%s left keys behind: %v", what, k)
	}
}

// accepted decodes a 202 and checks what every 202 of a batch holds.
func (r *ingestRig) accepted(what string, rec *httptest.ResponseRecorder, total int) apitype.BatchCreated {
	r.t.Helper()
	var ack apitype.BatchCreated
	if rec.Code != http.StatusAccepted || json.Unmarshal(rec.Body.Bytes(), &ack) != nil {
		r.t.Fatalf("%s: %d %s, want 202", what, rec.Code, rec.Body.Bytes())
	}
	if ack.Total != total || !apitype.IsID(ack.ID) || rec.Header().Get("Location") != "/v1/batches/"+ack.ID {
		r.t.Fatalf("%s: %+v Location %q, want %d items", what, ack, rec.Header().Get("Location"), total)
	}
	if total <= apitype.MaxListedIDs {
		if len(ack.TaskIDs) != total {
			r.t.Fatalf("%s: %d task_ids for %d items", what, len(ack.TaskIDs), total)
		}
		for i, id := range ack.TaskIDs {
			if id != apitype.ItemID(ack.ID, i) {
				r.t.Fatalf("%s: task_ids[%d] = %q, want %q", what, i, id, apitype.ItemID(ack.ID, i))
			}
		}
	} else if ack.TaskIDs != nil {
		r.t.Fatalf("%s: %d items listed %d task_ids, want null", what, total, len(ack.TaskIDs))
	}
	b, err := r.st.GetBatch(context.Background(), ack.ID)
	if err != nil || b.Total != total || b.Owner != "alice" {
		r.t.Fatalf("%s: the batch record %+v (%v)", what, b, err)
	}
	return ack
}

const (
	ndjson = "application/x-ndjson"
	// sweepItem is expensive: each runs in its own unit.
	sweepItem = `{"kind":"sweep","puzzle":{"board":["...","..."]}}`
)

// slidingItem is a cheap item (chunked), with custom_id id unless "".
func slidingItem(id string, n int) string {
	cid := ""
	if id != "" {
		cid = `"custom_id":"` + id + `",`
	}
	return `{` + cid + `"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"max_nodes":` + fmt.Sprint(1000+n) + `}}`
}

// lines makes an NDJSON body of n cheap items named "item-<i>", and a
// sweep at every index in sweeps.
func lines(n int, sweeps ...int) string { return linesNamed("item-", n, sweeps...) }

// linesNamed is lines with the custom_ids prefix<i>.
func linesNamed(prefix string, n int, sweeps ...int) string {
	var b strings.Builder
	for i := range n {
		if slices.Contains(sweeps, i) {
			b.WriteString(sweepItem)
		} else {
			b.WriteString(slidingItem(fmt.Sprintf("%s%d", prefix, i), i))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// An NDJSON batch is accepted with derived item IDs; its custom_ids are
// stored with the items; every unit is in the feed, and the bulk queue
// holds FEED_DEPTH of them, no more.
func TestNDJSONBatchAccepted(t *testing.T) {
	t.Parallel()
	r := newIngestRig(t, ingestOptions())
	// 9 items, chunks of 2: 5 chunk units (items 0..8 less two sweeps)
	// and 2 own units.
	body := lines(9, 3, 6) + "\n\n" // blank lines are skipped
	rec, _ := r.post("/v1/batches", ndjson+"; charset=utf-8", body)
	ack := r.accepted("NDJSON", rec, 9)
	ctx := context.Background()
	for _, i := range []int{0, 5, 8} {
		it, err := r.st.GetItem(ctx, ack.ID, i)
		if err != nil || deref(it.CustomID) != fmt.Sprintf("item-%d", i) {
			t.Errorf("item %d: %+v %v, want custom_id item-%d", i, it, err, i)
		}
	}
	if it, err := r.st.GetItem(ctx, ack.ID, 3); err != nil || it.CustomID != nil || it.Kind != "sweep" {
		t.Errorf("item 3: %+v %v, want a sweep without custom_id", it, err)
	}
	// The 5 chunk units go to the cheap lane, the 2 own units to the
	// solvers' lane, each lane's queue filled up to FEED_DEPTH.
	for _, lane := range []struct {
		queue, feed     string
		queued, waiting int64
	}{{tasks.QueueCheapBulk, "pq:feed:cheap", 3, 2}, {tasks.QueueBulk, "pq:feed", 2, 0}} {
		queued, err := r.rdb.LLen(ctx, asynqdata.PendingKey(lane.queue)).Result()
		if err != nil {
			t.Fatal(err)
		}
		waiting, err := r.rdb.ZCard(ctx, lane.feed).Result()
		if err != nil {
			t.Fatal(err)
		}
		if queued != lane.queued || waiting != lane.waiting {
			t.Errorf("%s queue holds %d units, its feed %d; want %d queued and %d waiting", lane.queue, queued, waiting, lane.queued, lane.waiting)
		}
	}
	if feeding, _ := r.rdb.ZCard(ctx, "pq:feeding").Result(); feeding != 0 {
		t.Errorf("%d units fed and not acknowledged", feeding)
	}
	if n, _ := r.st.Pending(ctx, "alice"); n != 9 {
		t.Errorf("quota: %d pending, want 9", n)
	}
}

// The JSON form streams too, and its items may carry custom_id.
func TestJSONBatchWithCustomIDs(t *testing.T) {
	t.Parallel()
	r := newIngestRig(t, ingestOptions())
	rec, _ := r.post("/v1/batches", "application/json",
		`{"tasks":[`+slidingItem("a", 0)+`,`+sweepItem+`,`+slidingItem("c", 2)+`]}`)
	ack := r.accepted("JSON", rec, 3)
	if it, err := r.st.GetItem(context.Background(), ack.ID, 2); err != nil || deref(it.CustomID) != "c" {
		t.Errorf("item 2: %+v %v, want custom_id c", it, err)
	}
}

// A judge-format body is read whole and staged like the others, with its
// format stored for the output.
func TestJudgeBatchStillWorks(t *testing.T) {
	t.Parallel()
	r := newIngestRig(t, ingestOptions())
	rec, _ := r.post("/v1/batches?format=boj9944", "text/plain", "2 2\n..\n.*\n1 3\n...\n")
	ack := r.accepted("boj9944", rec, 2)
	if b, err := r.st.GetBatch(context.Background(), ack.ID); err != nil || b.Format != "boj9944" {
		t.Errorf("format: %+v %v", b, err)
	}
}

// One bad item rejects the batch naming it, whatever has been staged
// before it, and nothing is left in Redis: no record, no staged chunk, no
// claim, no quota.
func TestBadItemLeavesNothing(t *testing.T) {
	t.Parallel()
	r := newIngestRig(t, ingestOptions())
	bad := `{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,"x"]]}}`
	for _, tc := range []struct {
		name, ct, body, code, field, msg string
		status                           int
	}{
		{"NDJSON line 8", ndjson, lines(6) + "\n" + bad + "\n" + lines(2), "invalid_request", "puzzle.board[2][2]", "line 8: puzzle.board[2][2]: ", 400},
		{"NDJSON not JSON", ndjson, lines(5) + "{\n", "invalid_request", "", "line 6: ", 400},
		{"NDJSON unknown field", ndjson, lines(5) + `{"kind":"sweep","puzzle":{"board":["."]},"priority":1}` + "\n", "invalid_request", "priority", "line 6: unknown field", 400},
		{"NDJSON empty", ndjson, "\n\n", "invalid_request", "", "at least one item", 400},
		{"NDJSON too many", ndjson, lines(21), "too_large", "", "line 21: ", 400},
		{"JSON item 7", "application/json", `{"tasks":[` + strings.Repeat(slidingItem("", 0)+",", 7) + bad + `]}`, "invalid_request", "tasks[7].puzzle.board[2][2]", "tasks[7].puzzle.board[2][2]: ", 400},
		{"JSON too many", "", `{"tasks":[` + strings.Repeat(slidingItem("", 0)+",", 20) + slidingItem("", 0) + `]}`, "too_large", "tasks", "at most 20", 400},
		{"JSON trailing member", "", `{"tasks":[` + strings.Repeat(slidingItem("", 0)+",", 5) + slidingItem("", 0) + `],"x":1}`, "invalid_request", "x", "unknown field", 400},
		{"body too large", ndjson, strings.Repeat(lines(1), 1<<20/len(lines(1))+1), "body_too_large", "", "larger than", 413},
		{"NDJSON with a judge format", ndjson, lines(1), "invalid_request", "format", "format=", 400},
	} {
		path := "/v1/batches"
		if tc.name == "NDJSON with a judge format" {
			path += "?format=boj1525"
		}
		rec, e := r.post(path, tc.ct, tc.body, "Idempotency-Key", "k-"+strings.ReplaceAll(tc.name, " ", "-"))
		if rec.Code != tc.status || e.Code != tc.code || e.Field != tc.field || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%s: %d %+v, want %d %s on %q with %q in the message", tc.name, rec.Code, e, tc.status, tc.code, tc.field, tc.msg)
		}
		if tc.status == 400 && tc.msg != "" && strings.HasPrefix(tc.msg, "line ") && !strings.HasPrefix(e.Message, tc.msg) {
			t.Errorf("%s: message %q does not start with %q", tc.name, e.Message, tc.msg)
		}
		r.nothingLeft(tc.name)
	}
}

// A custom_id used twice is a 400 naming both items, also when the first
// one's chunk was written to Redis long before (its ID is read back).
func TestDuplicateCustomID(t *testing.T) {
	t.Parallel()
	r := newIngestRig(t, ingestOptions())
	body := lines(2) + slidingItem("twice", 2) + "\n" + linesNamed("more-", 6) + slidingItem("twice", 9) + "\n"
	rec, e := r.post("/v1/batches", ndjson, body)
	if rec.Code != 400 || e.Field != "custom_id" || e.Message != `line 10: custom_id: "twice" is already the custom_id of line 3` {
		t.Errorf("NDJSON: %d %+v", rec.Code, e)
	}
	r.nothingLeft("NDJSON duplicate")

	rec, e = r.post("/v1/batches", "", `{"tasks":[`+slidingItem("a", 0)+`,`+slidingItem("b", 1)+`,`+slidingItem("c", 2)+`,`+slidingItem("b", 3)+`]}`)
	if rec.Code != 400 || e.Field != "tasks[3].custom_id" || e.Message != `tasks[3].custom_id: "b" is already the custom_id of tasks[1]` {
		t.Errorf("JSON: %d %+v", rec.Code, e)
	}
	r.nothingLeft("JSON duplicate")

	// Distinct IDs that differ only in case are distinct.
	rec, _ = r.post("/v1/batches", ndjson, slidingItem("x", 0)+"\n"+slidingItem("X", 1)+"\n")
	r.accepted("case-distinct custom_ids", rec, 2)
}

// A retry with the same key and body replays the batch (same 202, marked),
// and queues nothing more; the same key with another body is a 422.
func TestIdempotentReplay(t *testing.T) {
	t.Parallel()
	r := newIngestRig(t, ingestOptions())
	body := lines(5, 1)
	rec, _ := r.post("/v1/batches", ndjson, body, "Idempotency-Key", "run-1")
	first := r.accepted("first", rec, 5)
	before := r.keys()

	rec, _ = r.post("/v1/batches", ndjson, body, "Idempotency-Key", "run-1")
	again := r.accepted("replay", rec, 5)
	if again.ID != first.ID || rec.Header().Get("Idempotent-Replayed") != "true" || !slices.Equal(again.TaskIDs, first.TaskIDs) {
		t.Fatalf("replay: %+v %v, want %s replayed", again, rec.Header(), first.ID)
	}
	if after := r.keys(); !slices.Equal(before, after) {
		t.Errorf("a replay changed the keys: %v, then %v", before, after)
	}
	if n, _ := r.st.Pending(context.Background(), "alice"); n != 5 {
		t.Errorf("quota after a replay: %d, want 5", n)
	}

	rec, e := r.post("/v1/batches", ndjson, lines(4), "Idempotency-Key", "run-1")
	if rec.Code != http.StatusUnprocessableEntity || e.Code != "idempotency_key_reused" {
		t.Errorf("other body: %d %+v", rec.Code, e)
	}
	// The same bytes as JSON are another request.
	rec, e = r.post("/v1/batches", "", `{"tasks":[`+sweepItem+`]}`, "Idempotency-Key", "run-2")
	r.accepted("json", rec, 1)
	rec, e = r.post("/v1/batches", ndjson, `{"tasks":[`+sweepItem+`]}`, "Idempotency-Key", "run-2")
	if rec.Code != http.StatusUnprocessableEntity && rec.Code != 400 {
		t.Errorf("the same bytes as NDJSON: %d %+v, want a refusal", rec.Code, e)
	}
}

// A batch over the owner's quota is refused at the commit, after it was
// staged; nothing is left, and the key is free for a retry.
func TestQuotaExceededLeavesNothing(t *testing.T) {
	t.Parallel()
	opts := ingestOptions()
	opts.MaxPendingPerKey = 6
	r := newIngestRig(t, opts)
	rec, e := r.post("/v1/batches", ndjson, lines(7), "Idempotency-Key", "q")
	if rec.Code != http.StatusTooManyRequests || e.Code != "quota_exceeded" {
		t.Fatalf("over quota: %d %+v", rec.Code, e)
	}
	r.nothingLeft("over quota")
	rec, _ = r.post("/v1/batches", ndjson, lines(6), "Idempotency-Key", "q")
	r.accepted("within quota, same key", rec, 6)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// An NDJSON upload that stalls after a few chunks were staged is cut off
// at its body deadline with a 408, and what it staged is deleted.
func TestSlowNDJSONUploadIsCutOff(t *testing.T) {
	t.Parallel()
	opts := ingestOptions()
	opts.BodyReadTimeout = time.Second
	r := newIngestRig(t, opts)
	srv := httptest.NewServer(r.h)
	defer srv.Close()
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() {
		pw.Write([]byte(lines(7))) // three chunks staged, then silence
	}()
	code, raw, took := streamBatch(t, srv.URL, pr)
	var e apitype.ErrorBody
	if err := json.Unmarshal(raw, &e); err != nil || code != http.StatusRequestTimeout || e.Error.Code != apitype.CodeRequestTimeout {
		t.Fatalf("stalled upload: %d %s, want 408", code, raw)
	}
	if took > 5*time.Second {
		t.Errorf("cut off after %s, want about 1s", took)
	}
	r.nothingLeft("stalled upload")
}

// A body that keeps arriving at BODY_MIN_RATE or faster is read whole,
// however long past BODY_READ_TIMEOUT it takes: the deadline is on
// progress, not on the whole body (a 1,000,000-item batch over a 10
// Mbit/s link takes a minute). One that stops is cut BODY_READ_TIMEOUT
// after the time its bytes bought, and leaves nothing behind.
func TestSteadySlowUploadIsRead(t *testing.T) {
	t.Parallel()
	opts := ingestOptions()
	opts.BodyReadTimeout, opts.BodyMinRate, opts.MaxBatchItems, opts.MaxPendingPerKey = time.Second, 4<<10, 200, 400
	// A single task's body limit and the request's own deadline small
	// beside the upload's 2.5 s: only the batch's limit at the rate may
	// give its request the time.
	opts.MaxBodyBytes, opts.RequestTimeout = 1<<10, time.Second
	r := newIngestRig(t, opts)
	srv := httptest.NewServer(r.h)
	defer srv.Close()
	body := lines(200)
	piece := (len(body) + 9) / 10
	if rate := float64(piece) / 0.25; rate < 1.5*float64(opts.BodyMinRate) {
		t.Fatalf("the pieces arrive at %.0f B/s, too close to BODY_MIN_RATE %d B/s for this test", rate, opts.BodyMinRate)
	}
	for _, stall := range []bool{false, true} {
		pr, pw := io.Pipe()
		go func() {
			// Ten pieces a quarter of a second apart, 2.5 s in all, well
			// past the 1 s grace; with stall, the last piece never comes.
			for i := 0; i < len(body); i += piece {
				if stall && i+piece >= len(body) {
					return // the writer stays open: a stalled upload
				}
				if _, err := pw.Write([]byte(body[i:min(i+piece, len(body))])); err != nil {
					return
				}
				time.Sleep(250 * time.Millisecond)
			}
			pw.Close()
		}()
		code, raw, took := streamBatch(t, srv.URL, pr)
		pw.Close()
		if !stall {
			if code != http.StatusAccepted {
				t.Fatalf("steady upload of %d bytes over %s: %d %s, want 202", len(body), took, code, raw)
			}
			if took < 2*opts.BodyReadTimeout {
				t.Fatalf("the upload took %s: not long enough past the %s grace to test the rate", took, opts.BodyReadTimeout)
			}
			continue
		}
		var e apitype.ErrorBody
		if json.Unmarshal(raw, &e) != nil || code != http.StatusRequestTimeout || e.Error.Code != apitype.CodeRequestTimeout {
			t.Fatalf("stalled upload: %d %s, want 408", code, raw)
		}
		// Cut a grace after the time the 9 pieces bought at the rate, not
		// a grace after the start.
		bought := opts.BodyReadTimeout + time.Duration(float64(9*piece)/float64(opts.BodyMinRate)*float64(time.Second))
		if took < bought-100*time.Millisecond || took > bought+3*time.Second {
			t.Errorf("stalled upload cut after %s, want about %s", took, bought)
		}
	}
	// The steady batch stands; the stalled one left nothing.
	if n := len(r.keys()); n == 0 {
		t.Error("the steady batch left no keys")
	}
}

// When staging fails while the body still arrives (here Redis refuses
// writes), the handler cuts the body off itself: the answer is the
// store's failure (503, retry later), not a 408 as if the client had been
// too slow, and it comes at once, not at the body's deadline.
func TestStagingFailureMidBodyIsNotATimeout(t *testing.T) {
	t.Parallel()
	opts := ingestOptions()
	opts.BodyReadTimeout, opts.MaxBatchItems, opts.MaxPendingPerKey = 20*time.Second, 200, 400
	r := newIngestRig(t, opts)
	srv := httptest.NewServer(r.h)
	defer srv.Close()
	pr, pw := io.Pipe()
	defer pw.Close()
	body := lines(200)
	go func() {
		pw.Write([]byte(body[:len(body)/4]))
		time.Sleep(300 * time.Millisecond)
		// Redis refuses every write from now on: the next chunks cannot
		// be staged.
		r.rdb.ConfigSet(context.Background(), "maxmemory", "1")
		pw.Write([]byte(body[len(body)/4 : len(body)/2]))
		// Then the client has nothing more for a while: the handler
		// must not wait for it.
	}()
	defer r.rdb.ConfigSet(context.Background(), "maxmemory", "0")
	code, raw, took := streamBatch(t, srv.URL, pr)
	var e apitype.ErrorBody
	if json.Unmarshal(raw, &e) != nil || code != http.StatusServiceUnavailable || e.Error.Code != apitype.CodeUnavailable {
		t.Fatalf("staging failed mid-body: %d %s, want 503 unavailable", code, raw)
	}
	if took > opts.BodyReadTimeout/2 {
		t.Errorf("answered after %s: the handler waited for the body's deadline (%s)", took, opts.BodyReadTimeout)
	}
}

// streamBatch posts body as alice's NDJSON batch to the server at url, as
// it comes (no Content-Length), and returns the answer's status and body
// and how long it took.
func streamBatch(t *testing.T, url string, body io.Reader) (int, []byte, time.Duration) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/batches", body)
	req.Header.Set("Content-Type", ndjson)
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, time.Since(start)
}

// A body over MAX_BATCH_BODY_BYTES without a Content-Length is cut off
// while it streams, in the middle of an item or between two, with a 413;
// what was staged is deleted.
func TestBodyTooLargeWhileStreaming(t *testing.T) {
	t.Parallel()
	opts := ingestOptions()
	opts.MaxBatchItems = 1 << 20
	r := newIngestRig(t, opts)
	item := `{"kind":"sweep","puzzle":{"board":["` + strings.Repeat(".", 29) + `"]}}`
	for _, tc := range []struct{ name, ct, body string }{
		{"JSON", "application/json", `{"tasks":[` + strings.Repeat(item+",", 1<<20/len(item)) + item + `]}`},
		{"NDJSON", ndjson, strings.Repeat(item+"\n", 1<<20/len(item)+1)},
	} {
		req := httptest.NewRequest(http.MethodPost, "/v1/batches", struct{ io.Reader }{strings.NewReader(tc.body)})
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		req.Header.Set("Content-Type", tc.ct)
		rec := httptest.NewRecorder()
		r.h.ServeHTTP(rec, req)
		var e apitype.ErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != http.StatusRequestEntityTooLarge || e.Error.Code != "body_too_large" {
			t.Errorf("%s: %d %s, want 413 body_too_large", tc.name, rec.Code, rec.Body.Bytes())
		}
		r.nothingLeft(tc.name)
	}
}

// A body that breaks mid-upload (here a malformed chunk) is the client's
// fault, 400 invalid_request, with an Idempotency-Key as without one: the
// body read for the key's hash is the same marked reader, so its failure
// is not taken for the store's (503).
func TestBodyErrorMidUploadWithIdempotencyKey(t *testing.T) {
	t.Parallel()
	r := newIngestRig(t, ingestOptions())
	srv := httptest.NewServer(r.h)
	defer srv.Close()
	for _, key := range []string{"", "mid-upload-broken"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		first := lines(3)
		head := "POST /v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + aliceKey +
			"\r\nContent-Type: " + ndjson + "\r\nTransfer-Encoding: chunked\r\n"
		if key != "" {
			head += "Idempotency-Key: " + key + "\r\n"
		}
		fmt.Fprintf(conn, "%s\r\n%x\r\n%s\r\nzz\r\n", head, len(first), first)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		conn.Close()
		var e apitype.ErrorBody
		if json.Unmarshal(raw, &e) != nil || resp.StatusCode != http.StatusBadRequest || e.Error.Code != apitype.CodeInvalidRequest {
			t.Errorf("Idempotency-Key %q, a malformed chunk mid-body: %d %s, want 400 invalid_request", key, resp.StatusCode, raw)
		}
	}
}
