package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/tasks"
)

// The tests in this file drive the handlers with fakes of the Enqueuer and
// Store interfaces, to reach failures a real Redis rarely shows on cue: the
// queue failing after the records were written, or Redis failing half way
// through a batch. The Store fake wraps the real store on a real
// redis-server, so what compensation leaves behind is read from Redis, not
// from the fake's bookkeeping alone.

var errInjected = errors.New("injected: connection reset by peer")

// fakeQueue is an Enqueuer that accepts the first okCalls enqueues and
// fails the rest; okCalls < 0 accepts all.
type fakeQueue struct {
	mu       sync.Mutex
	okCalls  int
	calls    int
	enqueued []string // task IDs accepted
}

func (q *fakeQueue) EnqueueContext(_ context.Context, t *asynq.Task, _ ...asynq.Option) (*asynq.TaskInfo, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls++
	if q.okCalls >= 0 && q.calls > q.okCalls {
		return nil, errInjected
	}
	q.enqueued = append(q.enqueued, t.Type())
	return &asynq.TaskInfo{Type: t.Type()}, nil
}

func (q *fakeQueue) set(okCalls int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.okCalls, q.calls, q.enqueued = okCalls, 0, nil
}

// faultyStore is the real store with failures injected on cue, and a log
// of the calls that create records and of those that undo them.
type faultyStore struct {
	*store.Store
	// queue, when set, takes the store's feeds one unit at a time
	// (EnqueueFed), so that its failures land mid-feed.
	queue api.Enqueuer

	mu sync.Mutex
	// commitLost makes CommitBatch commit the batch and then report an
	// error, as when the connection drops before the script's reply
	// arrives; with fedBeforeLoss a feeder (a worker finishing a unit)
	// takes one of its units in between.
	commitLost, fedBeforeLoss bool
	submitted                 []string       // task IDs SubmitTask recorded
	batches                   map[string]int // batch ID -> items CommitBatch was given
	abandoned                 map[string]int // batch ID -> what AbandonCommit answered
	deleted                   []string       // the IDs DeleteTasks was called with
	released                  map[string]int // owner -> units ReleasePending gave back
	idemReleased              []string       // Idempotency-Keys released
	// retryCut makes RetryBatch report an error after it re-opened
	// items, as a retry whose Redis failed half way through does.
	retryCut bool
}

// EnqueueFed sends the units through the rig's queue (EnqueueFedThrough),
// so that a queue that fails part way leaves the rest in the feeding set,
// as a bulk enqueue that failed would.
func (f *faultyStore) EnqueueFed(ctx context.Context, queue string, refs []tasks.UnitRef) (int, error) {
	if f.queue == nil {
		return f.Store.EnqueueFed(ctx, queue, refs)
	}
	return api.EnqueueFedThrough(ctx, f.queue, f.Store, queue, refs)
}

func (f *faultyStore) RetryBatch(ctx context.Context, b *store.Batch, quota int, timeout store.RetryTimeout) (int, error) {
	n, err := f.Store.RetryBatch(ctx, b, quota, timeout)
	f.mu.Lock()
	cut := f.retryCut
	f.mu.Unlock()
	if err == nil && cut && n > 0 {
		return n, fmt.Errorf("store: retry batch %s: %w", b.ID, errInjected)
	}
	return n, err
}

func (f *faultyStore) SubmitTask(ctx context.Context, t store.NewTask, quota int) (json.RawMessage, time.Time, error) {
	hit, at, err := f.Store.SubmitTask(ctx, t, quota)
	if err == nil {
		f.mu.Lock()
		f.submitted = append(f.submitted, t.ID)
		f.mu.Unlock()
	}
	return hit, at, err
}

func (f *faultyStore) CommitBatch(ctx context.Context, w *store.BatchWriter, cb store.CommitBatch) error {
	f.mu.Lock()
	f.batches[cb.ID] = w.Total()
	lost, fed := f.commitLost, f.fedBeforeLoss
	f.mu.Unlock()
	if err := f.Store.CommitBatch(ctx, w, cb); err != nil {
		return err
	}
	if fed {
		if refs, err := f.Store.Feed(ctx, tasks.QueueBulk, 64, 1); err != nil || len(refs) != 1 {
			return fmt.Errorf("the injected feed took %v: %v", refs, err)
		}
	}
	if lost {
		return fmt.Errorf("store: commit batch %s: %w", cb.ID, errInjected)
	}
	return nil
}

func (f *faultyStore) AbandonCommit(ctx context.Context, w *store.BatchWriter, cb store.CommitBatch) (int, error) {
	v, err := f.Store.AbandonCommit(ctx, w, cb)
	f.mu.Lock()
	f.abandoned[cb.ID] = v
	f.mu.Unlock()
	return v, err
}

