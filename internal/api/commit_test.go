package api

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/internal/recovery"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/tasks"
)

// dyingEnqueuer enqueues its first `left` tasks for real and then fails
// every call, as an API process whose enqueue is cut off half way does.
type dyingEnqueuer struct {
	real  *asynq.Client
	left  atomic.Int64
	calls atomic.Int64
}

func (d *dyingEnqueuer) EnqueueContext(ctx context.Context, t *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	d.calls.Add(1)
	if d.left.Add(-1) < 0 {
		return nil, errors.New("connection reset by peer")
	}
	return d.real.EnqueueContext(ctx, t, opts...)
}

// enqueuingStore is the real store whose feeds go through enq first
// (EnqueueFedThrough): the Server's feeds then meet the dying enqueuer,
// and units it refused stay in the feeding set.
type enqueuingStore struct {
	*store.Store
	enq Enqueuer
}

func (s enqueuingStore) EnqueueFed(ctx context.Context, queue string, refs []tasks.UnitRef) (int, error) {
	return EnqueueFedThrough(ctx, s.enq, s.Store, queue, refs)
}

// commitStack is a Server on a real Redis whose enqueuer dies after
// `enqueued` tasks, and the store and inspector to look behind it.
type commitStack struct {
	srv   *Server
	store *store.Store
	enq   *dyingEnqueuer
	real  *asynq.Client
	insp  *asynq.Inspector
}

func newCommitStack(t *testing.T, enqueued int) *commitStack {
	t.Helper()
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	st := store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	real := asynq.NewClientFromRedisClient(rdb)
	enq := &dyingEnqueuer{real: real}
	enq.left.Store(int64(enqueued))
	o := OptionsForTest()
	o.ChunkSize = 10
	srv := New(enqueuingStore{st, enq}, store.NewHub(), prometheus.NewRegistry(), nil, o)
	return &commitStack{srv: srv, store: st, enq: enq, real: real, insp: asynq.NewInspectorFromRedisClient(rdb)}
}

// queued lists the task IDs on the bulk queue.
func (s *commitStack) queued(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for page := 1; ; page++ {
		ts, err := s.insp.ListPendingTasks(tasks.QueueBulk, asynq.Page(page), asynq.PageSize(100))
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Fatal(err)
		}
		for _, ti := range ts {
			if out[ti.ID] {
				t.Fatalf("task %s queued twice", ti.ID)
			}
			out[ti.ID] = true
		}
		if len(ts) < 100 {
			return out
		}
	}
}

func (s *commitStack) post(t *testing.T, body string, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest("POST", "/v1/batches", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	s.srv.Handler().ServeHTTP(w, req)
	return w
}

// eightPuzzles is a JSON batch of n distinct cheap items.
func eightPuzzles(n int) string {
	var b bytes.Buffer
	b.WriteString(`{"tasks":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(testgen.EightPuzzle(i)) // distinct per i
	}
	b.WriteString(`]}`)
	return b.String()
}

// TestEnqueueTwiceMakesOneTask: a unit enqueued again, as after a crash
// between its enqueue and its acknowledgement, is one task, and the
// second enqueue counts as landed.
func TestEnqueueTwiceMakesOneTask(t *testing.T) {
	t.Parallel()
	s := newCommitStack(t, 1000)
	ctx := context.Background()
	refs := []tasks.UnitRef{
		{BatchID: "b", Unit: tasks.ChunkUnit(0), Timeout: time.Minute},
		{BatchID: "b", Unit: tasks.ChunkUnit(1), Timeout: time.Minute},
	}
	for range 2 {
		if n, err := s.store.EnqueueFed(ctx, tasks.QueueBulk, refs); err != nil || n != 2 {
			t.Fatalf("enqueue: %d %v", n, err)
		}
	}
	if q := s.queued(t); len(q) != 2 || !q[refs[0].TaskID()] || !q[refs[1].TaskID()] {
		t.Fatalf("queued %v, want the 2 units once each", q)
	}
}

// TestReplayAnswersAcceptedBatch: a retry with the same Idempotency-Key
// while the batch's units could not be queued (the enqueuer fails, so
// they sit in the feeding set) replays it, since the batch is committed
// and will run, and the reconciler then queues them.
func TestReplayAnswersAcceptedBatch(t *testing.T) {
	t.Parallel()
	s := newCommitStack(t, 0) // nothing gets through: all stay unacknowledged
	body := eightPuzzles(25)
	first := s.post(t, body, map[string]string{"Idempotency-Key": "k1"})
	if first.Code != http.StatusAccepted {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	again := s.post(t, body, map[string]string{"Idempotency-Key": "k1"})
	if again.Code != http.StatusAccepted || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %v %s", again.Code, again.Header(), again.Body)
	}
	if !bytes.Equal(first.Body.Bytes(), again.Body.Bytes()) {
		t.Fatalf("replay answered %s, want %s", again.Body, first.Body)
	}
	// The batch is queued by the reconciler: the replay did not lie.
	r := recovery.NewReconciler(s.store, s.real, nil, recovery.ReconcilerOptions{Grace: time.Nanosecond, FeedDepth: 64})
	if n, err := r.RunOnce(context.Background()); err != nil || n != 3 {
		t.Fatalf("reconcile: %d %v, want 3 chunks", n, err)
	}
}

// claimLosingStore reports every batch write as refused for a lost
// Idempotency-Key claim, as when a request outlives its claim.
type claimLosingStore struct{ *store.Store }

func (claimLosingStore) CommitBatch(context.Context, *store.BatchWriter, store.CommitBatch) error {
	return store.ErrClaimLost
}

// TestClaimLostIsInProgress: a request that outlived its claim wrote
// nothing and is told to retry (409 in_progress), not that the service
// failed.
func TestClaimLostIsInProgress(t *testing.T) {
	t.Parallel()
	s := newCommitStack(t, 1000)
	s.srv.store = claimLosingStore{s.store}
	w := s.post(t, eightPuzzles(3), map[string]string{"Idempotency-Key": "slow"})
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), `"in_progress"`) || w.Header().Get("Retry-After") == "" {
		t.Fatalf("claim lost: %d %v %s, want 409 in_progress with Retry-After", w.Code, w.Header(), w.Body)
	}
}
