// Package lease keeps a lease alive while the work it guards runs: a
// batch retry's lock (internal/store) and an expensive solve's slot
// (tasks) are Redis keys with a time to live, renewed by their holder so
// that a holder that dies lets go within one lease.
package lease

import (
	"context"
	"time"
)

// Renew calls renew every interval, from its own goroutine, until the
// returned stop is called or ctx ends. stop waits for that goroutine, so
// no renewal runs (or starts) after it returns and the caller may release
// the lease at once. renew gets a context that ends with stop; what a
// failed renewal means (log it, ignore it) is the caller's to say.
func Renew(ctx context.Context, interval time.Duration, renew func(context.Context)) (stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
				renew(rctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}