func (f *faultyStore) DeleteTasks(ctx context.Context, ids []string) error {
	f.mu.Lock()
	f.deleted = append(f.deleted, ids...)
	f.mu.Unlock()
	return f.Store.DeleteTasks(ctx, ids)
}

func (f *faultyStore) ReleasePending(ctx context.Context, owner, unit string) error {
	f.mu.Lock()
	f.released[owner]++
	f.mu.Unlock()
	return f.Store.ReleasePending(ctx, owner, unit)
}

func (f *faultyStore) ReleaseIdempotency(ctx context.Context, owner, key, batchID, bodyHash string) error {
	f.mu.Lock()
	f.idemReleased = append(f.idemReleased, key)
	f.mu.Unlock()
	return f.Store.ReleaseIdempotency(ctx, owner, key, batchID, bodyHash)
}

// only returns the one batch CommitBatch was given, and its items.
func (f *faultyStore) only(t *testing.T) (string, int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.batches) != 1 {
		t.Fatalf("CommitBatch was called for %d batches, want 1", len(f.batches))
	}
	for id, n := range f.batches {
		return id, n
	}
	panic("unreachable")
}

// faultRig is the API's handler on a faultyStore and a fakeQueue, with
// one API key, alice.
type faultRig struct {
	t     *testing.T
	h     http.Handler
	st    *faultyStore
	queue *fakeQueue
	rdb   *redis.Client
}

const aliceKey = "a-key"

func newFaultRig(t *testing.T) *faultRig {
	t.Helper()
	r := redistest.Start(t)
	real := store.New(r.Client(t), store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	st := &faultyStore{Store: real, batches: map[string]int{}, abandoned: map[string]int{}, released: map[string]int{}}
	q := &fakeQueue{okCalls: -1}
	st.queue = q
	o := api.OptionsForTest()
	o.MaxBatchItems, o.ChunkSize, o.MaxConcurrentDecodes, o.MaxPendingPerKey = 100, 2, 1, 100
	o.Keys = []api.APIKey{{Name: "alice", Key: aliceKey}}
	srv := api.New(st, store.NewHub(), nil, nil, o)
	return &faultRig{t: t, h: srv.Handler(), st: st, queue: q, rdb: r.Client(t)}
}

// post sends a request as alice and returns the status, the decoded error
// (zero unless 4xx/5xx) and the response.
func (r *faultRig) post(path, body string, hdr ...string) (*httptest.ResponseRecorder, apitype.Error) {
	r.t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+aliceKey)
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

// wantUnavailable asserts the answer a client may retry: 503, code
// unavailable, a message, and Retry-After.
func wantUnavailable(t *testing.T, what string, rec *httptest.ResponseRecorder, e apitype.Error) {
	t.Helper()
	if rec.Code != http.StatusServiceUnavailable || e.Code != "unavailable" || e.Message == "" || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("%s: %d %+v Retry-After %q, want 503 unavailable with Retry-After", what, rec.Code, e, rec.Header().Get("Retry-After"))
	}
}

// gone asserts that none of ids has a record, and neither has the batch.
func (r *faultRig) gone(batchID string, ids []string) {
	r.t.Helper()
	ctx := context.Background()
	for _, id := range ids {
		if _, err := r.st.Store.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
			r.t.Errorf("task %s still has a record (err %v)", id, err)
		}
	}
	if batchID != "" {
		if _, err := r.st.Store.GetBatch(ctx, batchID); !errors.Is(err, store.ErrNotFound) {
			r.t.Errorf("batch %s still has a record (err %v)", batchID, err)
		}
	}
}

