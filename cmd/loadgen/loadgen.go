package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Scenario names, in the order "all" runs them.
var allScenarios = []string{"single", "throughput", "raw-asynq", "pipeline-floor", "cache", "batch", "pickup"}

type options struct {
	scenarios     []string
	server        string
	workers       int
	concurrency   int
	cheapConc     int
	checkInterval time.Duration
	singleN       int
	clients       int
	duration      time.Duration
	rounds        int
	maxTasks      int
	batchSize     int
	pickup        []time.Duration
	pickupSamples int
	pickupIdle    time.Duration
	json          bool
	cpuProfile    string
	memProfile    string
	seed          uint64
	logLevel      string
	submitWait    bool
	serveFloor    string
	floorRedis    string
}

func parseOptions(args []string, out io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(out)
	scen := fs.String("scenario", "all", "comma-separated scenarios: all or "+strings.Join(allScenarios, ","))
	fs.StringVar(&o.server, "server", "", "base URL of a running API on 127.0.0.1 (default: start our own stack)")
	fs.IntVar(&o.workers, "workers", 1, "in-process workers to start")
	fs.IntVar(&o.concurrency, "concurrency", 0, "concurrency of each worker (0: GOMAXPROCS)")
	fs.IntVar(&o.cheapConc, "cheap-concurrency", 0, "CHEAP_CONCURRENCY of each worker: slots of the cheap lane, where 8-puzzles run (0: the worker's default)")
	fs.DurationVar(&o.checkInterval, "task-check-interval", 20*time.Millisecond, "TASK_CHECK_INTERVAL of the workers")
	fs.IntVar(&o.singleN, "single-n", 200, "sequential tasks of the single scenario")
	fs.IntVar(&o.clients, "clients", 32, "concurrent clients of throughput, raw-asynq, pipeline-floor and cache")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long throughput, raw-asynq and pipeline-floor run")
	fs.IntVar(&o.rounds, "rounds", 5, "alternating slices of throughput, raw-asynq and pipeline-floor when two or more run")
	fs.IntVar(&o.maxTasks, "tasks", 0, "stop throughput, raw-asynq and pipeline-floor after this many tasks (0: only -duration)")
	fs.IntVar(&o.batchSize, "batch-size", 10000, "items of the batch scenario")
	intervals := fs.String("pickup-intervals", "1s,100ms,20ms,5ms", "TASK_CHECK_INTERVAL values of the pickup scenario")
	fs.IntVar(&o.pickupSamples, "pickup-samples", 20, "sequential tasks per pickup interval")
	fs.DurationVar(&o.pickupIdle, "pickup-idle", 5*time.Second, "window over which idle Redis commands/s are counted")
	fs.BoolVar(&o.json, "json", false, "print JSON instead of a table")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole process (client, API and workers) here")
	fs.StringVar(&o.memProfile, "memprofile", "", "write the whole process's allocation profile here at the end (go tool pprof -sample_index=alloc_objects)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the puzzle order")
	fs.StringVar(&o.logLevel, "log-level", "error", "log level of the in-process API and workers")
	fs.BoolVar(&o.submitWait, "submit-wait", false, "clients submit with POST /v1/tasks?wait= (one request per task) instead of POST then GET ?wait=")
	fs.StringVar(&o.serveFloor, "serve-floor", "", "instead of load, serve the bare net/http + one Lua call floor on this loopback address (see floor.go), until interrupted")
	fs.StringVar(&o.floorRedis, "floor-redis", "127.0.0.1:6379", "the Redis of -serve-floor")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *scen == "all" {
		o.scenarios = allScenarios
	} else {
		for s := range strings.SplitSeq(*scen, ",") {
			s = strings.TrimSpace(s)
			if !slices.Contains(allScenarios, s) {
				return nil, fmt.Errorf("-scenario: unknown %q (want all or %s)", s, strings.Join(allScenarios, ","))
			}
			o.scenarios = append(o.scenarios, s)
		}
	}
	for s := range strings.SplitSeq(*intervals, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d < time.Millisecond || d > time.Minute {
			return nil, fmt.Errorf("-pickup-intervals: %q is not a duration between 1ms and 1m", s)
		}
		o.pickup = append(o.pickup, d)
	}
	switch {
	case o.workers < 1 || o.workers > 64:
		return nil, fmt.Errorf("-workers: must be 1..64")
	case o.concurrency < 0 || o.concurrency > 1024:
		return nil, fmt.Errorf("-concurrency: must be 0..1024")
	case o.cheapConc < 0 || o.cheapConc > 256:
		return nil, fmt.Errorf("-cheap-concurrency: must be 0..256")
	case o.singleN < 1 || o.singleN > 100000:
		return nil, fmt.Errorf("-single-n: must be 1..100000")
	case o.clients < 1 || o.clients > 1024:
		return nil, fmt.Errorf("-clients: must be 1..1024")
	case o.duration <= 0 || o.duration > time.Hour:
		return nil, fmt.Errorf("-duration: must be positive and at most 1h")
	case o.rounds < 1 || o.rounds > 100:
		return nil, fmt.Errorf("-rounds: must be 1..100")
	case o.maxTasks < 0:
		return nil, fmt.Errorf("-tasks: must not be negative")
	case o.batchSize < 1 || o.batchSize > 10000:
		return nil, fmt.Errorf("-batch-size: must be 1..10000 (the API's MAX_BATCH_ITEMS)")
	case o.pickupSamples < 1 || o.pickupSamples > 10000:
		return nil, fmt.Errorf("-pickup-samples: must be 1..10000")
	case o.pickupIdle <= 0 || o.pickupIdle > time.Minute:
		return nil, fmt.Errorf("-pickup-idle: must be positive and at most 1m")
	}
	if o.server != "" {
		if err := checkLoopback(o.server); err != nil {
			return nil, err
		}
		o.server = strings.TrimRight(o.server, "/")
	}
	return o, nil
}

