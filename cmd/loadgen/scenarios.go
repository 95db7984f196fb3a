package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// loadgen holds one run's state.
type loadgen struct {
	o    *options
	pool *pool
	rep  *Report
	st   *stack // nil with -server
	base string
	http *http.Client
}

func (lg *loadgen) runScenario(ctx context.Context, name string) (*Result, error) {
	switch name {
	case "single":
		return lg.single(ctx)
	case "throughput":
		return lg.throughput(ctx)
	case "raw-asynq":
		return lg.rawAsynq(ctx)
	case "cache":
		return lg.cache(ctx)
	case "batch":
		return lg.batch(ctx)
	case "pickup":
		return lg.pickup(ctx)
	}
	return nil, fmt.Errorf("unknown scenario %q", name)
}

// tally collects the outcome of tasks from many goroutines.
type tally struct {
	mu                                   sync.Mutex
	submitted, completed, failed, errors int
	firstErr                             string
	lat                                  []time.Duration
}

func (t *tally) add(submitted bool, state string, lat time.Duration, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if submitted {
		t.submitted++
	}
	switch {
	case err != nil:
		t.errors++
		if t.firstErr == "" {
			t.firstErr = err.Error()
		}
	case state == "completed":
		t.completed++
		t.lat = append(t.lat, lat)
	default:
		t.failed++
	}
}

func (t *tally) into(r *Result, elapsed time.Duration) {
	r.Submitted, r.Completed, r.Failed, r.Errors, r.FirstError = t.submitted, t.completed, t.failed, t.errors, t.firstErr
	r.DurationSec = elapsed.Seconds()
	if elapsed > 0 {
		r.SubmitRate = float64(t.submitted) / elapsed.Seconds()
		r.CompleteRate = float64(t.completed) / elapsed.Seconds()
	}
	r.Latency = percentiles(t.lat)
}

// solve runs solveOne and records the outcome; false when the pool of
// distinct puzzles is used up.
func (lg *loadgen) solve(ctx context.Context, t *tally) bool {
	body, ok := lg.pool.take()
	if !ok {
		return false
	}
	submitted, state, lat, err := lg.solveOne(ctx, body)
	t.add(submitted, state, lat, err)
	return true
}

// warmUp solves a few tasks outside any measurement: the first 8-puzzle
// builds the solver's distance table, and connections get opened.
func (lg *loadgen) warmUp(ctx context.Context) error {
	for range 3 {
		body, ok := lg.pool.take()
		if !ok {
			return errPoolExhausted
		}
		if _, state, _, err := lg.solveOne(ctx, body); err != nil || state != "completed" {
			return fmt.Errorf("warm-up task: state %q: %v", state, err)
		}
	}
	return nil
}

var errPoolExhausted = fmt.Errorf("all 181,440 distinct 8-puzzles have been used; run fewer or shorter scenarios")

// sleepCtx sleeps d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// single submits one task at a time. Before each, a random think time of
// up to two check intervals puts the arrival at a random phase of the
// idle worker's poll, as independent users would; a second pass without
// think time shows the phase-locked worst case.
func (lg *loadgen) single(ctx context.Context) (*Result, error) {
	r := &Result{Scenario: "single"}
	if err := lg.warmUp(ctx); err != nil {
		return nil, err
	}
	think := 2 * lg.o.checkInterval
	var random, b2b tally
	start := time.Now()
	for i := 0; i < lg.o.singleN && ctx.Err() == nil; i++ {
		sleepCtx(ctx, rand.N[time.Duration](think)+time.Millisecond)
		if !lg.solve(ctx, &random) {
			return nil, errPoolExhausted
		}
	}
	for i := 0; i < lg.o.singleN && ctx.Err() == nil; i++ {
		if !lg.solve(ctx, &b2b) {
			return nil, errPoolExhausted
		}
	}
	random.into(r, time.Since(start))
	r.Submitted += b2b.submitted
	r.Completed += b2b.completed
	r.Failed += b2b.failed
	r.Errors += b2b.errors
	if r.FirstError == "" {
		r.FirstError = b2b.firstErr
	}
	r.BackToBack = percentiles(b2b.lat)
	r.Notes = append(r.Notes, fmt.Sprintf("%d tasks with a random 0-%s think time (latency columns), then %d back to back",
		lg.o.singleN, think, lg.o.singleN))
	if p := r.Latency; p != nil {
		r.target("single p50", "< 25 ms", fmt.Sprintf("%.1f ms", p.P50), p.P50 < 25)
	}
	return r, nil
}

