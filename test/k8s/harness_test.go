//go:build k8s

package k8s

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/client"
	"github.com/puzzleq/puzzleq/internal/app"
	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/puzzle"
)

// The driver's paths; the same defaults as test/k8s/tools/cluster.
var (
	repo       string
	cacheDir   = envOr("PUZZLEQ_K8S_CACHE", "/var/cache/puzzleq-k8s")
	stateDir   = envOr("PUZZLEQ_K8S_STATE", "/var/lib/puzzleq-k8s")
	driver     string
	kubeconfig string
)

const ns = "puzzleq"

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Println("k8s: skipped: the test cluster needs root (containerd, bridges, iptables)")
		return 0
	}
	wd, _ := os.Getwd()
	repo = filepath.Clean(filepath.Join(wd, "..", ".."))
	driver = filepath.Join(cacheDir, "bin", "cluster")
	kubeconfig = filepath.Join(stateDir, "pki", "admin.kubeconfig")
	build := exec.Command("go", "build", "-o", driver, "./cluster")
	build.Dir = filepath.Join(repo, "test", "k8s", "tools")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Println("k8s: cannot build the cluster driver:", err)
		return 1
	}
	if os.Getenv("PUZZLEQ_K8S_REUSE") == "" {
		up := exec.Command(driver, "up", "-keda")
		up.Dir = repo
		up.Stdout, up.Stderr = os.Stdout, os.Stderr
		if err := up.Run(); err != nil {
			fmt.Println("k8s: cluster up failed (it tore itself down):", err)
			return 1
		}
		defer func() {
			down := exec.Command(driver, "down")
			down.Stdout, down.Stderr = os.Stdout, os.Stderr
			if err := down.Run(); err != nil {
				fmt.Println("k8s: cluster down failed:", err)
				os.Exit(1)
			}
		}()
	}
	fmt.Printf("k8s: the searches' seed is %d (PUZZLEQ_K8S_SEED repeats it)\n", runSeed)
	return m.Run()
}