func (r *faultRig) pending() int {
	r.t.Helper()
	n, err := r.st.Store.Pending(context.Background(), "alice")
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

// batchOf returns a JSON batch of n distinct sliding puzzles (cheap:
// chunked two per task) and one sweep.
func batchOf(n int) string {
	items := make([]string, 0, n+1)
	boards := []string{"[[1,0,3],[4,2,5],[7,8,6]]", "[[4,1,2],[5,0,3],[7,8,6]]", "[[1,2,3],[4,5,6],[7,0,8]]",
		"[[1,2,3],[4,0,6],[7,5,8]]", "[[1,2,3],[0,4,6],[7,5,8]]", "[[0,1,3],[4,2,5],[7,8,6]]", "[[1,3,0],[4,2,5],[7,8,6]]"}
	for i := range n {
		items = append(items, `{"kind":"sliding","puzzle":{"board":`+boards[i%len(boards)]+`},"options":{"max_nodes":`+fmt.Sprint(1000+i)+`}}`)
	}
	items = append(items, `{"kind":"sweep","puzzle":{"board":["...","..."]}}`)
	return `{"tasks":[` + strings.Join(items, ",") + `]}`
}

// A single task is recorded, counted against the owner's quota and put
// on asynq's queue by one script, so no failure can leave a record
// without its queued task (or the reverse), and there is nothing to undo:
// the API never calls the enqueuer for it.
func TestCreateTaskRecordsAndQueuesTogether(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	r.queue.set(0) // an enqueue would fail
	rec, _ := r.post("/v1/tasks", sample8)
	if rec.Code != http.StatusAccepted || r.queue.calls != 0 || len(r.st.deleted) != 0 {
		t.Fatalf("%d %s; %d enqueues, %v deleted; want 202 from the submit script alone", rec.Code, rec.Body.Bytes(), r.queue.calls, r.st.deleted)
	}
	var tr apitype.Task
	if err := json.Unmarshal(rec.Body.Bytes(), &tr); err != nil {
		t.Fatal(err)
	}
	info, err := asynq.NewInspectorFromRedisClient(r.rdb).GetTaskInfo(tasks.QueueCheap, tr.ID)
	if err != nil || info.State != asynq.TaskStatePending || info.Type != tasks.TypeSliding || info.MaxRetry != 10 {
		t.Fatalf("queued task %+v, %v", info, err)
	}
	if r.pending() != 1 {
		t.Fatalf("pending %d, want 1", r.pending())
	}
}

// A batch whose feeding fails half way was committed, every unit in the
// feed, before the first enqueue: it is accepted (202), nothing is undone,
// its quota stays counted and its Idempotency-Key stays its own. The
// units the queue refused stay in the feeding set, where the reconciler
// finds them (StaleFed), and the client's retry with the same key replays
// the batch.
func TestCreateBatchFeedFailsHalfWay(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	body := batchOf(7) // 4 chunk units and 1 sweep unit
	r.queue.set(2)
	rec, _ := r.post("/v1/batches", body, "Idempotency-Key", "run-1")
	if rec.Code != http.StatusAccepted {
		t.Fatalf("feeding failed half way after the batch was committed: %d %s, want 202", rec.Code, rec.Body.Bytes())
	}
	batchID, n := r.st.only(t)
	if n != 8 || len(r.queue.enqueued) != 2 || r.queue.calls != 5 {
		t.Fatalf("%d items committed, %d units enqueued in %d calls; want 8 items, 2 of 5 units enqueued", n, len(r.queue.enqueued), r.queue.calls)
	}
	if len(r.st.abandoned) != 0 || len(r.st.idemReleased) != 0 {
		t.Errorf("an accepted batch was undone: abandoned %v, keys released %v", r.st.abandoned, r.st.idemReleased)
	}
	if r.pending() != 8 {
		t.Errorf("quota: pending %d, want the batch's 8", r.pending())
	}
	stale, err := r.st.Store.StaleFed(context.Background(), time.Now().Add(time.Hour), 10)
	if err != nil || len(stale) != 3 {
		t.Errorf("the feeding set holds %v (%v), want the 3 units the queue refused", stale, err)
	}
	for _, u := range stale {
		if u.BatchID != batchID {
			t.Errorf("unit %+v is not of batch %s", u, batchID)
		}
	}

	r.queue.set(-1)
	rec, _ = r.post("/v1/batches", body, "Idempotency-Key", "run-1")
	var ack apitype.BatchCreated
	if rec.Code != http.StatusAccepted || json.Unmarshal(rec.Body.Bytes(), &ack) != nil || ack.ID != batchID ||
		rec.Header().Get("Idempotent-Replayed") != "true" || len(ack.TaskIDs) != 8 || ack.TaskIDs[7] != apitype.ItemID(batchID, 7) {
		t.Fatalf("retry with the same key: %d %s %v, want a replay of %s", rec.Code, rec.Body.Bytes(), rec.Header(), batchID)
	}
}

// Redis may run the commit script and drop the connection before the
// reply: the API sees an error for a batch that exists. No unit was fed,
// so the API undoes it (AbandonCommit): a request that failed leaves
// nothing behind (read by SCAN), and the client is told to retry.
func TestCreateBatchCommitReplyLost(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	r.st.commitLost = true
	rec, e := r.post("/v1/batches", batchOf(3), "Idempotency-Key", "run-2")
	wantUnavailable(t, "commit reply lost", rec, e)
	batchID, _ := r.st.only(t)
	if r.queue.calls != 0 {
		t.Errorf("%d enqueues after the commit failed", r.queue.calls)
	}
	if v, ok := r.st.abandoned[batchID]; !ok || v != store.BatchAbandoned {
		t.Errorf("AbandonCommit answered %v (called: %v), want BatchAbandoned", v, ok)
	}
	r.gone(batchID, nil)
	if r.pending() != 0 {
		t.Errorf("quota: pending %d, want 0", r.pending())
	}
	if len(r.st.idemReleased) != 1 {
		t.Errorf("Idempotency-Keys released: %v, want [run-2]", r.st.idemReleased)
	}
	var left []string
	iter := r.rdb.Scan(context.Background(), 0, "pq:*", 100).Iterator()
	for iter.Next(context.Background()) {
		// The owner's virtual time in the feed may have moved: that
		// only places its next batch a few units later, and expires.
		// The quota's counter stays, at 0 (checked above).
		if k := iter.Val(); k != "pq:owner:alice:vt" && k != "pq:owner:alice:pending" {
			left = append(left, k)
		}
	}
	if len(left) != 0 {
		t.Errorf("an undone batch left keys: %v", left)
	}
}

// When the reply is lost but a feeder already took a unit of the batch,
// the batch cannot be undone: it runs, so it is accepted.
func TestCreateBatchCommitReplyLostAfterFeed(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	r.st.commitLost, r.st.fedBeforeLoss = true, true
	rec, _ := r.post("/v1/batches", batchOf(3), "Idempotency-Key", "run-3")
	batchID, _ := r.st.only(t)
	if rec.Code != http.StatusAccepted || r.st.abandoned[batchID] != store.BatchKept {
		t.Fatalf("lost reply after a feed: %d %s, abandon %v; want 202 and BatchKept", rec.Code, rec.Body.Bytes(), r.st.abandoned[batchID])
	}
	if b, err := r.st.Store.GetBatch(context.Background(), batchID); err != nil || b.Total != 4 {
		t.Errorf("the kept batch: %+v %v", b, err)
	}
	if len(r.st.idemReleased) != 0 || r.pending() != 4 {
		t.Errorf("keys released %v, pending %d; want none released and 4 pending", r.st.idemReleased, r.pending())
	}
}

// New takes its limits from the binary's Config and adds no defaults of
// its own; a missing one is named, not silently replaced.
func TestNewNamesAMissingLimit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		unset func(*api.Options)
	}{
		{"MaxWait", func(o *api.Options) { o.MaxWait = 0 }},
		{"MaxBytesInFlight", func(o *api.Options) { o.MaxBytesInFlight = 0 }},
		{"MaxConcurrentDecodes", func(o *api.Options) { o.MaxConcurrentDecodes = 0 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := api.OptionsForTest()
			c.unset(&o)
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "Options."+c.name) {
					t.Fatalf("New without %s: recovered %v, want a panic naming Options.%s", c.name, r, c.name)
				}
			}()
			api.New(nil, store.NewHub(), nil, nil, o)
		})
	}
	// The helper itself has every limit, or the cases above prove nothing.
	api.New(nil, store.NewHub(), nil, nil, api.OptionsForTest())
}

