package store_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
)

// TestConfirmedWrites runs a master with one replica and a store with
// AckReplicas 1: a submission is confirmed while the replica follows,
// fails with ErrNotReplicated within the ack timeout (plus 0.5 s) while
// the replica is frozen (SIGSTOP), and is confirmed again at once after
// SIGCONT; ConnectedReplicas follows.
func TestConfirmedWrites(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.Start(t, redistest.ReplicaOf(master.Addr)...)
	rc := replica.Client(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, _ := rc.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not sync: %s", info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	const timeout = 300 * time.Millisecond
	s := store.New(master.Client(t), store.Options{Prefix: "acks:", TaskTTL: time.Hour, ResultTTL: time.Hour,
		AckReplicas: 1, AckTimeout: timeout})
	ctx := context.Background()
	submit := func(id string) (time.Duration, error) {
		start := time.Now()
		_, _, err := s.SubmitTask(ctx, store.NewTask{ID: id, Kind: "sliding", CacheKey: "k" + id}, 0)
		return time.Since(start), err
	}
	if d, err := submit("a"); err != nil || d > timeout {
		t.Fatalf("submission with the replica following: %v after %v", err, d)
	}
	// The record is on the replica when the submission returns.
	if n, err := rc.Exists(ctx, "acks:task:a").Result(); err != nil || n != 1 {
		t.Fatalf("the confirmed record on the replica: %d %v", n, err)
	}
	if n := replicasWithin(t, s, 1, 5*time.Second); n != 1 {
		t.Fatalf("ConnectedReplicas with the replica following: %d, want 1", n)
	}

	if err := replica.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer replica.Signal(syscall.SIGCONT)
	if d, err := submit("b"); !errors.Is(err, store.ErrNotReplicated) || d > timeout+500*time.Millisecond {
		t.Errorf("submission with the replica frozen: %v after %v, want ErrNotReplicated within %v", err, d, timeout+500*time.Millisecond)
	}
	start := time.Now()
	if err := s.Confirm(ctx); !errors.Is(err, store.ErrNotReplicated) || time.Since(start) > timeout+500*time.Millisecond {
		t.Errorf("Confirm with the replica frozen: %v after %v", err, time.Since(start))
	}
	// The frozen replica stops counting once its lag passes the limit.
	if n := replicasWithin(t, s, 0, 6*time.Second); n != 0 {
		t.Errorf("ConnectedReplicas 6 s into the freeze: %d, want 0", n)
	}

	if err := replica.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if d, err := submit("c"); err != nil || d > timeout {
		t.Errorf("submission right after SIGCONT: %v after %v", err, d)
	}
	if n := replicasWithin(t, s, 1, 5*time.Second); n != 1 {
		t.Errorf("ConnectedReplicas after SIGCONT: %d, want 1", n)
	}
	// The unconfirmed submission took on the master and reached the
	// replica once it ran again.
	if n, err := rc.Exists(ctx, "acks:task:b").Result(); err != nil || n != 1 {
		t.Errorf("the unconfirmed record on the replica after SIGCONT: %d %v", n, err)
	}
}

// replicasWithin polls ConnectedReplicas until it reports want or wait
// has passed, and returns the last count: a replica's lag is read from its
// once-a-second acknowledgements, so the count follows a change within a
// second or two, later on a loaded machine.
func replicasWithin(t *testing.T, s *store.Store, want int, wait time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		n, err := s.ConnectedReplicas(context.Background())
		if err != nil {
			t.Fatalf("ConnectedReplicas: %v", err)
		}
		if n == want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}
