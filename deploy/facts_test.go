package deploy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/app"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/tasks"
)

// root is the repository root, relative to this package's directory.
const root = ".."

// facts are what the code says, learnt from the code itself: the routes a
// real API serves, the paths a running worker serves, the environment each
// binary reads, the Redis key asynq keeps each queue's pending tasks in,
// and the binaries the image holds.
type facts struct {
	apiRoutes  map[string]bool // "GET /readyz"
	apiEnv     map[string]bool
	workerEnv  map[string]bool
	workerURL  string
	workerSeen map[string]int      // path -> status, cached
	pendingKey map[string]string   // queue -> asynq's pending list key
	retryKey   map[string]string   // queue -> asynq's retry set key
	binDir     string              // where the image puts the binaries
	binaries   map[string]bool     // what scripts/build.sh builds
	load       map[string]loadFunc // binary -> its config loader
	// exampleKeysFile is a valid API_KEYS_FILE, standing in for the
	// Secret the manifests mount (the operator creates it).
	exampleKeysFile string
}

// loaded is the part of a binary's Config the checks need.
type loaded struct {
	HTTPAddr        string
	MetricsAddr     string        // the api's METRICS_ADDR; "" for the worker
	DrainTime       time.Duration // the api's DRAIN_TIME; 0 for the worker
	ShutdownTimeout time.Duration
	PDBDir, PDBSet  string // the worker's PDB_DIR and PDB_SET; "" for the api
}

type loadFunc func(env map[string]string) (loaded, error)

// newLoaders returns each server binary's own config loader.
func newLoaders() map[string]loadFunc {
	return map[string]loadFunc{
		"api": func(env map[string]string) (loaded, error) {
			c, err := app.LoadAPIConfig(nil, getenv(env), io.Discard)
			return loaded{c.HTTPAddr, c.MetricsAddr, c.DrainTime, c.ShutdownTimeout, "", ""}, err
		},
		"worker": func(env map[string]string) (loaded, error) {
			c, err := app.LoadWorkerConfig(nil, getenv(env), io.Discard)
			return loaded{c.HTTPAddr, "", 0, c.ShutdownTimeout, c.PDBDir, c.PDBSet}, err
		},
	}
}