// A retry that Redis cut short after it had re-opened items answers 200
// with complete false and Retry-After, not a 503 that hides the items
// now running; the next retry finds nothing left and says complete.
func TestRetryBatchCutShort(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	rec, _ := r.post("/v1/batches", batchOf(3))
	var ack apitype.BatchCreated
	if rec.Code != http.StatusAccepted || json.Unmarshal(rec.Body.Bytes(), &ack) != nil {
		t.Fatalf("submit: %d %s", rec.Code, rec.Body.Bytes())
	}
	del := httptest.NewRequest(http.MethodDelete, "/v1/batches/"+ack.ID, nil)
	del.Header.Set("Authorization", "Bearer "+aliceKey)
	drec := httptest.NewRecorder()
	r.h.ServeHTTP(drec, del)
	if drec.Code != http.StatusOK {
		t.Fatalf("cancel: %d %s", drec.Code, drec.Body.Bytes())
	}

	r.st.mu.Lock()
	r.st.retryCut = true
	r.st.mu.Unlock()
	for _, want := range []struct {
		retried  int
		complete bool
		after    string
	}{{4, false, "1"}, {0, true, ""}} {
		rec, _ := r.post("/v1/batches/"+ack.ID+"/retry", "")
		var got apitype.BatchRetried
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &got) != nil {
			t.Fatalf("retry: %d %s, want 200", rec.Code, rec.Body.Bytes())
		}
		if got.Retried != want.retried || got.Complete != want.complete || rec.Header().Get("Retry-After") != want.after {
			t.Fatalf("retry: %+v with Retry-After %q, want retried %d, complete %v, Retry-After %q",
				got, rec.Header().Get("Retry-After"), want.retried, want.complete, want.after)
		}
	}
	if r.pending() != 4 {
		t.Errorf("quota: pending %d, want the 4 re-opened items", r.pending())
	}
}
