package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// loadgen holds one run's state.
type loadgen struct {
	o    *options
	pool *pool
	rep  *Report
	st   *stacktest.Stack // nil with -server
	base string
	http *http.Client
}

func (lg *loadgen) runScenario(ctx context.Context, name string) (*Result, error) {
	switch name {
	case "throughput", "raw-asynq", "pipeline-floor":
		return nil, fmt.Errorf("%s runs through alternated", name)
	case "single":
		return lg.single(ctx)
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

func (t *tally) add(submitted bool, state apitype.TaskState, lat time.Duration, err error) {
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
	case state == apitype.TaskStateCompleted:
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
		if _, state, _, err := lg.solveOne(ctx, body); err != nil || state != apitype.TaskStateCompleted {
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
// result, again and again, until dur passes or started reaches maxTasks.
// It adds to t and returns the time it ran and whether next ran dry.
func (lg *loadgen) closedLoop(ctx context.Context, base string, t *tally, started *atomic.Int64, dur time.Duration, maxTasks int, next func() ([]byte, bool)) (time.Duration, bool) {
	var (
		exhausted atomic.Bool
		wg        sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(dur)
	for range lg.o.clients {
		wg.Go(func() {
			pprof.Do(ctx, clientLabels, func(ctx context.Context) { lg.clientLoop(ctx, base, t, started, deadline, maxTasks, next, &exhausted) })
		})
	}
	wg.Wait()
	return time.Since(start), exhausted.Load()
}

// clientLabels mark the load generator's own goroutines (and the HTTP
// connections they open) in -cpuprofile, so the client's CPU can be told
// apart from the service's: go tool pprof -tags.
var clientLabels = pprof.Labels("side", "loadgen-client")

func (lg *loadgen) clientLoop(ctx context.Context, base string, t *tally, started *atomic.Int64, deadline time.Time, maxTasks int, next func() ([]byte, bool), exhausted *atomic.Bool) {
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
		submitted, state, lat, err := lg.solveAt(ctx, base, body)
		t.add(submitted, state, lat, err)
	}
}

// alternated runs the throughput scenario and, when asked for, the
// raw-asynq and pipeline-floor ones interleaved with it in -rounds
// alternating slices, so that all see the same machine load and their
// ratios mean something on a shared machine. It returns a result per
// scenario asked for.
func (lg *loadgen) alternated(ctx context.Context, thr, raw, pipe bool) (map[string]*Result, error) {
	var (
		tr, rr, fr *Result
		rig        *rawRig
		prig       *pipeRig
		t, ft      tally
		started    atomic.Int64
		fstarted   atomic.Int64
		tElapsed   time.Duration
		fElapsed   time.Duration
		tCost      costSum
		rCost      costSum
		fCost      costSum
		ranDry     bool
	)
	out := map[string]*Result{}
	// result adds the named scenario's result to out, marked skipped
	// when it needs loadgen's own Redis and has none; it reports whether
	// the scenario runs.
	result := func(name string, ownRedis bool) (*Result, bool) {
		r := &Result{Scenario: name}
		out[name] = r
		if ownRedis && lg.st == nil {
			r.Skipped = "needs loadgen's own Redis; run without -server"
			return r, false
		}
		return r, true
	}
	if thr {
		tr, _ = result("throughput", false)
		if err := lg.warmUp(ctx); err != nil {
			return nil, err
		}
	}
	if raw {
		if rr, raw = result("raw-asynq", true); raw {
			var err error
			if rig, err = lg.newRawRig(); err != nil {
				return nil, err
			}
			defer rig.close()
		}
	}
	if pipe {
		if fr, pipe = result("pipeline-floor", true); pipe {
			var err error
			if prig, err = lg.newPipeRig(); err != nil {
				return nil, err
			}
			defer prig.close()
			// Open its connections outside the measurement, as warmUp
			// does for the service.
			var warm tally
			lg.closedLoop(ctx, prig.url, &warm, &atomic.Int64{}, time.Second, 4*lg.o.clients, func() ([]byte, bool) { return pipeBody, true })
			if warm.completed == 0 {
				return nil, fmt.Errorf("pipeline floor: no task completed while warming up: %s", warm.firstErr)
			}
		}
	}
	rounds := lg.o.rounds
	if n := btoi(thr) + btoi(raw) + btoi(pipe); n < 2 {
		rounds = 1
	}
	slice := lg.o.duration / time.Duration(rounds)
	for i := 0; i < rounds && ctx.Err() == nil; i++ {
		if thr && !ranDry {
			before := lg.sampleCost(ctx)
			el, dry := lg.closedLoop(ctx, lg.base, &t, &started, slice, lg.o.maxTasks, lg.pool.take)
			tCost.add(before, lg.sampleCost(ctx))
			tElapsed += el
			ranDry = ranDry || dry
		}
		if raw {
			before := lg.sampleCost(ctx)
			rig.slice(ctx, slice, lg.o.maxTasks)
			rCost.add(before, lg.sampleCost(ctx))
		}
		if pipe {
			before := lg.sampleCost(ctx)
			el, _ := lg.closedLoop(ctx, prig.url, &ft, &fstarted, slice, lg.o.maxTasks, func() ([]byte, bool) { return pipeBody, true })
			fCost.add(before, lg.sampleCost(ctx))
			fElapsed += el
		}
	}
	if thr {
		t.into(tr, tElapsed)
		tr.PerTask = tCost.perTask(tr.Completed)
		if ranDry {
			tr.Notes = append(tr.Notes, "stopped early: the distinct puzzles ran out")
		}
		style := "POST /v1/tasks then GET ?wait=" + taskWait
		if lg.o.submitWait {
			style = "POST /v1/tasks?wait=" + taskWait
		}
		tr.Notes = append(tr.Notes, fmt.Sprintf("%d closed-loop clients, each %s, distinct puzzles; %d slice(s) of %s",
			lg.o.clients, style, rounds, slice))
	}
	if raw {
		rig.result(rr)
		rr.PerTask = rCost.perTask(rr.Completed)
		rr.Notes = append(rr.Notes, fmt.Sprintf("bare asynq, no-op handler, Redis DB 1: %d server(s) x concurrency %d, TaskCheckInterval %s, <= %d tasks in flight; %d slice(s) of %s alternating with throughput",
			lg.o.workers, lg.rep.Concurrency, lg.o.checkInterval, lg.o.clients, rounds, slice))
	}
	if pipe {
		ft.into(fr, fElapsed)
		fr.PerTask = fCost.perTask(fr.Completed)
		fr.Notes = append(fr.Notes, fmt.Sprintf("a single task's hops and nothing else (cmd/loadgen/pipefloor.go), Redis DB %d: %d closed-loop clients, each POST ?wait; %d asynq server(s) x concurrency %d, TaskCheckInterval %s; %d slice(s) of %s alternating with throughput",
			pipeDB, lg.o.clients, lg.o.workers, lg.rep.Concurrency, lg.o.checkInterval, rounds, slice))
	}
	return out, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// cache measures submissions answered from the result cache: every
// client submits the same, already solved puzzle.
func (lg *loadgen) cache(ctx context.Context) (*Result, error) {
	r := &Result{Scenario: "cache"}
	body, ok := lg.pool.take()
	if !ok {
		return nil, errPoolExhausted
	}
	if _, state, _, err := lg.solveOne(ctx, body); err != nil || state != apitype.TaskStateCompleted {
		return nil, fmt.Errorf("priming task: state %q: %v", state, err)
	}
	dur := max(lg.o.duration/2, time.Second)
	var (
		t       tally
		started atomic.Int64
		c       costSum
	)
	before := lg.sampleCost(ctx)
	elapsed, _ := lg.closedLoop(ctx, lg.base, &t, &started, dur, lg.o.maxTasks, func() ([]byte, bool) { return body, true })
	c.add(before, lg.sampleCost(ctx))
	t.into(r, elapsed)
	r.PerTask = c.perTask(r.Completed)
	r.Notes = append(r.Notes, fmt.Sprintf("%d clients re-submitting one solved puzzle for %s (POST answers 200 from the cache)",
		lg.o.clients, dur))
	return r, nil
}

// rawRig is bare asynq with no-op tasks in Redis DB 1: the same number of
// servers, concurrency and check interval as our workers, and at most
// -clients tasks in flight like the closed-loop clients. The handler
// counts completions.
type rawRig struct {
	addr                    string
	servers                 []*asynq.Server
	client                  *asynq.Client
	tokens                  chan struct{}
	done, lastDone          atomic.Int64
	started, enqueued, errs atomic.Int64
	firstErr                atomic.Value
	latMu                   sync.Mutex
	lat                     []time.Duration
	busy                    time.Duration
}

const rawQueue = "loadgen-noop"

func (lg *loadgen) newRawRig() (_ *rawRig, err error) {
	rg := &rawRig{addr: lg.st.Redis.Addr, tokens: make(chan struct{}, lg.o.clients)}
	defer func() {
		if err != nil {
			rg.close()
		}
	}()
	opt := asynq.RedisClientOpt{Addr: rg.addr, DB: 1}
	mux := asynq.NewServeMux()
	mux.HandleFunc("noop", func(_ context.Context, t *asynq.Task) error {
		now := time.Now()
		if p := t.Payload(); len(p) == 8 {
			d := time.Duration(now.UnixNano() - int64(binary.BigEndian.Uint64(p)))
			rg.latMu.Lock()
			rg.lat = append(rg.lat, d)
			rg.latMu.Unlock()
		}
		rg.lastDone.Store(now.UnixNano())
		rg.done.Add(1)
		<-rg.tokens
		return nil
	})
	for range lg.o.workers {
		s := asynq.NewServer(opt, asynq.Config{
			Concurrency: lg.rep.Concurrency, Queues: map[string]int{rawQueue: 1}, TaskCheckInterval: lg.o.checkInterval,
			LogLevel: asynq.FatalLevel, ShutdownTimeout: 5 * time.Second,
		})
		if err := s.Start(mux); err != nil {
			return nil, err
		}
		rg.servers = append(rg.servers, s)
	}
	rg.client = asynq.NewClient(opt)
	return rg, nil
}

// slice enqueues for dur, then waits (up to 30s) until every enqueued
// task has run; the slice's time ends at the last completion.
func (rg *rawRig) slice(ctx context.Context, dur time.Duration, maxTasks int) {
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(dur)
	for range cap(rg.tokens) {
		wg.Go(func() {
			pprof.Do(ctx, clientLabels, func(ctx context.Context) { rg.enqueueLoop(ctx, deadline, maxTasks) })
		})
	}
	wg.Wait()
	rg.settle(ctx, start)
}

func (rg *rawRig) enqueueLoop(ctx context.Context, deadline time.Time, maxTasks int) {
	for range 10_000_000 {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return
		}
		if maxTasks > 0 && rg.started.Add(1) > int64(maxTasks) {
			return
		}
		select { // at most -clients tasks in flight
		case rg.tokens <- struct{}{}:
		case <-time.After(time.Until(deadline)):
			return
		}
		var p [8]byte
		binary.BigEndian.PutUint64(p[:], uint64(time.Now().UnixNano()))
		if _, err := rg.client.EnqueueContext(ctx, asynq.NewTask("noop", p[:]), asynq.Queue(rawQueue)); err != nil {
			<-rg.tokens
			rg.errs.Add(1)
			rg.firstErr.CompareAndSwap(nil, err.Error())
			continue
		}
		rg.enqueued.Add(1)
	}
}

// settle waits (up to 30s) until every enqueued task has run, and adds
// the time from start to the last completion to the rig's busy time.
func (rg *rawRig) settle(ctx context.Context, start time.Time) {
	for wait := time.Now().Add(30 * time.Second); rg.done.Load() < rg.enqueued.Load() && time.Now().Before(wait); {
		sleepCtx(ctx, time.Millisecond)
	}
	if last := time.Unix(0, rg.lastDone.Load()); last.After(start) {
		rg.busy += last.Sub(start)
	}
}

func (rg *rawRig) result(r *Result) {
	r.Submitted, r.Completed, r.Errors = int(rg.enqueued.Load()), int(rg.done.Load()), int(rg.errs.Load())
	r.Failed = r.Submitted - r.Completed
	if e, ok := rg.firstErr.Load().(string); ok {
		r.FirstError = e
	}
	r.DurationSec = rg.busy.Seconds()
	if rg.busy > 0 {
		r.SubmitRate = float64(r.Submitted) / rg.busy.Seconds()
		r.CompleteRate = float64(r.Completed) / rg.busy.Seconds()
	}
	rg.latMu.Lock()
	r.Latency = percentiles(rg.lat)
	rg.latMu.Unlock()
}

func (rg *rawRig) close() {
	for _, s := range rg.servers {
		s.Shutdown()
	}
	if rg.client != nil {
		rg.client.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: rg.addr, DB: 1})
	defer rdb.Close()
	rdb.FlushDB(ctx)
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

	var created apitype.BatchCreated
	before := lg.sampleCost(ctx)
	t0 := time.Now()
	if _, err := lg.do(ctx, http.MethodPost, "/v1/batches", body, &created); err != nil {
		return nil, err
	}
	to202 := time.Since(t0)
	at202 := lg.sampleCost(ctx)
	var st apitype.Batch
	for i := 0; i < maxBatchPolls && !st.Done; i++ {
		if _, err := lg.do(ctx, http.MethodGet, "/v1/batches/"+created.ID+"?limit=1&wait="+batchWait, nil, &st); err != nil {
			return nil, err
		}
	}
	toDone := time.Since(t0)
	var c costSum
	c.add(before, lg.sampleCost(ctx))
	r.PerTask = c.perTask(st.Counts.Completed)
	r.Submitted = created.Total
	r.Completed = st.Counts.Completed
	r.Failed = st.Counts.Failed + st.Counts.Canceled
	r.DurationSec = toDone.Seconds()
	r.SubmitRate = float64(created.Total) / to202.Seconds()
	r.CompleteRate = float64(r.Completed) / toDone.Seconds()
	if !st.Done {
		r.Errors++
		r.FirstError = fmt.Sprintf("batch not done after %d long polls of %s", maxBatchPolls, batchWait)
	}
	r.Batch = &BatchFigures{Items: created.Total, To202Ms: ms(to202), ToDoneMs: ms(toDone),
		ItemsPerSec: float64(r.Completed) / toDone.Seconds(), Counts: st.Counts,
		SubmitCPUMs: ms(at202.cpu - before.cpu)}
	if before.ok && at202.ok {
		r.Batch.SubmitRedisCPUMs = ms(at202.redisCPU - before.redisCPU)
	}
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
	st.StopWorkers()
	defer func() {
		st.StopWorkers()
		if err := startWorkers(st, lg.o.workers, lg.o.concurrency, lg.o.cheapConc, lg.o.checkInterval); err != nil && r.FirstError == "" {
			r.FirstError = "restart workers: " + err.Error()
		}
	}()
	// idleRate counts Redis commands/s and redis-server CPU over the idle
	// window, after start-up traffic has passed.
	idleRate := func() (float64, float64, error) {
		sleepCtx(ctx, 500*time.Millisecond)
		a := lg.sampleCost(ctx)
		t0 := time.Now()
		sleepCtx(ctx, lg.o.pickupIdle)
		b := lg.sampleCost(ctx)
		if !a.ok || !b.ok {
			return 0, 0, fmt.Errorf("read INFO from redis-server")
		}
		secs := time.Since(t0).Seconds()
		return float64(b.redisCmds-a.redisCmds-1) / secs, 100 * (b.redisCPU - a.redisCPU).Seconds() / secs, nil // -1: the INFO itself
	}
	base, baseCPU, err := idleRate()
	if err != nil {
		return nil, err
	}
	r.Pickup = append(r.Pickup, PickupRow{Interval: "none", IdleCommandsPerS: base, IdleRedisCPUPct: baseCPU})
	var all tally
	start := time.Now()
	for _, iv := range lg.o.pickup {
		st.StopWorkers()
		if err := startWorkers(st, 1, lg.o.concurrency, lg.o.cheapConc, iv); err != nil {
			return nil, err
		}
		rate, cpu, err := idleRate()
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
		r.Pickup = append(r.Pickup, PickupRow{Interval: iv.String(), Latency: percentiles(t.lat), IdleCommandsPerS: rate, IdleRedisCPUPct: cpu})
	}
	all.into(r, time.Since(start))
	r.Latency = nil
	r.Notes = append(r.Notes, "1 worker of concurrency "+strconv.Itoa(lg.rep.Concurrency)+" per interval; latency is submit to result with a random pause before each task; idle cmds/s from INFO total_commands_processed over "+lg.o.pickupIdle.String()+" (commands inside Lua scripts count too)")
	return r, nil
}
