//go:build k8s

package k8s

import (
	"context"
	"testing"
	"time"
)

// testKEDA applies the keda-fast overlay (prod with a 15 s scale-down
// window) and sends a bulk job large enough that KEDA's redis trigger on
// the bulk queue's pending list asks for more workers: the Deployment
// must grow from 1, the new workers must become Ready and take work, and
// after the job drains it must shrink back to 1.
func testKEDA(t *testing.T, o *oracle) {
	if deps, err := kubectlErr("-n", "keda", "get", "deploy", "-o", "name"); err != nil || deps == "" {
		t.Fatalf("KEDA is not installed (cluster up -keda, or cluster keda on a running cluster): %v", err)
	}
	deploy(t, "test/k8s/overlays/keda-fast")
	if err := poll(3*time.Minute, func() error { return workerReplicas(t, 1) }); err != nil {
		t.Fatalf("workers do not settle at minReplicaCount 1: %v", err)
	}
	c := api(t)
	// 15-puzzles of about 15 ms of CPU each here: minutes of work for one
	// worker, far over the bulk trigger's listLength of 50.
	reqs := fifteenPuzzles(2500, 200, runSeed+8)
	o.prefetch(reqs)
	start := time.Now()
	sub, err := c.SubmitBatch(context.Background(), raw(reqs))
	if err != nil {
		t.Fatal(err)
	}
	var scaledAt, readyAt time.Duration
	peak := 1
	for time.Since(start) < 10*time.Minute {
		spec := atoi(kubectl(t, "-n", ns, "get", "deploy/worker", "-o", "jsonpath={.spec.replicas}"))
		ready := atoi(kubectl(t, "-n", ns, "get", "deploy/worker", "-o", "jsonpath={.status.readyReplicas}"))
		peak = max(peak, spec)
		if spec > 1 && scaledAt == 0 {
			scaledAt = time.Since(start)
			t.Logf("KEDA asked for %d workers %.1fs after the submission", spec, scaledAt.Seconds())
		}
		if ready > 1 && readyAt == 0 {
			readyAt = time.Since(start)
		}
		b, err := c.GetBatch(context.Background(), sub.ID, "", 1, 0)
		if err == nil && b.Done {
			break
		}
		time.Sleep(time.Second)
	}
	drained := time.Since(start)
	if scaledAt == 0 {
		t.Fatalf("the workers never scaled above 1 while %d bulk tasks waited", len(reqs))
	}
	downStart := time.Now()
	if err := poll(5*time.Minute, func() error { return workerReplicas(t, 1) }); err != nil {
		t.Fatalf("workers did not scale back down to 1 after the job drained: %v", err)
	}
	figure(t, "KEDA: %d 15-puzzle bulk tasks; scale-up decision %.1fs after submission, a 2nd worker Ready at %.1fs, peak %d replicas; drained at %.1fs; back to 1 replica %.1fs after draining",
		len(reqs), scaledAt.Seconds(), readyAt.Seconds(), peak, drained.Seconds(), time.Since(downStart).Seconds())
	checkBatch(t, c, o, sub.ID, reqs)
}

func workerReplicas(t *testing.T, want int) error {
	spec := atoi(kubectl(t, "-n", ns, "get", "deploy/worker", "-o", "jsonpath={.spec.replicas}"))
	if spec != want {
		return errorf("worker spec.replicas=%d, want %d", spec, want)
	}
	return nil
}
