package worker_test

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// writeLog is a go-redis hook that logs the heartbeat's round trips once
// each has been answered (one per command sent alone, one per pipeline),
// with the commands of each and how many fields each HSET carried.
type writeLog struct {
	mu    sync.Mutex
	trips [][]string // command names, one slice per round trip
	hsets []int      // fields of each HSET, in order
}

func (l *writeLog) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l *writeLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		l.add([]redis.Cmder{cmd})
		return err
	}
}
func (l *writeLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		l.add(cmds)
		return err
	}
}

func (l *writeLog) add(cmds []redis.Cmder) {
	if n := cmds[0].Name(); n == "hello" || n == "client" {
		return // a new connection's setup, not the heartbeat's
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = c.Name()
		if c.Name() == "hset" {
			l.hsets = append(l.hsets, (len(c.Args())-2)/2)
		}
	}
	l.trips = append(l.trips, names)
}

// since returns the round trips logged after the first n, and how many
// there are in all.
func (l *writeLog) since(n int) ([][]string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.trips[n:]), len(l.trips)
}

func (l *writeLog) lastHSet() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.hsets) == 0 {
		return 0
	}
	return l.hsets[len(l.hsets)-1]
}

// holdFixture is a Heartbeat on a Redis of its own whose client logs the
// heartbeat's writes, with its middleware around a handler that the test
// holds.
type holdFixture struct {
	srv   *redistest.Server
	plain *redis.Client // the test's own reads, not logged
	log   *writeLog
	hb    *worker.Heartbeat
	h     asynq.Handler
	ctx   context.Context

	release chan struct{} // closed: every held task returns
	started chan time.Time
	running sync.WaitGroup
}

const holdWorker = "w-hold"

