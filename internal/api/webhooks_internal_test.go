package api

import (
	"context"
	"errors"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/internal/recovery"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/tasks"
)

// failingWebhooks fails the enqueue of webhook deliveries while fail is
// set, as a Redis outage or a crash between the end and the enqueue
// would leave them.
type failingWebhooks struct {
	Enqueuer
	fail bool
}

func (f *failingWebhooks) EnqueueContext(ctx context.Context, t *asynq.Task, o ...asynq.Option) (*asynq.TaskInfo, error) {
	if f.fail && t.Type() == tasks.TypeWebhook {
		return nil, errors.New("injected: enqueue lost")
	}
	return f.Enqueuer.EnqueueContext(ctx, t, o...)
}

// A batch's webhook stays watched until its delivery is on the webhooks
// queue: an enqueue that fails leaves it for the next pass, which
// enqueues it once; a pass that enqueues it again (its acknowledgement
// lost) queues nothing more.
func TestReconcilerEnqueuesWebhooksOnce(t *testing.T) {
	t.Parallel()
	s := newReadStack(t)
	ctx := context.Background()
	id := s.stage(t, 2, 2, nil)
	ref := store.WebhookRef(true, id)
	if err := s.st.WatchWebhook(ctx, ref, "https://example.com/hook"); err != nil {
		t.Fatal(err)
	}
	enq := &failingWebhooks{Enqueuer: s.enq}
	r := recovery.NewReconciler(s.st, enq, nil, recovery.ReconcilerOptions{FeedDepth: 64, Webhooks: s.st,
		WebhookOptions: tasks.WebhookOptions{Timeout: 1e9, MaxRetry: 3, RetryBase: 1e9, RetryMax: 1e9}})
	watched := func() int64 {
		t.Helper()
		n, err := s.st.Watched(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	queued := func() []*asynq.TaskInfo {
		t.Helper()
		ts, err := s.insp.ListPendingTasks(tasks.QueueWebhooks)
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Fatal(err)
		}
		return ts
	}

	// Not done: nothing to deliver yet.
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if watched() != 1 || len(queued()) != 0 {
		t.Fatalf("a running batch's webhook: watched %d, queued %d", watched(), len(queued()))
	}
	if _, err := s.st.CancelBatch(ctx, id, ""); err != nil {
		t.Fatal(err)
	}
	enq.fail = true
	r.RunOnce(ctx) // the failure is logged, not returned
	if watched() != 1 || len(queued()) != 0 {
		t.Fatalf("after a failed enqueue: watched %d, queued %d; the delivery must stay watched", watched(), len(queued()))
	}
	enq.fail = false
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	q := queued()
	if watched() != 0 || len(q) != 1 || q[0].ID != tasks.WebhookTaskID(ref) || q[0].MaxRetry != 3 {
		t.Fatalf("after the enqueue: watched %d, queued %+v", watched(), q)
	}
	// The acknowledgement lost: watched again, enqueued again, queued once.
	if err := s.st.WatchWebhook(ctx, ref, "https://example.com/hook"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if watched() != 0 || len(queued()) != 1 {
		t.Fatalf("enqueued twice: watched %d, queued %d", watched(), len(queued()))
	}
}

func TestSplitWebhook(t *testing.T) {
	const req = `"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}`
	for _, c := range []struct {
		name, body, url, rest string
		found, bad            bool
	}{
		{name: "none", body: `{` + req + `}`, rest: `{` + req + `}`},
		{name: "first", body: `{"webhook":"https://a.example/x",` + req + `}`, url: "https://a.example/x", found: true, rest: `{` + req + `}`},
		{name: "last", body: `{` + req + `,"webhook":"https://a.example/\u0078"}`, url: "https://a.example/x", found: true, rest: `{` + req + `}`},
		// A duplicate name is left for puzzle.Decode, which refuses it.
		{name: "twice", body: `{"webhook":"a",` + req + `,"webhook":"b"}`, rest: `{"webhook":"a",` + req + `,"webhook":"b"}`},
		{name: "not a string", body: `{"webhook":1,` + req + `}`, bad: true},
		{name: "not an object", body: `["webhook"]`, rest: `["webhook"]`},
		{name: "inside a value", body: `{"kind":"webhook"}`, rest: `{"kind":"webhook"}`},
	} {
		url, found, rest, err := splitWebhook([]byte(c.body))
		if (err != nil) != c.bad {
			t.Errorf("%s: error %v", c.name, err)
			continue
		}
		if c.bad {
			continue
		}
		if url != c.url || found != c.found || string(rest) != c.rest {
			t.Errorf("%s: %q %v %s, want %q %v %s", c.name, url, found, rest, c.url, c.found, c.rest)
		}
	}
}
