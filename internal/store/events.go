package store

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
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

// Every pub/sub channel and every message published on one is named
// here. The scripts that publish get the channel and the names (or their
// prefixes) in ARGV, built by these functions, and the subscribers read
// them back with the same: a Hub key is the event's name (Notify), a
// cancel is the ID of the task or item to stop (ListenCancels).

// events is the pub/sub channel on which every terminal task transition
// and every finished batch is announced, for long polls.
func (k keys) events() string { return k.prefix + "events" }

// cancels is the pub/sub channel on which cancellations of running tasks
// are announced, for workers.
func (k keys) cancels() string { return k.prefix + "cancels" }

// The prefixes of the events' names.
const (
	taskEventPrefix  = "t:" // "t:<task ID>", a single task ended
	batchEventPrefix = "b:" // "b:<batch ID>", a batch's last item ended
	chunkEventPrefix = "c:" // "c:<batch ID>:<chunk>", items of a chunk ended
)

// TaskEventKey, BatchEventKey and ChunkEventKey are the Hub keys of the
// events that the scripts publish: a single task's end
// (finishManyScript, finishSolveScript), a batch's end and items of a
// chunk ending (batchLua's settle).
func TaskEventKey(id string) string  { return taskEventPrefix + id }
func BatchEventKey(id string) string { return batchEventPrefix + id }
func ChunkEventKey(batchID string, j int) string {
	return chunkEventsOf(batchID) + strconv.Itoa(j)
}

// chunkEventsOf is what the chunk events of a batch start with; settle
// appends the chunk's number.
func chunkEventsOf(batchID string) string { return chunkEventPrefix + batchID + ":" }

// itemIDsOf is what the IDs of a batch's items start with
// (apitype.ItemID); cancelItemsScript appends the item's index to
// announce a cancel.
func itemIDsOf(batchID string) string {
	id := apitype.ItemID(batchID, 0)
	return id[:len(id)-1]
}

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

// listenHealth is how long a subscription may be silent before its
// listener pings it, and how long that ping may go unanswered before the
// listener takes the connection for dead and subscribes again: a Redis
// that froze, or a link that drops packets without a reset, never fails
// a read by itself.
const listenHealth = 5 * time.Second

// listenRetry is the pause between two failed reads in a row, and before
// a fresh subscription, so that a Redis that is down costs a few dials a
// second, not a loop.
const listenRetry = 100 * time.Millisecond

// listen calls fn with the payload of every message on channel until ctx
// ends, subscribing again whenever the subscription's connection fails or
// goes silent.
//
// It reads the subscription itself rather than through go-redis's
// PubSub.Channel, for its health check: Channel's notices only a ping it
// cannot write, so a subscription on a link that went silent stayed
// subscribed to nothing; here a ping unanswered within the read's
// deadline ends the subscription, and a fresh one is made. It also drops
// Channel's two hand-offs per message (a reader goroutine and a health
// checker woken by each message), though that moved no throughput
// figure.
func (s *Store) listen(ctx context.Context, channel string, fn func(string)) {
	for ctx.Err() == nil {
		s.listenOnce(ctx, channel, fn)
		select {
		case <-ctx.Done():
		case <-time.After(listenRetry):
		}
	}
}

// listenOnce reads one subscription to channel until ctx ends or the
// subscription is taken for dead (a ping unanswered for listenHealth).
// A read that fails otherwise has already had go-redis drop the
// connection; the next read dials again and resubscribes.
func (s *Store) listenOnce(ctx context.Context, channel string, fn func(string)) {
	ps := s.rdb.Subscribe(ctx, channel)
	// A read blocks in the socket whatever ctx says; closing the PubSub
	// ends it.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer func() {
		stop()
		_ = ps.Close()
	}()
	health := listenHealth
	if s.listenHealth > 0 {
		health = s.listenHealth
	}
	pinged, failed := false, 0
	for {
		msg, err := ps.ReceiveTimeout(ctx, health)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if pinged {
					return // the last ping went unanswered
				}
				pctx, cancel := context.WithTimeout(ctx, health)
				err = ps.Ping(pctx)
				cancel()
				if err != nil {
					return
				}
				pinged = true
				continue
			}
			if failed++; failed > 1 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(listenRetry):
				}
			}
			continue
		}
		pinged, failed = false, 0
		if m, ok := msg.(*redis.Message); ok {
			fn(m.Payload)
		}
	}
}