func newHoldFixture(t *testing.T, interval time.Duration) *holdFixture {
	t.Helper()
	f := &holdFixture{srv: redistest.Start(t), log: &writeLog{}, ctx: context.Background(),
		release: make(chan struct{}), started: make(chan time.Time, 100)}
	f.plain = f.srv.Client(t)
	// As the binaries' clients (internal/app/redis.go): the caller's
	// deadline bounds the socket, so a flush to a frozen Redis gives up.
	rdb := redistest.NewClient(&redis.Options{Addr: f.srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Ping(f.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.AddHook(f.log)
	f.hb = worker.NewHeartbeat(store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour}),
		holdWorker, interval, nil)
	f.h = f.hb.Middleware()(asynq.HandlerFunc(func(ctx context.Context, tk *asynq.Task) error {
		f.started <- time.Now()
		if tk.Type() == "instant" {
			return nil
		}
		<-f.release
		return nil
	}))
	t.Cleanup(func() {
		f.releaseAll()
		f.running.Wait()
		_ = f.hb.Leave(context.Background())
	})
	return f
}

// releaseAll lets every held task return; it is idempotent.
func (f *holdFixture) releaseAll() {
	select {
	case <-f.release:
	default:
		close(f.release)
	}
}

// startHeld starts a task that runs until releaseAll, and returns how
// long the middleware took to hand it to the handler.
func (f *holdFixture) startHeld(t *testing.T) time.Duration {
	t.Helper()
	f.running.Add(1)
	at := time.Now()
	go func() { defer f.running.Done(); _ = f.h.ProcessTask(f.ctx, asynq.NewTask("held", nil)) }()
	select {
	case s := <-f.started:
		return s.Sub(at)
	case <-time.After(10 * time.Second):
		t.Fatal("a task did not start within 10 s")
		return 0
	}
}

// runInstant runs a task that returns at once.
func (f *holdFixture) runInstant(t *testing.T) {
	t.Helper()
	if err := f.h.ProcessTask(f.ctx, asynq.NewTask("instant", nil)); err != nil {
		t.Fatal(err)
	}
	<-f.started
}

// held returns how many tasks the worker's record in Redis holds.
func (f *holdFixture) held(t *testing.T) int64 {
	t.Helper()
	n, err := f.plain.HLen(f.ctx, "pq:worker:"+holdWorker+":held").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls cond every millisecond until it holds, and fails after
// bound; it returns how long that took.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > bound {
			t.Fatalf("%s: not within %s", what, bound)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// TestHeartbeatHoldsBehind: the middleware writes nothing before a task
// runs; the flusher writes a task that still runs holdDelay later, every
// task that started meanwhile in the same round trip (one HSET, one
// PEXPIRE), and never a task that ended first, which then needs no
// removal either. A beat still rewrites every running task, and removes
// the written ones once they ended.
func TestHeartbeatHoldsBehind(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		held    int  // tasks that run until the test releases them
		instant int  // tasks that end at once
		pause   bool // writes are held off until every task has started (and the instant ones ended)
		// wantTrips is the flusher's round trips; wantHeld the tasks in
		// Redis after it.
		wantTrips int
		wantHeld  int64
	}{
		{name: "a long task is held by the flusher, with no beat", held: 1, wantTrips: 1, wantHeld: 1},
		{name: "tasks that start together are one write", held: 32, pause: true, wantTrips: 1, wantHeld: 32},
		{name: "instant tasks are never written", instant: 100, pause: true, wantTrips: 0, wantHeld: 0},
		{name: "the instant ones among long ones are left out", held: 5, instant: 20, pause: true, wantTrips: 1, wantHeld: 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newHoldFixture(t, time.Hour) // beats only when told
			var resume func()
			if tc.pause {
				resume = worker.PauseWrites(f.hb)
			}
			_, n0 := f.log.since(0)
			t0 := time.Now()
			for range tc.held {
				if d := f.startHeld(t); d > time.Second {
					t.Fatalf("a task started %s after the middleware got it", d)
				}
			}
			for range tc.instant {
				f.runInstant(t)
			}
			if tc.pause {
				if trips, _ := f.log.since(n0); len(trips) != 0 {
					t.Fatalf("writes while paused: %v", trips)
				}
				resume()
			}
			// The write is due holdDelay (5 ms) after the first start;
			// the bound is for a loaded machine.
			waitFor(t, 10*time.Second, "the flusher wrote what it had and stopped", func() bool {
				return worker.Unwritten(f.hb) == 0 && !worker.Flushing(f.hb)
			})
			if !tc.pause && tc.held > 0 {
				// No beat runs here, so the flusher wrote it; how soon is
				// the machine's, reported, not held to a bound.
				t.Logf("held %s after the task started", time.Since(t0).Round(time.Millisecond))
			}
			trips, n1 := f.log.since(n0)
			if len(trips) != tc.wantTrips {
				t.Fatalf("the flusher made %d round trips %v; want %d", len(trips), trips, tc.wantTrips)
			}
			for _, tr := range trips {
				if !slices.Equal(tr, []string{"hset", "pexpire"}) {
					t.Fatalf("a flush sent %v; want one HSET and one PEXPIRE", tr)
				}
			}
			if tc.wantTrips > 0 && f.log.lastHSet() != int(tc.wantHeld) {
				t.Fatalf("the HSET carried %d tasks; want %d", f.log.lastHSet(), tc.wantHeld)
			}
			if got := f.held(t); got != tc.wantHeld {
				t.Fatalf("Redis holds %d tasks; want %d", got, tc.wantHeld)
			}

			// A beat rewrites the worker's presence and every running
			// task.
			if err := f.hb.Beat(f.ctx); err != nil {
				t.Fatal(err)
			}
			beat, n2 := f.log.since(n1)
			want := []string{"zadd", "set"}
			if tc.held > 0 {
				want = []string{"zadd", "set", "hset", "pexpire"}
			}
			if len(beat) != 1 || !slices.Equal(beat[0], want) || (tc.held > 0 && f.log.lastHSet() != tc.held) {
				t.Fatalf("a beat with %d tasks running sent %v (HSET of %d); want %v", tc.held, beat, f.log.lastHSet(), want)
			}
			// Once they end, the next beat removes the written ones and
			// nothing of the never-written.
			f.releaseAll()
			f.running.Wait()
			if err := f.hb.Beat(f.ctx); err != nil {
				t.Fatal(err)
			}
			beat, _ = f.log.since(n2)
			want = []string{"zadd", "set"}
			if tc.held > 0 {
				want = []string{"zadd", "set", "hdel"}
			}
			if len(beat) != 1 || !slices.Equal(beat[0], want) {
				t.Fatalf("the beat after the tasks ended sent %v; want %v", beat, want)
			}
			if got := f.held(t); got != 0 {
				t.Fatalf("Redis holds %d tasks after they ended and a beat; want 0", got)
			}
		})
	}
}