// kubectl runs the cluster's kubectl and fails the test on error.
func kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := kubectlErr(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func kubectlErr(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(cacheDir, "bin", "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// clusterCmd runs the driver (check, deploy, ...) with its output in the
// test log.
func clusterCmd(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command(driver, args...)
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	t.Logf("cluster %s:\n%s", strings.Join(args, " "), out)
	if err != nil {
		t.Fatalf("cluster %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// deploy applies an overlay and returns the time until every workload
// rolled out.
func deploy(t testing.TB, overlay string) time.Duration {
	t.Helper()
	start := time.Now()
	clusterCmd(t, "deploy", overlay)
	return time.Since(start)
}

// api is a client of the api Service, through its ClusterIP (kube-proxy's
// rules on this node), as another pod would reach it.
func api(t testing.TB, opts ...client.Option) *client.Client {
	t.Helper()
	ip := kubectl(t, "-n", ns, "get", "svc", "api", "-o", "jsonpath={.spec.clusterIP}")
	return client.New("http://"+ip, append([]client.Option{client.WithAPIKey(apiKey(t, "tenant"))}, opts...)...)
}

// apiKeys caches the driver's keys file once it has been read: every
// client and check asks for a key, and the file does not change while a
// cluster runs. A failed read is not cached (cluster check makes it).
var apiKeys struct {
	mu   sync.Mutex
	keys []struct{ Name, Key, Role string }
}

func loadAPIKeys() ([]struct{ Name, Key, Role string }, error) {
	apiKeys.mu.Lock()
	defer apiKeys.mu.Unlock()
	if apiKeys.keys != nil {
		return apiKeys.keys, nil
	}
	b, err := os.ReadFile(filepath.Join(stateDir, "api-keys.json"))
	if err != nil {
		return nil, err
	}
	var keys []struct{ Name, Key, Role string }
	if err := json.Unmarshal(b, &keys); err != nil {
		return nil, err
	}
	apiKeys.keys = keys
	return keys, nil
}

// apiKey returns the first key of role ("tenant" or "operator") in the
// Secret the driver made for the api (cluster's ensureAPIKeys): every
// overlay runs with auth on.
func apiKey(t testing.TB, role string) string {
	t.Helper()
	keys, err := loadAPIKeys()
	if err != nil {
		t.Fatalf("the api's keys (made by cluster check or deploy): %v", err)
	}
	for _, k := range keys {
		if k.Role == role || (role == "tenant" && k.Role == "") {
			return k.Key
		}
	}
	t.Fatalf("no %s key in the api's keys", role)
	return ""
}

// figure prints a measured figure in a form CI's log filter keeps.
func figure(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	t.Log("FIGURES: " + msg)
	fmt.Println("FIGURES: " + msg)
}

// oracle solves requests locally, with the same puzzle package the
// workers run, so every answer the cluster gives is checked exactly.
type oracle struct {
	mu   sync.Mutex
	want map[string][]byte
}

func newOracle() *oracle { return &oracle{want: map[string][]byte{}} }

func (o *oracle) answer(t testing.TB, req string) []byte {
	t.Helper()
	o.mu.Lock()
	w, ok := o.want[req]
	o.mu.Unlock()
	if ok {
		return w
	}
	w, err := solveLocal(req)
	if err != nil {
		t.Fatal(err)
	}
	o.mu.Lock()
	o.want[req] = w
	o.mu.Unlock()
	return w
}

// workerLimits are the limits of the deployed workers, which set none of
// their own: the local search gets the node budget they have, so that a
// random 15-puzzle they solve within SLIDING_MAX_NODES does not fail here
// for the solver's smaller default (one in a few thousand of the KEDA
// stage's boards did).
var workerLimits = app.DefaultLimits()

func solveLocal(req string) ([]byte, error) {
	p, err := puzzle.Decode([]byte(req))
	if err != nil {
		return nil, fmt.Errorf("decode %.80s: %w", req, err)
	}
	res, err := p.WithMaxNodes(workerLimits.MaxNodes[p.Kind()]).Solve(context.Background())
	if err != nil {
		return nil, fmt.Errorf("solve %.80s locally: %w", req, err)
	}
	return compact(res), nil
}

// prefetch solves reqs locally in the background, on two goroutines,
// while the cluster works on the same requests; answer then finds them.
func (o *oracle) prefetch(reqs []string) { o.solveAll(reqs, false) }

// solveAll solves reqs on two goroutines, waiting for them if wait.
func (o *oracle) solveAll(reqs []string, wait bool) {
	var next atomic.Int64
	var wg sync.WaitGroup
	defer func() {
		if wait {
			wg.Wait()
		}
	}()
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(reqs) {
					return
				}
				o.mu.Lock()
				_, ok := o.want[reqs[i]]
				o.mu.Unlock()
				if ok {
					continue
				}
				if w, err := solveLocal(reqs[i]); err == nil {
					o.mu.Lock()
					o.want[reqs[i]] = w
					o.mu.Unlock()
				}
			}
		}()
	}
}

func compact(b []byte) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return b
	}
	return buf.Bytes()
}

// eightPuzzles returns n distinct solvable 3x3 sliding requests.
func eightPuzzles(n int, seed int64) []string { return testgen.EightPuzzles(n, seed) }

// fifteenPuzzles returns n distinct 4x4 boards, each a random walk of
// walk moves from the goal.
// runSeed varies the searches of the kill, restart and KEDA stages from
// run to run: on a reused cluster (PUZZLEQ_K8S_REUSE) the same boards
// would be answered from the previous run's cache, and a batch that
// ends a second after a worker's kill proves nothing. It is printed, so
// a failing run can be repeated (PUZZLEQ_K8S_SEED).
var runSeed = func() int64 {
	if s, err := strconv.ParseInt(os.Getenv("PUZZLEQ_K8S_SEED"), 10, 64); err == nil {
		return s
	}
	return time.Now().UnixNano() % 1_000_000_000
}()

func fifteenPuzzles(n, walk int, seed int64) []string { return slidingWalks(n, 4, walk, seed) }

// slidingWalks returns n distinct size x size boards, each a random walk
// of walk moves from the goal: a search each (one task per item on the
// bulk queue, not a chunk), of a difficulty set by size and walk.
func slidingWalks(n, size, walk int, seed int64) []string {
	rng := rand.New(rand.NewSource(seed))
	cells := size * size
	seen := map[string]bool{}
	var out []string
	for len(out) < n {
		b := make([]int, cells)
		for i := range cells - 1 {
			b[i] = i + 1
		}
		blank, prev := cells-1, -1
		for range walk {
			r, c := blank/size, blank%size
			var next []int
			for _, d := range [][2]int{{-1, 0}, {1, 0}, {0, -1}, {0, 1}} {
				nr, nc := r+d[0], c+d[1]
				if nr >= 0 && nr < size && nc >= 0 && nc < size && nr*size+nc != prev {
					next = append(next, nr*size+nc)
				}
			}
			to := next[rng.Intn(len(next))]
			b[blank], b[to] = b[to], b[blank]
			prev, blank = blank, to
		}
		rows := make([]string, size)
		for r := range size {
			cs := make([]string, size)
			for c := range size {
				cs[c] = strconv.Itoa(b[r*size+c])
			}
			rows[r] = "[" + strings.Join(cs, ",") + "]"
		}
		req := `{"kind":"sliding","puzzle":{"board":[` + strings.Join(rows, ",") + `]}}`
		if seen[req] {
			continue
		}
		seen[req] = true
		out = append(out, req)
	}
	return out
}

func raw(reqs []string) client.BatchInput {
	out := make([]client.Request, len(reqs))
	for i, r := range reqs {
		out[i] = client.RawRequest([]byte(r))
	}
	return client.BatchOf(out...)
}

// waitBatch long-polls a batch until it is done or d passes.
func waitBatch(t testing.TB, c *client.Client, id string, d time.Duration) *client.Batch {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		b, err := c.GetBatch(ctx, id, "", 1, 25*time.Second)
		cancel()
		if err == nil && b.Done {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s not done after %s (last: %+v, err %v)", id, d, b, err)
		}
		if err != nil {
			t.Logf("batch %s: %v (retrying)", id, err)
			time.Sleep(time.Second)
		}
	}
}

