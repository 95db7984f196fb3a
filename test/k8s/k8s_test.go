//go:build k8s

package k8s

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/client"
)

// TestCluster runs the stages in order on one cluster: each needs what
// the one before left (dev deployed, then promoted to prod, ...), so a
// failed stage stops the rest.
func TestCluster(t *testing.T) {
	o := newOracle()
	stages := []struct {
		name string
		f    func(t *testing.T)
	}{
		{"ServerSideChecks", testServerSideChecks},
		{"Dev", func(t *testing.T) { testDev(t, o) }},
		{"PromoteDevToProd", func(t *testing.T) { testPromote(t, o) }},
		{"Hardening", testHardening},
		{"ProdSmall", testProdSmall},
		{"WorkerKilledMidBatch", func(t *testing.T) { testWorkerKilled(t, o) }},
		{"RollingRestart", func(t *testing.T) { testRollingRestart(t, o) }},
		{"Disruptions", testDisruptions},
		{"KEDAScales", func(t *testing.T) { testKEDA(t, o) }},
	}
	for _, s := range stages {
		if !t.Run(s.name, s.f) {
			t.Fatalf("stage %s failed; the later stages need it", s.name)
		}
	}
}

// testServerSideChecks: every overlay passes the API server's own
// validation, admission (Pod Security "restricted", enforced) and KEDA's
// CRD schema, with warnings counted as errors.
func testServerSideChecks(t *testing.T) {
	clusterCmd(t, "check")
	labels := kubectl(t, "get", "ns", ns, "-o", "jsonpath={.metadata.labels}")
	if !strings.Contains(labels, `"pod-security.kubernetes.io/enforce":"restricted"`) {
		t.Fatalf("namespace %s does not enforce restricted: %s", ns, labels)
	}
	// The checks can fail: the same overlays, each broken in one way the
	// API server (and not our decoding) must catch.
	for _, c := range []struct{ overlay, from, to, want string }{
		{"dev", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true", "PodSecurity"},
		{"prod", "maxReplicaCount: 20", `maxReplicaCount: "20"`, "maxReplicaCount"},
		{"prod-hpa", "averageUtilization: 70", "averageUtilization: -1", "averageUtilization"},
	} {
		rendered := kubectl(t, "kustomize", repo+"/deploy/k8s/overlays/"+c.overlay)
		if !strings.Contains(rendered, c.from) {
			t.Fatalf("%s has no %q to break", c.overlay, c.from)
		}
		f := t.TempDir() + "/broken.yaml"
		if err := os.WriteFile(f, []byte(strings.Replace(rendered, c.from, c.to, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := kubectlErr("apply", "--dry-run=server", "--warnings-as-errors", "-f", f)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s with %q: the server-side check said %v, want an error naming %s", c.overlay, c.to, err, c.want)
		} else {
			t.Logf("%s with %q refused: %.200s", c.overlay, c.to, err)
		}
	}
}

// testDev: the dev overlay comes up Ready; single tasks and a 10,000-item
// batch sent to the api Service come back with exact answers.
func testDev(t *testing.T, o *oracle) {
	d := deploy(t, "dev")
	figure(t, "dev Ready %.1fs after kubectl apply", d.Seconds())
	checkAuth(t)
	c := api(t)
	submitAndCheck(t, c, o, append(eightPuzzles(20, 1), fifteenPuzzles(5, 30, 2)...))

	reqs := eightPuzzles(10000, 3)
	start := time.Now()
	sub, err := c.SubmitBatch(context.Background(), raw(reqs))
	if err != nil {
		t.Fatal(err)
	}
	waitBatch(t, c, sub.ID, 5*time.Minute)
	figure(t, "dev: 10,000-item batch done %.1fs after submission (1 worker)", time.Since(start).Seconds())
	checkBatch(t, c, o, sub.ID, reqs)
	devBatch = sub.ID
	devReqs = reqs
}

// checkAuth: the api runs with the keys Secret (auth on, as every
// overlay is): /v1 without a key is 401, the dashboard needs an operator
// key, and /metrics answers only on METRICS_ADDR (9090, which the
// Service does not expose), without a key.
func checkAuth(t *testing.T) {
	t.Helper()
	svc := "http://" + kubectl(t, "-n", ns, "get", "svc", "api", "-o", "jsonpath={.spec.clusterIP}")
	pod := "http://" + kubectl(t, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=api",
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[0].status.podIP}")
	for _, c := range []struct {
		url, key string
		want     int
	}{
		{svc + "/v1/tasks", "", http.StatusUnauthorized},
		{svc + "/v1/tasks", apiKey(t, "tenant"), http.StatusOK},
		{svc + "/monitoring/", apiKey(t, "tenant"), http.StatusForbidden},
		{svc + "/monitoring/", apiKey(t, "operator"), http.StatusOK},
		// With METRICS_ADDR set, /metrics leaves the public port.
		{svc + "/metrics", apiKey(t, "operator"), http.StatusNotFound},
		{pod + ":9090/metrics", "", http.StatusOK},
	} {
		req, _ := http.NewRequest(http.MethodGet, c.url, nil)
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", c.url, err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("GET %s (key: %v): %d, want %d", c.url, c.key != "", resp.StatusCode, c.want)
		}
	}
}

var (
	devBatch string
	devReqs  []string
)

// submitAndCheck submits each request alone, long-polls it and checks the
// answer.
func submitAndCheck(t *testing.T, c *client.Client, o *oracle, reqs []string) {
	t.Helper()
	ctx := context.Background()
	for _, r := range reqs {
		task, err := c.Submit(ctx, client.RawRequest([]byte(r)))
		if err != nil {
			t.Fatalf("submit %s: %v", r, err)
		}
		for !task.Terminal() {
			if task, err = c.Get(ctx, task.ID, 20*time.Second); err != nil {
				t.Fatalf("get %s: %v", task.ID, err)
			}
		}
		if task.State != client.StateCompleted {
			t.Fatalf("%s: %s %+v", r, task.State, task.Error)
		}
		if got, want := compact(task.Result), o.answer(t, r); string(got) != string(want) {
			t.Fatalf("%s: got %s, want %s", r, got, want)
		}
	}
}

// testPromote applies prod over the running dev install, as an operator
// promoting it would: it must apply (no immutable field differs), come up
// Ready, and keep Redis's data (the dev batch is still there).
func testPromote(t *testing.T, o *oracle) {
	if out, err := kubectlErr("apply", "--dry-run=server", "--warnings-as-errors", "-k", repo+"/deploy/k8s/overlays/prod"); err != nil {
		t.Fatalf("prod does not apply over dev: %v\n%s", err, out)
	}
	d := deploy(t, "prod")
	figure(t, "prod Ready %.1fs after kubectl apply over dev", d.Seconds())
	c := api(t)
	if got := len(livePodsOf(t, "api")); got != 3 {
		t.Fatalf("prod runs %d api pods, want 3", got)
	}
	if devBatch != "" { // unset when this stage runs alone (-run)
		b, err := c.GetBatch(context.Background(), devBatch, "", 1, 0)
		if err != nil {
			t.Fatalf("the dev batch after promotion: %v", err)
		}
		if b.Counts.Completed != len(devReqs) {
			t.Fatalf("the dev batch after promotion: %+v", b.Counts)
		}
	}
	submitAndCheck(t, c, o, eightPuzzles(10, 4))
}

// testProdSmall applies test/k8s/overlays/prod-small over prod: the
// same manifests with worker requests and a paused KEDA that fit this
// node, for the stages that kill and roll pods.
func testProdSmall(t *testing.T) {
	d := deploy(t, "test/k8s/overlays/prod-small")
	if err := poll(2*time.Minute, func() error { return workerReplicas(t, 2) }); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "-n", ns, "rollout", "status", "deploy/worker", "--timeout=3m")
	figure(t, "prod-small (prod, workers paused at 2) Ready %.1fs after kubectl apply over prod", d.Seconds())
}

// testWorkerKilled force-deletes a worker pod (SIGKILL, no grace) while a
// batch runs: every item must still complete once, with its exact answer.
func testWorkerKilled(t *testing.T, o *oracle) {
	c := api(t)
	ctx := context.Background()
	// Enough 15-puzzle searches (about 15 ms each here) that the batch
	// outlives the kill by far.
	reqs := append(fifteenPuzzles(1200, 200, runSeed+5), eightPuzzles(5000, 6)...)
	o.prefetch(reqs)
	start := time.Now()
	sub, err := c.SubmitBatch(ctx, raw(reqs))
	if err != nil {
		t.Fatal(err)
	}
	// Kill once some of the batch is done and some is running.
	var victim string
	if err := poll(2*time.Minute, func() error {
		b, err := c.GetBatch(ctx, sub.ID, "", 1, 0)
		if err != nil {
			return err
		}
		if b.Done {
			return errors.New("batch ended before the kill; make it larger")
		}
		if b.Counts.Completed < 200 || b.Counts.Active == 0 {
			return fmt.Errorf("not yet: %+v", b.Counts)
		}
		pods := livePodsOf(t, "worker")
		if len(pods) == 0 {
			return errors.New("no worker")
		}
		victim = pods[0]
		t.Logf("killing %s at %+v", victim, b.Counts)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	kubectl(t, "-n", ns, "delete", "pod", victim, "--force", "--grace-period=0")
	// The kill must have cut the batch short, or it proves nothing.
	if b, err := c.GetBatch(ctx, sub.ID, "", 1, 0); err != nil || b.Done {
		t.Fatalf("batch after the kill: done=%v err=%v: the kill came too late to test anything", b != nil && b.Done, err)
	} else {
		t.Logf("just after the kill: %+v", b.Counts)
	}
	b := waitBatch(t, c, sub.ID, 10*time.Minute)
	figure(t, "worker force-deleted mid-batch: batch of %d done %.1fs after the kill (%.1fs in all), counts %+v",
		len(reqs), time.Since(killedAt).Seconds(), time.Since(start).Seconds(), b.Counts)
	checkBatch(t, c, o, sub.ID, reqs)
}

// testRollingRestart restarts the api Deployment and then the workers
// while clients submit tasks and long-poll them: no request may fail and
// every task must complete with its exact answer.
func testRollingRestart(t *testing.T, o *oracle) {
	// Clients go on until both restarts are over (at most 20,000 tasks);
	// every eighth task is a 15-puzzle search, so workers are mid-task
	// when they get SIGTERM.
	reqs := eightPuzzles(17500, 7)
	for i, r := range fifteenPuzzles(2500, 200, runSeed+17) {
		reqs = append(reqs[:i*8+7], append([]string{r}, reqs[i*8+7:]...)...)
	}
	var (
		next, failed, retried, done atomic.Int64
		mu                          sync.Mutex
		errs                        []string
		results                     = map[int][]byte{}
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	c := api(t, client.WithRetryHook(func(attempt int, err error, wait time.Duration) { retried.Add(1) }))
	ctx := context.Background()
	fail := func(format string, args ...any) {
		failed.Add(1)
		mu.Lock()
		if len(errs) < 20 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
		mu.Unlock()
	}
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := int(next.Add(1)) - 1
				if i >= len(reqs) {
					return
				}
				task, err := c.Submit(ctx, client.RawRequest([]byte(reqs[i])))
				if err != nil {
					fail("submit %d: %v", i, err)
					continue
				}
				for !task.Terminal() {
					id := task.ID
					if task, err = c.Get(ctx, id, 10*time.Second); err != nil {
						fail("get %s: %v", id, err)
						break
					}
				}
				if err != nil {
					continue
				}
				if task.State != client.StateCompleted {
					fail("task %d: %s %+v", i, task.State, task.Error)
					continue
				}
				mu.Lock()
				results[i] = compact(task.Result)
				mu.Unlock()
				done.Add(1)
			}
		}()
	}
	for _, d := range []string{"api", "worker"} {
		start := time.Now()
		kubectl(t, "-n", ns, "rollout", "restart", "deploy/"+d)
		kubectl(t, "-n", ns, "rollout", "status", "deploy/"+d, "--timeout=5m")
		figure(t, "rolling restart of %s: %.1fs, %d tasks done so far, %d failed requests, %d client retries",
			d, time.Since(start).Seconds(), done.Load(), failed.Load(), retried.Load())
	}
	close(stop)
	wg.Wait()
	figure(t, "rolling restarts under load: %d tasks submitted and completed exactly, %d failed requests, %d client retries",
		done.Load(), failed.Load(), retried.Load())
	if failed.Load() > 0 {
		t.Fatalf("%d failed requests during the rolling restarts: %s", failed.Load(), strings.Join(errs, " | "))
	}
	if done.Load() == 0 {
		t.Fatal("no task completed during the restarts")
	}
	// The answers are checked after the load, so that the local solves do
	// not slow the clients.
	var solved []string
	for i := range results {
		solved = append(solved, reqs[i])
	}
	o.solveAll(solved, true)
	for i, got := range results {
		if want := o.answer(t, reqs[i]); string(got) != string(want) {
			t.Errorf("task %d (%s): got %s, want %s", i, reqs[i], got, want)
		}
	}
}

// poll retries f every 250 ms until it succeeds or d passes.
func poll(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %w", d, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
