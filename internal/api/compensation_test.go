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

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
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

	mu sync.Mutex
	// createBatchLost makes CreateBatch write the batch and then report
	// an error, as when the connection drops before EXEC's reply arrives.
	createBatchLost bool
	submitted       []string            // task IDs SubmitTask recorded
	batches         map[string][]string // batch ID -> item IDs CreateBatch was given
	deleted         map[string][]string // DeleteTasks calls: batch ID -> IDs
	released        map[string]int      // owner -> units ReleasePending gave back
	idemReleased    []string            // Idempotency-Keys released
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

func (f *faultyStore) CreateBatch(ctx context.Context, b store.NewBatch, items []store.NewTask) error {
	f.mu.Lock()
	for _, it := range items {
		f.batches[b.ID] = append(f.batches[b.ID], it.ID)
	}
	lost := f.createBatchLost
	f.mu.Unlock()
	if err := f.Store.CreateBatch(ctx, b, items); err != nil {
		return err
	}
	if lost {
		return fmt.Errorf("store: create batch %s: %w", b.ID, errInjected)
	}
	return nil
}

func (f *faultyStore) DeleteTasks(ctx context.Context, batchID string, ids []string) error {
	f.mu.Lock()
	f.deleted[batchID] = append(f.deleted[batchID], ids...)
	f.mu.Unlock()
	return f.Store.DeleteTasks(ctx, batchID, ids)
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

// only returns the one batch CreateBatch was given, and its items.
func (f *faultyStore) only(t *testing.T) (string, []string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.batches) != 1 {
		t.Fatalf("CreateBatch was called for %d batches, want 1", len(f.batches))
	}
	for id, items := range f.batches {
		return id, items
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
}

const aliceKey = "a-key"

func newFaultRig(t *testing.T) *faultRig {
	t.Helper()
	r := redistest.Start(t)
	real := store.New(r.Client(t), store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	st := &faultyStore{Store: real, batches: map[string][]string{}, deleted: map[string][]string{}, released: map[string]int{}}
	q := &fakeQueue{okCalls: -1}
	o := api.OptionsForTest()
	o.MaxBatchItems, o.ChunkSize, o.EnqueueParallelism, o.MaxConcurrentDecodes, o.MaxPendingPerKey = 100, 2, 1, 1, 100
	o.Keys = []api.APIKey{{Name: "alice", Key: aliceKey}}
	srv := api.New(q, st, store.NewHub(), nil, nil, o)
	return &faultRig{t: t, h: srv.Handler(), st: st, queue: q}
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

// A single task whose enqueue fails was recorded and counted against the
// owner's quota first; the client must get a 503 it can retry, and the
// record and the quota slot must be given back.
func TestCreateTaskEnqueueFailsUndoesTheRecord(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	r.queue.set(0)
	rec, e := r.post("/v1/tasks", sample8)
	wantUnavailable(t, "enqueue failed", rec, e)
	if len(r.st.submitted) != 1 || r.queue.calls != 1 {
		t.Fatalf("recorded %v and tried %d enqueues; the failure must come after the record was written", r.st.submitted, r.queue.calls)
	}
	id := r.st.submitted[0]
	if got := r.st.deleted[""]; len(got) != 1 || got[0] != id {
		t.Errorf("DeleteTasks got %v, want the task %s", r.st.deleted, id)
	}
	r.gone("", []string{id})
	if r.st.released["alice"] != 1 || r.pending() != 0 {
		t.Errorf("quota: released %d, pending %d; want 1 released and 0 pending", r.st.released["alice"], r.pending())
	}

	// The retry the 503 invites succeeds once the queue is back.
	r.queue.set(-1)
	rec, _ = r.post("/v1/tasks", sample8)
	if rec.Code != http.StatusAccepted || r.pending() != 1 {
		t.Fatalf("retry: %d %s, pending %d", rec.Code, rec.Body.Bytes(), r.pending())
	}
}

// A batch whose enqueues fail half way was recorded, with its outbox, in
// one step before the first enqueue: it is accepted (202), nothing is
// undone, its quota stays counted and its Idempotency-Key stays its own.
// The units the queue refused wait in the outbox for the reconciler, and
// the client's retry with the same key replays the batch.
func TestCreateBatchEnqueueFailsHalfWay(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	body := batchOf(7) // 4 chunk tasks and 1 sweep task
	r.queue.set(2)
	rec, _ := r.post("/v1/batches", body, "Idempotency-Key", "run-1")
	if rec.Code != http.StatusAccepted {
		t.Fatalf("enqueue failed half way after the batch was recorded: %d %s, want 202", rec.Code, rec.Body.Bytes())
	}
	batchID, ids := r.st.only(t)
	if len(ids) != 8 || len(r.queue.enqueued) != 2 || r.queue.calls < 3 {
		t.Fatalf("%d items recorded, %d tasks enqueued in %d calls; want 8 items, 2 enqueued before the failure", len(ids), len(r.queue.enqueued), r.queue.calls)
	}
	if len(r.st.deleted) != 0 || len(r.st.idemReleased) != 0 {
		t.Errorf("an accepted batch was undone: deleted %v, keys released %v", r.st.deleted, r.st.idemReleased)
	}
	if r.pending() != 8 {
		t.Errorf("quota: pending %d, want the batch's 8", r.pending())
	}
	idx, _, _, err := r.st.Store.OutboxUnits(context.Background(), batchID)
	if err != nil || len(idx) != 3 {
		t.Errorf("outbox holds %d units (%v), want the 3 the queue refused", len(idx), err)
	}

	r.queue.set(-1)
	rec, _ = r.post("/v1/batches", body, "Idempotency-Key", "run-1")
	var ack apitype.BatchCreated
	if rec.Code != http.StatusAccepted || json.Unmarshal(rec.Body.Bytes(), &ack) != nil || ack.ID != batchID ||
		rec.Header().Get("Idempotent-Replayed") != "true" || len(ack.TaskIDs) != 8 {
		t.Fatalf("retry with the same key: %d %s %v, want a replay of %s", rec.Code, rec.Body.Bytes(), rec.Header(), batchID)
	}
}

// Redis may run the script that records a batch and drop the connection
// before the reply: the API sees an error for a batch that exists. Nothing
// was enqueued, so the API undoes it (AbandonBatch): a request that failed
// leaves nothing behind, and the client is told to retry.
func TestCreateBatchRedisFailsHalfWay(t *testing.T) {
	t.Parallel()
	r := newFaultRig(t)
	r.st.createBatchLost = true
	rec, e := r.post("/v1/batches", batchOf(3), "Idempotency-Key", "run-2")
	wantUnavailable(t, "create batch reply lost", rec, e)
	batchID, ids := r.st.only(t)
	if r.queue.calls != 0 {
		t.Errorf("%d enqueues after the batch failed to record", r.queue.calls)
	}
	r.gone(batchID, ids)
	if r.pending() != 0 {
		t.Errorf("quota: pending %d, want 0", r.pending())
	}
	if b, _ := r.st.Store.OutboxBatches(context.Background(), time.Now().Add(time.Hour), 10); len(b) != 0 {
		t.Errorf("the outbox still lists %v", b)
	}
	if len(r.st.idemReleased) != 1 {
		t.Errorf("Idempotency-Keys released: %v, want [run-2]", r.st.idemReleased)
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
		{"EnqueueParallelism", func(o *api.Options) { o.EnqueueParallelism = 0 }},
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
			api.New(&fakeQueue{}, nil, store.NewHub(), nil, nil, o)
		})
	}
	// The helper itself has every limit, or the cases above prove nothing.
	api.New(&fakeQueue{}, nil, store.NewHub(), nil, nil, api.OptionsForTest())
}
