package api

import (
	"sync"
	"sync/atomic"
)

// maxHitHints bounds the keys a process remembers as cached: 4,096 keys
// of 64 hex digits are about half a MiB.
const maxHitHints = 4096

// hitHints remembers the cache keys whose answers this process saw
// cached, so that their next submission takes the store's short hit path
// (Store.SubmitCached: no asynq message, no quota keys, a shorter script)
// instead of the full submit. A hint is only a guess: when the
// entry has expired since, SubmitCached writes nothing and the submission
// goes the full way, one round trip later, and the hint is dropped. Reads
// are lock-free (sync.Map); writes happen on a key's first hit and on a
// wrong guess.
type hitHints struct {
	keys sync.Map // cache key -> struct{}
	n    atomic.Int64
}

func (h *hitHints) has(key string) bool {
	_, ok := h.keys.Load(key)
	return ok
}

// add remembers key, dropping an arbitrary other key when full.
func (h *hitHints) add(key string) {
	if _, loaded := h.keys.LoadOrStore(key, struct{}{}); loaded {
		return
	}
	if h.n.Add(1) <= maxHitHints {
		return
	}
	h.keys.Range(func(k, _ any) bool {
		if k.(string) == key {
			return true
		}
		if _, ok := h.keys.LoadAndDelete(k); ok {
			h.n.Add(-1)
			return false
		}
		return true
	})
}

// forget drops key after a wrong guess.
func (h *hitHints) forget(key string) {
	if _, ok := h.keys.LoadAndDelete(key); ok {
		h.n.Add(-1)
	}
}
