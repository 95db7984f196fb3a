package store

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Hub fans one Redis subscription out to many local waiters. One process
// holds one subscription however many long polls it serves, instead of a
// connection per waiting request.
type Hub struct {
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
}

// NewHub returns an empty Hub.
func NewHub() *Hub { return &Hub{waiters: map[string]map[chan struct{}]struct{}{}} }

// Wait registers interest in key. The channel is closed when Notify(key)
// runs. Call release when done waiting, whether or not it fired.
func (h *Hub) Wait(key string) (fired <-chan struct{}, release func()) {
	ch := make(chan struct{})
	h.mu.Lock()
	set := h.waiters[key]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		h.waiters[key] = set
	}
	set[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		if set, ok := h.waiters[key]; ok {
			if _, ok := set[ch]; ok {
				delete(set, ch)
				if len(set) == 0 {
					delete(h.waiters, key)
				}
			}
		}
		h.mu.Unlock()
	}
}

// Notify wakes every waiter on key.
func (h *Hub) Notify(key string) {
	h.mu.Lock()
	set := h.waiters[key]
	delete(h.waiters, key)
	h.mu.Unlock()
	for ch := range set {
		close(ch)
	}
}

// Waiting returns how many keys have waiters, for metrics and tests.
func (h *Hub) Waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiters)
}

// TaskEventKey and BatchEventKey are the Hub keys for the events that
// finishManyScript publishes.
func TaskEventKey(id string) string  { return "t:" + id }
func BatchEventKey(id string) string { return "b:" + id }

// ListenEvents delivers every task and batch event to h until ctx ends.
// go-redis resubscribes by itself after a connection loss; events sent
// while disconnected are lost, which is why waiters also re-read their
// record after a bounded interval.
func (s *Store) ListenEvents(ctx context.Context, h *Hub) {
	s.listen(ctx, s.k.events(), h.Notify)
}

// ListenCancels calls cancel with the ID of every task canceled while
// active, until ctx ends.
func (s *Store) ListenCancels(ctx context.Context, cancel func(id string)) {
	s.listen(ctx, s.k.cancels(), cancel)
}

func (s *Store) listen(ctx context.Context, channel string, fn func(string)) {
	ps := s.rdb.Subscribe(ctx, channel)
	defer ps.Close()
	ch := ps.Channel(redis.WithChannelHealthCheckInterval(5*time.Second), redis.WithChannelSize(4096))
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			fn(m.Payload)
		}
	}
}