// TestHeartbeatFlushFailure: while Redis is frozen (SIGSTOP) or stopped,
// tasks start at once, a flush that fails leaves them unwritten, and the
// next flush (woken by the next task to start) or the next beat writes
// them once Redis is back.
func TestHeartbeatFlushFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		freeze   bool // SIGSTOP, else kill (and start again, empty)
		withBeat bool // the beat retries, else the next task's flush
	}{
		{name: "frozen, the next flush writes them", freeze: true},
		{name: "frozen, the next beat writes them", freeze: true, withBeat: true},
		{name: "stopped, the next flush writes them"},
		{name: "stopped, the next beat writes them", withBeat: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A flush is bounded by the interval: 1 s, so a task that
			// waited for one would start a second late.
			f := newHoldFixture(t, time.Second)
			thawed := false
			if tc.freeze {
				if err := f.srv.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if !thawed {
						_ = f.srv.Signal(syscall.SIGCONT)
					}
				})
			} else {
				f.srv.Kill()
			}
			if d := f.startHeld(t); d > 200*time.Millisecond {
				t.Fatalf("with Redis down a task started %s after the middleware got it", d)
			}
			// The first flush takes its task and is in flight (frozen)
			// or failed already (stopped); a task that starts now does
			// not wait for it either.
			waitFor(t, 2*time.Second, "the first flush took its task", func() bool { return worker.Unwritten(f.hb) == 0 || !worker.Flushing(f.hb) })
			if d := f.startHeld(t); d > 200*time.Millisecond {
				t.Fatalf("a task started %s after the middleware got it, with a flush to a Redis that is down", d)
			}
			waitFor(t, 5*time.Second, "the flushes failed and left both tasks unwritten", func() bool {
				return worker.Unwritten(f.hb) == 2 && !worker.Flushing(f.hb)
			})
			if tc.freeze {
				thawed = true
				if err := f.srv.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
			} else if err := f.srv.Restart(); err != nil {
				t.Fatal(err)
			}
			want := 2
			if tc.withBeat {
				// A beat's first attempt may find a connection the
				// outage broke; the next one (Run's next tick) succeeds.
				waitFor(t, 5*time.Second, "a beat reached Redis", func() bool { return f.hb.Beat(f.ctx) == nil })
			} else {
				want = 3
				if d := f.startHeld(t); d > 200*time.Millisecond {
					t.Fatalf("a task started %s after the middleware got it", d)
				}
				waitFor(t, 5*time.Second, "the next flush wrote all three", func() bool {
					return worker.Unwritten(f.hb) == 0 && !worker.Flushing(f.hb) && f.log.lastHSet() == 3
				})
			}
			if got := worker.Unwritten(f.hb); got != 0 {
				t.Fatalf("%d tasks unwritten after the retry", got)
			}
			if got := f.held(t); got != int64(want) {
				t.Fatalf("Redis holds %d tasks; want %d", got, want)
			}
		})
	}
}

// TestHeartbeatFlusherStops: the flusher ends with Run's ctx or Leave, a
// write of it waiting included, and none starts afterwards; tasks that
// start then are kept in memory only (no beat follows either).
func TestHeartbeatFlusherStops(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		leave bool // else Run's ctx ends
	}{
		{name: "Run's ctx ends"},
		{name: "Leave", leave: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newHoldFixture(t, time.Hour)
			ctx, cancel := context.WithCancel(f.ctx)
			defer cancel()
			ran := make(chan struct{})
			if tc.leave {
				close(ran) // Leave alone, as after a Run that ended without stopping the flusher
			} else {
				go func() { defer close(ran); f.hb.Run(ctx) }()
			}
			resume := worker.PauseWrites(f.hb) // the flusher waits to write
			f.startHeld(t)
			waitFor(t, 2*time.Second, "the flusher started", func() bool { return worker.Flushing(f.hb) })
			stopped := make(chan error, 1)
			go func() {
				if tc.leave {
					stopped <- f.hb.Leave(f.ctx)
					return
				}
				cancel()
				<-ran
				stopped <- nil
			}()
			time.Sleep(20 * time.Millisecond)
			resume()
			select {
			case err := <-stopped:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the heartbeat did not stop within 5 s")
			}
			if worker.Flushing(f.hb) {
				t.Fatal("the flusher runs after the heartbeat stopped")
			}
			_, n := f.log.since(0)
			f.startHeld(t)
			time.Sleep(50 * time.Millisecond)
			if trips, _ := f.log.since(n); worker.Flushing(f.hb) || len(trips) != 0 {
				t.Fatalf("a task started after the stop woke a flusher (%v) that wrote %v", worker.Flushing(f.hb), trips)
			}
		})
	}
}