// closedLoop runs clients that each submit a task and wait for its
// result, again and again, until dur passes or maxTasks were started.
func (lg *loadgen) closedLoop(ctx context.Context, dur time.Duration, maxTasks int, next func() ([]byte, bool)) (*tally, time.Duration, bool) {
	var (
		t         tally
		started   atomic.Int64
		exhausted atomic.Bool
		wg        sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(dur)
	for range lg.o.clients {
		wg.Go(func() {
			for range 10_000_000 { // bounded; the deadline ends it long before
				if ctx.Err() != nil || time.Now().After(deadline) {
					return
				}
				if maxTasks > 0 && started.Add(1) > int64(maxTasks) {
					return
				}
				body, ok := next()
				if !ok {
					exhausted.Store(true)
					return
				}
				submitted, state, lat, err := lg.solveOne(ctx, body)
				t.add(submitted, state, lat, err)
			}
		})
	}
	wg.Wait()
	return &t, time.Since(start), exhausted.Load()
}

func (lg *loadgen) throughput(ctx context.Context) (*Result, error) {
	r := &Result{Scenario: "throughput"}
	if err := lg.warmUp(ctx); err != nil {
		return nil, err
	}
	t, elapsed, exhausted := lg.closedLoop(ctx, lg.o.duration, lg.o.maxTasks, lg.pool.take)
	t.into(r, elapsed)
	if exhausted {
		r.Notes = append(r.Notes, "stopped early: the distinct puzzles ran out")
	}
	r.Notes = append(r.Notes, fmt.Sprintf("%d closed-loop clients, each POST /v1/tasks then GET ?wait=%s, distinct puzzles",
		lg.o.clients, taskWait))
	return r, nil
}

// cache measures submissions answered from the result cache: every
// client submits the same, already solved puzzle.
func (lg *loadgen) cache(ctx context.Context) (*Result, error) {
	r := &Result{Scenario: "cache"}
	body, ok := lg.pool.take()
	if !ok {
		return nil, errPoolExhausted
	}
	if _, state, _, err := lg.solveOne(ctx, body); err != nil || state != "completed" {
		return nil, fmt.Errorf("priming task: state %q: %v", state, err)
	}
	dur := max(lg.o.duration/2, time.Second)
	t, elapsed, _ := lg.closedLoop(ctx, dur, lg.o.maxTasks, func() ([]byte, bool) { return body, true })
	t.into(r, elapsed)
	r.Notes = append(r.Notes, fmt.Sprintf("%d clients re-submitting one solved puzzle for %s (POST answers 200 from the cache)",
		lg.o.clients, dur))
	return r, nil
}

// rawAsynq runs the throughput load on bare asynq with no-op tasks in
// Redis DB 1: the same number of servers, concurrency and check interval
// as our workers, and at most -clients tasks in flight like the
// closed-loop clients. The handler counts completions.
func (lg *loadgen) rawAsynq(ctx context.Context) (*Result, error) {
	r := &Result{Scenario: "raw-asynq"}
	if lg.st == nil {
		r.Skipped = "needs loadgen's own Redis; run without -server"
		return r, nil
	}
	opt := asynq.RedisClientOpt{Addr: lg.st.redis.addr, DB: 1}
	const queue = "loadgen-noop"
	var (
		done     atomic.Int64
		lastDone atomic.Int64
		latMu    sync.Mutex
		lat      []time.Duration
		tokens   = make(chan struct{}, lg.o.clients)
	)
	mux := asynq.NewServeMux()
	mux.HandleFunc("noop", func(_ context.Context, t *asynq.Task) error {
		now := time.Now()
		if p := t.Payload(); len(p) == 8 {
			d := time.Duration(now.UnixNano() - int64(binary.BigEndian.Uint64(p)))
			latMu.Lock()
			lat = append(lat, d)
			latMu.Unlock()
		}
		done.Add(1)
		lastDone.Store(now.UnixNano())
		<-tokens
		return nil
	})
	var servers []*asynq.Server
	defer func() {
		for _, s := range servers {
			s.Shutdown()
		}
	}()
	for range lg.o.workers {
		s := asynq.NewServer(opt, asynq.Config{
			Concurrency: lg.rep.Concurrency, Queues: map[string]int{queue: 1}, TaskCheckInterval: lg.o.checkInterval,
			LogLevel: asynq.FatalLevel, ShutdownTimeout: 5 * time.Second,
		})
		if err := s.Start(mux); err != nil {
			return nil, err
		}
		servers = append(servers, s)
	}
	client := asynq.NewClient(opt)
	defer client.Close()

	var (
		started, enqueued, errs atomic.Int64
		firstErr                atomic.Value
		wg                      sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(lg.o.duration)
	for range lg.o.clients {
		wg.Go(func() {
			for range 10_000_000 {
				if ctx.Err() != nil || time.Now().After(deadline) {
					return
				}
				if lg.o.maxTasks > 0 && started.Add(1) > int64(lg.o.maxTasks) {
					return
				}
				select { // at most -clients tasks in flight
				case tokens <- struct{}{}:
				case <-time.After(time.Until(deadline)):
					return
				}
				var p [8]byte
				binary.BigEndian.PutUint64(p[:], uint64(time.Now().UnixNano()))
				if _, err := client.EnqueueContext(ctx, asynq.NewTask("noop", p[:]), asynq.Queue(queue)); err != nil {
					<-tokens
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				enqueued.Add(1)
			}
		})
	}
	wg.Wait()
	for wait := time.Now().Add(30 * time.Second); done.Load() < enqueued.Load() && time.Now().Before(wait); {
		sleepCtx(ctx, 5*time.Millisecond)
	}
	elapsed := time.Duration(lastDone.Load() - start.UnixNano())
	r.Submitted, r.Completed, r.Errors = int(enqueued.Load()), int(done.Load()), int(errs.Load())
	r.Failed = r.Submitted - r.Completed
	if e, ok := firstErr.Load().(string); ok {
		r.FirstError = e
	}
	r.DurationSec = elapsed.Seconds()
	if elapsed > 0 {
		r.SubmitRate = float64(r.Submitted) / elapsed.Seconds()
		r.CompleteRate = float64(r.Completed) / elapsed.Seconds()
	}
	latMu.Lock()
	r.Latency = percentiles(lat)
	latMu.Unlock()
	r.Notes = append(r.Notes, fmt.Sprintf("bare asynq, no-op handler, Redis DB 1: %d server(s) x concurrency %d, TaskCheckInterval %s, <= %d in flight",
		lg.o.workers, lg.rep.Concurrency, lg.o.checkInterval, lg.o.clients))
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: lg.st.redis.addr, DB: 1})
	defer rdb.Close()
	rdb.FlushDB(cctx)
	return r, nil
}

// batch submits one batch of distinct puzzles and long-polls it.
func (lg *loadgen) batch(ctx context.Context) (*Result, error) {
	r := &Result{Scenario: "batch"}
	n := lg.o.batchSize
	if lg.pool.remaining() < n {
		return nil, errPoolExhausted
	}
	body := make([]byte, 0, n*72+16)
	body = append(body, `{"tasks":[`...)
	for i := range n {
		b, _ := lg.pool.take()
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, b...)
	}
	body = append(body, "]}"...)

	var created struct {
		ID      string   `json:"id"`
		Total   int      `json:"total"`
		TaskIDs []string `json:"task_ids"`
	}
	t0 := time.Now()
	if _, err := lg.do(ctx, http.MethodPost, "/v1/batches", body, &created); err != nil {
		return nil, err
	}
	to202 := time.Since(t0)
	var st struct {
		Done   bool           `json:"done"`
		Counts map[string]int `json:"counts"`
	}
	for i := 0; i < maxBatchPolls && !st.Done; i++ {
		if _, err := lg.do(ctx, http.MethodGet, "/v1/batches/"+created.ID+"?limit=1&wait="+batchWait, nil, &st); err != nil {
			return nil, err
		}
	}
	toDone := time.Since(t0)
	r.Submitted = created.Total
	r.Completed = st.Counts["completed"]
	r.Failed = st.Counts["failed"] + st.Counts["canceled"]
	r.DurationSec = toDone.Seconds()
	r.SubmitRate = float64(created.Total) / to202.Seconds()
	r.CompleteRate = float64(r.Completed) / toDone.Seconds()
	if !st.Done {
		r.Errors++
		r.FirstError = fmt.Sprintf("batch not done after %d long polls of %s", maxBatchPolls, batchWait)
	}
	r.Batch = &BatchFigures{Items: created.Total, To202Ms: ms(to202), ToDoneMs: ms(toDone),
		ItemsPerSec: float64(r.Completed) / toDone.Seconds(), Counts: st.Counts}
	r.target("batch time to 202", "< 1 s", fmt.Sprintf("%.0f ms", ms(to202)), to202 < time.Second)
	r.target("batch time to done", "< 3 s", fmt.Sprintf("%.0f ms", ms(toDone)), st.Done && toDone < 3*time.Second)
	r.Notes = append(r.Notes, fmt.Sprintf("one batch of %d distinct 8-puzzles, %d-byte body; GET /v1/batches/{id}?wait=%s", n, len(body), batchWait))
	return r, nil
}

