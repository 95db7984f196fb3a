package worker

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
)

// progressEvery bounds how often one task's progress is written: a search
// reports at every new bound and every million nodes, and a record write
// per report would cost more than it tells.
const progressEvery = 500 * time.Millisecond

// reportProgress returns the callback a long search calls with its bound
// and node count. It runs on the solving goroutine, so it never waits on
// Redis: at most one write is in flight per task, and reports that come
// while one is are dropped (the next one carries newer figures anyway).
func (h *Handler) reportProgress(ctx context.Context, id string) func(bound int, nodes int64) {
	var (
		last     time.Time
		lastB    = -1
		inFlight atomic.Bool
	)
	return func(bound int, nodes int64) {
		now := time.Now()
		if bound == lastB && now.Sub(last) < progressEvery {
			return
		}
		if !inFlight.CompareAndSwap(false, true) {
			return
		}
		last, lastB = now, bound
		go func() {
			defer inFlight.Store(false)
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			if err := h.store.SetProgress(wctx, id, apitype.Progress{Bound: bound, Nodes: nodes}); err != nil {
				h.log.Debug("progress not recorded", "task_id", id, "err", err)
			}
		}()
	}
}