// checkLoopback refuses to send load anywhere but this machine.
func checkLoopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("-server: %q is not an http(s) URL", raw)
	}
	h := u.Hostname()
	if ip := net.ParseIP(h); h == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("-server: %q is not a loopback address; loadgen only sends load to this machine", h)
}

// run parses args, runs the scenarios and writes the report to stdout.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseOptions(args, stdout)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if o.serveFloor != "" {
		if err := checkLoopback("http://" + o.serveFloor); err != nil {
			return err
		}
		return serveFloor(ctx, o.serveFloor, o.floorRedis)
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if o.memProfile != "" {
		defer func() {
			f, err := os.Create(o.memProfile)
			if err != nil {
				fmt.Fprintf(os.Stderr, "loadgen: memprofile: %v\n", err)
				return
			}
			defer f.Close()
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				fmt.Fprintf(os.Stderr, "loadgen: memprofile: %v\n", err)
			}
		}()
	}
	rep := &Report{
		Started: time.Now().UTC(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU(),
		Workers: o.workers, Concurrency: o.concurrency, TaskCheckInterval: o.checkInterval.String(), Clients: o.clients,
		Server: o.server,
	}
	if rep.Concurrency == 0 {
		rep.Concurrency = runtime.GOMAXPROCS(0)
	}
	lg := &loadgen{o: o, pool: newPool(o.seed), rep: rep}
	if o.server == "" {
		rep.Stack = fmt.Sprintf("one process: redis-server child, API and %d in-process worker(s) of concurrency %d", o.workers, rep.Concurrency)
		st, err := startStack(o)
		if err != nil {
			return err
		}
		defer st.Close()
		lg.st = st
		lg.base = st.URL
	} else {
		rep.Stack = "external API at " + o.server
		lg.base = o.server
	}
	lg.http = newHTTP(o.clients)
	defer lg.http.CloseIdleConnections()
	if err := lg.ready(ctx); err != nil {
		return err
	}
	var paired map[string]*Result // throughput, raw-asynq and pipeline-floor run together
	for _, name := range o.scenarios {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var res *Result
		load0 := loadAvg1()
		if name == "throughput" || name == "raw-asynq" || name == "pipeline-floor" {
			if paired == nil {
				if paired, err = lg.alternated(ctx, slices.Contains(o.scenarios, "throughput"), slices.Contains(o.scenarios, "raw-asynq"),
					slices.Contains(o.scenarios, "pipeline-floor")); err != nil {
					return fmt.Errorf("scenario %s: %w", name, err)
				}
			}
			res = paired[name]
		} else if res, err = lg.runScenario(ctx, name); err != nil {
			return fmt.Errorf("scenario %s: %w", name, err)
		}
		if res.LoadAvg == [2]float64{} {
			res.LoadAvg = [2]float64{load0, loadAvg1()}
		}
		rep.Results = append(rep.Results, res)
	}
	rep.finish()
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.writeTable(stdout)
}

// pool hands out distinct solvable 8-puzzle boards in a seeded random
// order, each at most once per run, so no submission hits the cache.
type pool struct {
	boards [][9]int8
	next   atomic.Int64
}

func newPool(seed uint64) *pool {
	p := &pool{boards: make([][9]int8, 0, 181440)}
	a := [9]int8{0, 1, 2, 3, 4, 5, 6, 7, 8}
	var permute func(k int)
	permute = func(k int) {
		if k == len(a) {
			if solvable(a) {
				p.boards = append(p.boards, a)
			}
			return
		}
		for i := k; i < len(a); i++ {
			a[k], a[i] = a[i], a[k]
			permute(k + 1)
			a[k], a[i] = a[i], a[k]
		}
	}
	permute(0)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	r.Shuffle(len(p.boards), func(i, j int) { p.boards[i], p.boards[j] = p.boards[j], p.boards[i] })
	return p
}

// solvable: on a 3x3 board the goal (1..8, blank last) is reachable
// exactly when the tiles, blank ignored, have an even number of inversions.
func solvable(a [9]int8) bool {
	inv := 0
	for i := range a {
		for j := i + 1; j < len(a); j++ {
			if a[i] != 0 && a[j] != 0 && a[i] > a[j] {
				inv++
			}
		}
	}
	return inv%2 == 0
}

// take returns the next unused board as a request body; false when all
// 181,440 have been used.
func (p *pool) take() ([]byte, bool) {
	i := p.next.Add(1) - 1
	if i >= int64(len(p.boards)) {
		return nil, false
	}
	return requestBody(p.boards[i]), true
}

func (p *pool) remaining() int { return max(0, len(p.boards)-int(p.next.Load())) }

func requestBody(b [9]int8) []byte {
	return fmt.Appendf(nil, `{"kind":"sliding","puzzle":{"board":[[%d,%d,%d],[%d,%d,%d],[%d,%d,%d]]}}`,
		b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8])
}