// pickup restarts the workers as one worker per TASK_CHECK_INTERVAL and
// measures idle Redis commands/s and single-task latency on the idle
// system; a first row without any worker is the API's own idle load.
func (lg *loadgen) pickup(ctx context.Context) (*Result, error) {
	r := &Result{Scenario: "pickup"}
	if lg.st == nil {
		r.Skipped = "restarts workers, so needs loadgen's own stack; run without -server"
		return r, nil
	}
	st := lg.st
	st.stopWorkers()
	defer func() {
		st.stopWorkers()
		if err := st.startWorkers(lg.o.workers, lg.o.concurrency, lg.o.checkInterval); err != nil && r.FirstError == "" {
			r.FirstError = "restart workers: " + err.Error()
		}
	}()
	idleRate := func() (float64, error) {
		sleepCtx(ctx, 500*time.Millisecond) // let start-up traffic pass
		a, err := st.commandsProcessed(ctx)
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		sleepCtx(ctx, lg.o.pickupIdle)
		b, err := st.commandsProcessed(ctx)
		if err != nil {
			return 0, err
		}
		return float64(b-a-1) / time.Since(t0).Seconds(), nil // -1: the INFO itself
	}
	base, err := idleRate()
	if err != nil {
		return nil, err
	}
	r.Pickup = append(r.Pickup, PickupRow{Interval: "none", IdleCommandsPerS: base})
	var all tally
	start := time.Now()
	for _, iv := range lg.o.pickup {
		st.stopWorkers()
		if err := st.startWorkers(1, lg.o.concurrency, iv); err != nil {
			return nil, err
		}
		rate, err := idleRate()
		if err != nil {
			return nil, err
		}
		var t tally
		for i := 0; i < lg.o.pickupSamples && ctx.Err() == nil; i++ {
			sleepCtx(ctx, rand.N[time.Duration](iv)+time.Millisecond) // random phase against the poll
			if !lg.solve(ctx, &t) {
				return nil, errPoolExhausted
			}
		}
		all.submitted += t.submitted
		all.completed += t.completed
		all.failed += t.failed
		all.errors += t.errors
		if all.firstErr == "" {
			all.firstErr = t.firstErr
		}
		r.Pickup = append(r.Pickup, PickupRow{Interval: iv.String(), Latency: percentiles(t.lat), IdleCommandsPerS: rate})
	}
	all.into(r, time.Since(start))
	r.Latency = nil
	r.Notes = append(r.Notes, "1 worker of concurrency "+strconv.Itoa(lg.rep.Concurrency)+" per interval; latency is submit to result with a random pause before each task; idle cmds/s from INFO total_commands_processed over "+lg.o.pickupIdle.String()+" (commands inside Lua scripts count too)")
	return r, nil
}