func getenv(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

// newFacts starts a redis-server, a real API and a real worker on it.
func newFacts(t *testing.T) *facts {
	t.Helper()
	st := stacktest.Start(t, stacktest.Options{Workers: 1, Env: map[string]string{"LOG_LEVEL": "error"}})
	srv := st.Redis
	f := &facts{
		apiRoutes: map[string]bool{}, apiEnv: set(app.APIEnv()), workerEnv: set(app.WorkerEnv()),
		workerSeen: map[string]int{}, pendingKey: map[string]string{}, retryKey: map[string]string{},
		load: newLoaders(),
	}
	f.exampleKeysFile = filepath.Join(t.TempDir(), "keys.json")
	keys := `[{"name":"tenant","key":"0123456789abcdef0123"},{"name":"ops","key":"fedcba9876543210fedc","role":"operator"}]`
	if err := os.WriteFile(f.exampleKeysFile, []byte(keys), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, r := range st.API.Routes() {
		f.apiRoutes[r] = true
	}
	f.workerURL = "http://" + st.Workers[0].Addr()
	waitOK(t, f.workerURL+"/readyz")

	// asynq's pending list key of each queue, found by enqueueing a task
	// (in DB 1, away from the running worker) and looking for the list
	// that holds it.
	rdb := redistest.NewClient(&redis.Options{Addr: srv.Addr, DB: 1})
	defer rdb.Close()
	c := asynq.NewClientFromRedisClient(rdb)
	defer c.Close()
	for _, q := range slices.Concat(tasks.Queues, tasks.CheapQueues) {
		if _, err := c.Enqueue(asynq.NewTask("deploy:probe", nil), asynq.Queue(q)); err != nil {
			t.Fatal(err)
		}
		keys, err := rdb.Keys(context.Background(), "*"+q+"*pending*").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("pending list of queue %q: %v %v", q, keys, err)
		}
		if n, _ := rdb.LLen(context.Background(), keys[0]).Result(); n != 1 {
			t.Fatalf("%s holds %d tasks, want 1", keys[0], n)
		}
		f.pendingKey[q] = keys[0]
		// The retry set sits beside it (asynq's base.RetryKey): where a
		// failed delivery, and a task parked over its key's cap, wait.
		f.retryKey[q] = strings.TrimSuffix(keys[0], "pending") + "retry"
	}

	f.binDir, f.binaries = imageBinaries(t)
	return f
}

// workerServes reports whether the running worker serves GET path.
func (f *facts) workerServes(path string) bool {
	code, ok := f.workerSeen[path]
	if !ok {
		resp, err := http.Get(f.workerURL + path)
		if err != nil {
			return false
		}
		resp.Body.Close()
		code = resp.StatusCode
		f.workerSeen[path] = code
	}
	return code != http.StatusNotFound && code != http.StatusMethodNotAllowed
}

// serves reports whether binary serves GET path.
func (f *facts) serves(binary, path string) bool {
	switch binary {
	case "api":
		return f.apiRoutes["GET "+path]
	case "worker":
		return f.workerServes(path)
	}
	return false
}

func (f *facts) envKnown(binary string) map[string]bool {
	switch binary {
	case "api":
		return f.apiEnv
	case "worker":
		return f.workerEnv
	}
	return nil
}

func waitOK(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func set(names []string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

// dockerfile is what the checks read from the Dockerfile.
type dockerfile struct {
	buildRun   string // the RUN line that runs scripts/build.sh
	buildOut   string // its output directory
	finalFrom  string
	finalUser  string
	copyTarget string // where the final stage copies the binaries
	cmd        string
}

var (
	fromRe  = regexp.MustCompile(`(?i)^FROM\s+(\S+)(?:\s+AS\s+(\S+))?`)
	runRe   = regexp.MustCompile(`(?i)^RUN\s+(?:sh\s+)?(\./)?scripts/build\.sh\s+(\S+)$`)
	copyRe  = regexp.MustCompile(`(?i)^COPY\s+--from=(\S+)\s+(\S+)\s+(\S+)$`)
	outDirs = regexp.MustCompile(`-o\s+"\$out/"`)
)

func parseDockerfile(text string) (dockerfile, error) {
	var d dockerfile
	stages := 0
	var buildStage, runStage string // the stage being read, the one that runs scripts/build.sh
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if m := fromRe.FindStringSubmatch(line); m != nil {
			stages++
			d.finalFrom, d.finalUser, d.copyTarget, d.cmd = m[1], "", "", ""
			buildStage = m[2]
			continue
		}
		if m := runRe.FindStringSubmatch(line); m != nil {
			if d.buildRun != "" {
				return d, fmt.Errorf("more than one RUN of scripts/build.sh")
			}
			d.buildRun, d.buildOut, runStage = line, m[2], buildStage
			continue
		}
		if strings.Contains(line, "go build") {
			return d, fmt.Errorf("the Dockerfile runs go build itself (%q): keep the build line in scripts/build.sh", line)
		}
		if m := copyRe.FindStringSubmatch(line); m != nil {
			d.copyTarget = m[3]
			if runStage == "" || m[1] != runStage {
				return d, fmt.Errorf("COPY --from=%s: the binaries come from the stage that runs scripts/build.sh (%q)", m[1], runStage)
			}
			if strings.TrimSuffix(m[2], "/") != strings.TrimSuffix(d.buildOut, "/") {
				return d, fmt.Errorf("COPY --from=%s %s does not copy the build output %s", m[1], m[2], d.buildOut)
			}
			continue
		}
		up := strings.ToUpper(line)
		switch {
		case strings.HasPrefix(up, "USER "):
			d.finalUser = strings.TrimSpace(line[5:])
		case strings.HasPrefix(up, "CMD "), strings.HasPrefix(up, "ENTRYPOINT "):
			d.cmd = strings.TrimSpace(line[strings.IndexByte(line, ' '):])
		}
	}
	if stages < 2 {
		return d, fmt.Errorf("not a multi-stage build (%d FROM lines)", stages)
	}
	if d.buildRun == "" {
		return d, fmt.Errorf("no RUN line runs scripts/build.sh")
	}
	return d, nil
}

// imageBinaries returns where the image keeps its binaries and their
// names, from the Dockerfile and scripts/build.sh.
func imageBinaries(t *testing.T) (string, map[string]bool) {
	t.Helper()
	d, err := parseDockerfile(readFile(t, filepath.Join(root, "Dockerfile")))
	if err != nil {
		t.Fatal(err)
	}
	script := readFile(t, filepath.Join(root, "scripts", "build.sh"))
	if !outDirs.MatchString(script) {
		t.Fatalf("scripts/build.sh does not build into \"$out/\"")
	}
	bins := map[string]bool{}
	for _, m := range regexp.MustCompile(`\./cmd/([a-z0-9_-]+)`).FindAllStringSubmatch(script, -1) {
		bins[m[1]] = true
	}
	return strings.TrimSuffix(d.copyTarget, "/"), bins
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