// TestHoldNow: a run that calls HoldNow is in its worker's record when it
// returns, written by that call or by a flush that got there first, and
// only once: neither a second call nor the flusher writes it again.
// Outside the middleware it does nothing. With Redis frozen it fails
// within the write's bound and leaves the task unwritten, and the next
// beat writes it.
func TestHoldNow(t *testing.T) {
	t.Parallel()
	if err := worker.HoldNow(context.Background()); err != nil {
		t.Fatalf("HoldNow outside a heartbeat's middleware: %v", err)
	}

	t.Run("written once, before it returns", func(t *testing.T) {
		t.Parallel()
		f := newHoldFixture(t, time.Hour) // beats only when told
		_, n0 := f.log.since(0)
		var heldAtReturn, heldAfterSecond int64
		h := f.hb.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			if err := worker.HoldNow(ctx); err != nil {
				return err
			}
			heldAtReturn = f.held(t)
			_, n := f.log.since(0)
			if err := worker.HoldNow(ctx); err != nil {
				return err
			}
			if _, n2 := f.log.since(0); n2 != n {
				t.Errorf("a second HoldNow made %d round trips; want none", n2-n)
			}
			heldAfterSecond = f.held(t)
			// Long enough for the flusher, were it to write it again.
			time.Sleep(50 * time.Millisecond)
			return nil
		}))
		if err := h.ProcessTask(f.ctx, asynq.NewTask("held", nil)); err != nil {
			t.Fatal(err)
		}
		if heldAtReturn != 1 || heldAfterSecond != 1 {
			t.Fatalf("Redis held %d tasks when HoldNow returned and %d after the second call; want 1 and 1", heldAtReturn, heldAfterSecond)
		}
		trips, _ := f.log.since(n0)
		if len(trips) != 1 || !slices.Equal(trips[0], []string{"hset", "pexpire"}) {
			t.Fatalf("round trips for one run that called HoldNow: %v; want one HSET and PEXPIRE", trips)
		}
	})

	t.Run("frozen Redis: an error, and the next beat writes it", func(t *testing.T) {
		t.Parallel()
		f := newHoldFixture(t, 300*time.Millisecond) // the write's bound; Run is not started
		resume := worker.PauseWrites(f.hb)           // no flush takes the task before Redis is frozen
		got := make(chan error, 1)
		h := f.hb.Middleware()(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
			got <- worker.HoldNow(ctx)
			<-f.release
			return nil
		}))
		f.running.Add(1)
		go func() { defer f.running.Done(); _ = h.ProcessTask(f.ctx, asynq.NewTask("held", nil)) }()
		waitFor(t, 5*time.Second, "the task started", func() bool { return worker.Unwritten(f.hb) == 1 })
		if err := f.srv.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		thawed := false
		t.Cleanup(func() {
			if !thawed {
				_ = f.srv.Signal(syscall.SIGCONT)
			}
		})
		at := time.Now()
		resume()
		var err error
		select {
		case err = <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("HoldNow against a frozen Redis did not return within 10 s")
		}
		if err == nil {
			t.Fatal("HoldNow against a frozen Redis returned no error")
		}
		t.Logf("HoldNow failed after %s: %v", time.Since(at).Round(time.Millisecond), err)
		waitFor(t, 5*time.Second, "the flusher gave up too", func() bool { return !worker.Flushing(f.hb) })
		if n := worker.Unwritten(f.hb); n != 1 {
			t.Fatalf("%d tasks unwritten after the failed HoldNow; want 1", n)
		}
		thawed = true
		if err := f.srv.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "a beat reached Redis", func() bool { return f.hb.Beat(f.ctx) == nil })
		if n := f.held(t); n != 1 {
			t.Fatalf("Redis holds %d tasks after the beat; want 1", n)
		}
	})
}

// TestHeartbeatDrainShows: after Drain, the next beat's presence says the
// worker drains, while a task still runs; before, it did not. (The fault
// suite's graceful shutdown reads it through GET /v1/status.)
func TestHeartbeatDrainShows(t *testing.T) {
	t.Parallel()
	f := newHoldFixture(t, time.Hour) // beats only when told
	st := store.New(f.plain, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	f.running.Add(1)
	go func() {
		defer f.running.Done()
		_ = f.h.ProcessTask(f.ctx, asynq.NewTask("held", nil))
	}()
	<-f.started
	presence := func() worker.Presence {
		t.Helper()
		if err := f.hb.Beat(f.ctx); err != nil {
			t.Fatal(err)
		}
		ps, err := st.Presences(f.ctx)
		if err != nil || len(ps) != 1 {
			t.Fatalf("presences %+v %v, want the one worker's", ps, err)
		}
		return ps[0]
	}
	if p := presence(); p.Draining {
		t.Fatalf("draining before Drain: %+v", p)
	}
	f.hb.Drain()
	if p := presence(); !p.Draining {
		t.Fatalf("after Drain: %+v, want draining", p)
	}
}
