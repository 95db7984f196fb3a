package worker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/egress"
	"github.com/puzzleq/puzzleq/tasks"
	"github.com/puzzleq/puzzleq/webhook"
)

// hookStore is a WebhookStore in memory: every ref's URL is given, and
// it records attempts and ended backlog entries.
type hookStore struct {
	mu       sync.Mutex
	urls     map[string]string
	attempts map[string][]WebhookAttempt
	ended    map[string]int
}

func (s *hookStore) WebhookDelivery(_ context.Context, ref string) (string, *apitype.WebhookEvent, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.attempts[ref] {
		if a.Delivered {
			return s.urls[ref], nil, true, nil
		}
	}
	return s.urls[ref], &apitype.WebhookEvent{Type: apitype.WebhookTaskDone, Data: json.RawMessage(`{}`)}, false, nil
}

func (s *hookStore) RecordWebhookAttempt(_ context.Context, ref string, a WebhookAttempt) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts[ref] = append(s.attempts[ref], a)
	return nil
}

func (s *hookStore) EndWebhook(_ context.Context, owner, ref string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended[owner+"/"+ref]++
	return nil
}

// A delivery hanging on a receiver that never answers gives its slot to
// another key's: it returns a wait, not a failure, records no attempt and
// stays in its key's backlog; the other key's is delivered at once and
// leaves its backlog.
func TestWebhookHandlerPreemptedDeliveryWaits(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	hole := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer hole.Close()
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer fast.Close()
	st := &hookStore{urls: map[string]string{"t:a": hole.URL, "t:a1": hole.URL, "t:b": fast.URL},
		attempts: map[string][]WebhookAttempt{}, ended: map[string]int{}}
	pol, err := egress.ParsePolicy("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	sg, err := webhook.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	h := NewWebhookHandler(st, pol, sg, tasks.WebhookOptions{Timeout: time.Minute}, nil, nil)
	pool := NewDeliveryPool(2)
	h.SetPool(pool)
	task := func(ref, owner string) *asynq.Task {
		b, _ := json.Marshal(tasks.WebhookPayload{Ref: ref, Owner: owner})
		return asynq.NewTask(tasks.TypeWebhook, b)
	}

	// a's two deliveries hang on both slots, the second one newer.
	a1Done := make(chan error, 1)
	go func() { a1Done <- h.ProcessTask(context.Background(), task("t:a1", "a")) }()
	deadline := time.Now().Add(5 * time.Second)
	for pool.Held()["a"] != 1 {
		if time.Now().After(deadline) {
			t.Fatal("a's first delivery never took a slot")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond)
	aDone := make(chan error, 1)
	go func() { aDone <- h.ProcessTask(context.Background(), task("t:a", "a")) }()
	for pool.Held()["a"] != 2 {
		if time.Now().After(deadline) {
			t.Fatal("a's delivery never took the slot")
		}
		time.Sleep(time.Millisecond)
	}
	// a asks again: refused, with a wait, no slot taken.
	err = h.ProcessTask(context.Background(), task("t:a2", "a"))
	if d, ok := IsWait(err); !ok || d < time.Second || !strings.Contains(err.Error(), "delivery slots") {
		t.Fatalf("a's second delivery: %v (wait %v), want a wait", err, d)
	}
	start := time.Now()
	if err := h.ProcessTask(context.Background(), task("t:b", "b")); err != nil {
		t.Fatalf("b's delivery: %v", err)
	}
	// Without the preemption it would hang as a's do; the bound is for a
	// loaded machine.
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("b's delivery took %v beside a's hanging one", d)
	}
	select {
	case err := <-aDone:
		if d, ok := IsWait(err); !ok || d > 2*time.Second || !strings.Contains(err.Error(), "took this one's") {
			t.Fatalf("a's preempted delivery returned %v, want a wait of 1-2 s", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a's delivery still hangs after b took its slot")
	}
	if h := pool.Held(); h["a"] != 1 || len(h) != 1 {
		t.Errorf("slots held after b's delivery: %v, want a's older one", h)
	}
	hang <- struct{}{} // a's older delivery gets an answer
	if err := <-a1Done; err != nil {
		t.Errorf("a's older delivery: %v", err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.attempts["t:a"]) != 0 || len(st.attempts["t:b"]) != 1 || !st.attempts["t:b"][0].Delivered {
		t.Errorf("attempts %v: want none for a's preempted one, b's delivered", st.attempts)
	}
	if st.ended["b/t:b"] != 1 || st.ended["a/t:a"] != 0 || st.ended["a/t:a1"] != 1 {
		t.Errorf("backlog ends %v: want b's delivered one only", st.ended)
	}
	if h := pool.Held(); len(h) != 0 {
		t.Errorf("slots held after every delivery returned: %v", h)
	}
}
