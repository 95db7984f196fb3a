package store

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Hub fans one Redis subscription out to many local waiters. One process
// holds one subscription however many long polls it serves, instead of a
// connection per waiting request.
type Hub struct {
	mu      sync.Mutex
	waiters map[string]map[*Wake]struct{}
}

// NewHub returns an empty Hub.
func NewHub() *Hub { return &Hub{waiters: map[string]map[*Wake]struct{}{}} }

// Wake is one waiter's registration for an event. C is closed when the
// event arrives; Data then returns what the event carried.
type Wake struct {
	// C is closed when the event arrives.
	C    <-chan struct{}
	ch   chan struct{}
	data []byte
}

// Data returns what the event carried after its key: a single task's
// ended record (DecodeEventTask reads it), or nil. Read it only once C is
// closed.
func (w *Wake) Data() []byte { return w.data }

// Subscribe registers interest in key. Call release when done waiting,
// whether or not it fired.
func (h *Hub) Subscribe(key string) (w *Wake, release func()) {
	ch := make(chan struct{})
	w = &Wake{C: ch, ch: ch}
	h.mu.Lock()
	set := h.waiters[key]
	if set == nil {
		set = map[*Wake]struct{}{}
		h.waiters[key] = set
	}
	set[w] = struct{}{}
	h.mu.Unlock()
	return w, func() {
		h.mu.Lock()
		if set, ok := h.waiters[key]; ok {
			if _, ok := set[w]; ok {
				delete(set, w)
				if len(set) == 0 {
					delete(h.waiters, key)
				}
			}
		}
		h.mu.Unlock()
	}
}

// Wait registers interest in key. The channel is closed when an event for
// key arrives. Call release when done waiting, whether or not it fired.
func (h *Hub) Wait(key string) (fired <-chan struct{}, release func()) {
	w, release := h.Subscribe(key)
	return w.C, release
}

// Notify wakes every waiter on the event msg: its key, optionally
// followed by a space and data (see finishManyScript).
func (h *Hub) Notify(msg string) {
	key, data, _ := strings.Cut(msg, " ")
	h.mu.Lock()
	set := h.waiters[key]
	delete(h.waiters, key)
	h.mu.Unlock()
	var b []byte
	if data != "" {
		b = []byte(data)
	}
	for w := range set {
		w.data = b
		close(w.ch)
	}
}

// DecodeEventTask returns the ended record of task id that its event
// carried (Wake.Data), or nil when the event carried none or it does not
// decode.
func DecodeEventTask(id string, data []byte) *Task {
	if len(data) == 0 {
		return nil
	}
	var m map[string]string
	if data[0] == '{' {
		// A worker of the previous release publishes a JSON object;
		// read it during a rolling upgrade.
		if json.Unmarshal(data, &m) != nil {
			return nil
		}
	} else if m = decodeEventFields(data); m == nil {
		return nil
	}
	if m["state"] == "" {
		return nil
	}
	return decodeTask(id, m)
}

// decodeEventFields reads the fields finishManyScript writes into an
// event, "<len>:<name><len>:<value>" for each, or returns nil when data
// is not that.
func decodeEventFields(data []byte) map[string]string {
	m := make(map[string]string, 12)
	for len(data) > 0 {
		k, rest, ok := netstring(data)
		if !ok {
			return nil
		}
		v, rest, ok := netstring(rest)
		if !ok {
			return nil
		}
		m[string(k)] = string(v)
		data = rest
	}
	return m
}

// netstring splits "<len>:<len bytes>" off the front of b.
func netstring(b []byte) (s, rest []byte, ok bool) {
	n, i := 0, 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if n > len(b) {
			return nil, nil, false
		}
		n = n*10 + int(b[i]-'0')
	}
	if i == 0 || i >= len(b) || b[i] != ':' || n > len(b)-i-1 {
		return nil, nil, false
	}
	b = b[i+1:]
	return b[:n], b[n:], true
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