// checkBatch pages through a done batch and checks every item's answer
// against the oracle, in submission order, and that the counts are exact.
func checkBatch(t testing.TB, c *client.Client, o *oracle, id string, reqs []string) {
	t.Helper()
	cursor, i := "", 0
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		b, err := c.GetBatch(ctx, id, cursor, 1000, 0)
		cancel()
		if err != nil {
			t.Fatalf("batch %s page at %d: %v", id, i, err)
		}
		if b.Total != len(reqs) || b.Counts.Completed != len(reqs) || b.Counts.Ended() != len(reqs) {
			t.Fatalf("batch %s: total %d counts %+v, want %d completed", id, b.Total, b.Counts, len(reqs))
		}
		for _, task := range b.Tasks {
			if i >= len(reqs) {
				t.Fatalf("batch %s: more tasks than the %d submitted", id, len(reqs))
			}
			if task.State != client.StateCompleted {
				t.Fatalf("batch %s item %d: state %s (%+v)", id, i, task.State, task.Error)
			}
			if got, want := compact(task.Result), o.answer(t, reqs[i]); !bytes.Equal(got, want) {
				t.Fatalf("batch %s item %d (%s): got %s, want %s", id, i, reqs[i], got, want)
			}
			i++
		}
		if b.NextCursor == nil || *b.NextCursor == "" {
			break
		}
		cursor = *b.NextCursor
	}
	if i != len(reqs) {
		t.Fatalf("batch %s: paged %d tasks, submitted %d", id, i, len(reqs))
	}
}

// livePodsOf returns the running pods of component that are not being
// deleted. A pod that is terminating stays Running through its preStop
// and grace period, so a count right after a rollout would include the
// old ReplicaSet's pods, a kill of one would prove nothing, and an
// eviction of one succeeds without asking its disruption budget: every
// check counts or picks only these.
func livePodsOf(t testing.TB, component string) []string {
	t.Helper()
	sel := "app.kubernetes.io/component=" + component
	out := kubectl(t, "-n", ns, "get", "pods", "-l", sel, "--field-selector=status.phase=Running", "-o",
		`jsonpath={range .items[*]}{.metadata.name}={.metadata.deletionTimestamp}{"\n"}{end}`)
	var live []string
	for _, l := range strings.Split(out, "\n") {
		if name, ts, ok := strings.Cut(l, "="); ok && name != "" && ts == "" {
			live = append(live, name)
		}
	}
	return live
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
