package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
)

// TestConfirmedWrites runs a master with one replica and a store with
// AckReplicas 1: a submission is confirmed while the replica follows,
// fails with ErrNotReplicated after one WAIT of the ack timeout while the
// replica is frozen (SIGSTOP), and is confirmed again at once after
// SIGCONT, by its first WAIT; ConnectedReplicas follows. What bounds a
// call's time is the WAITs it sends and their timeout, which the test
// reads off the client (waitLog); the wall clock of a loaded machine
// running -race is no measure of it.
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
	// The ack timeout is the time the replica has to answer a WAIT while
	// it follows: a loaded machine (go test -race of the module on 2
	// cores) has left it unanswered past 300 ms ("0 of 1 replicas
	// confirmed within 300ms"). The frozen replica's two refusals cost
	// the test one timeout each.
	const timeout = 2 * time.Second
	waits := &waitLog{}
	mc := master.Client(t)
	mc.AddHook(waits)
	s := store.New(mc, store.Options{Prefix: "acks:", TaskTTL: time.Hour, ResultTTL: time.Hour,
		AckReplicas: 1, AckTimeout: timeout})
	ctx := context.Background()
	submit := func(id string) (time.Duration, error) {
		start := time.Now()
		_, _, err := s.SubmitTask(ctx, store.NewTask{ID: id, Kind: "sliding", CacheKey: "k" + id}, 0)
		return time.Since(start), err
	}
	// oneWait checks that the call since the last check sent one WAIT,
	// for one replica, bounded by the ack timeout, and that it answered
	// confirmed replicas.
	oneWait := func(what string, confirmed int64) {
		t.Helper()
		got := waits.take()
		if len(got) != 1 || got[0].args != fmt.Sprintf("wait 1 %d", timeout.Milliseconds()) || got[0].reply != confirmed {
			t.Errorf("%s: WAITs sent %+v, want one \"wait 1 %d\" answered %d", what, got, timeout.Milliseconds(), confirmed)
		}
	}
	if d, err := submit("a"); err != nil {
		t.Fatalf("submission with the replica following: %v after %v", err, d)
	}
	waits.take() // the first submission's WAITs: once more after loading its script
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
	if d, err := submit("b"); !errors.Is(err, store.ErrNotReplicated) {
		t.Errorf("submission with the replica frozen: %v after %v, want ErrNotReplicated", err, d)
	}
	oneWait("submission with the replica frozen", 0)
	start := time.Now()
	if err := s.Confirm(ctx); !errors.Is(err, store.ErrNotReplicated) {
		t.Errorf("Confirm with the replica frozen: %v after %v", err, time.Since(start))
	}
	oneWait("Confirm with the replica frozen", 0)
	// The frozen replica stops counting once its lag passes the limit.
	if n := replicasWithin(t, s, 0, 6*time.Second); n != 0 {
		t.Errorf("ConnectedReplicas 6 s into the freeze: %d, want 0", n)
	}

	if err := replica.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if d, err := submit("c"); err != nil {
		t.Errorf("submission right after SIGCONT: %v after %v", err, d)
	}
	oneWait("submission right after SIGCONT", 1)
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

// waitLog is a go-redis hook that records the WAIT commands a client
// sends, alone or in a pipeline, with their replies.
type waitLog struct {
	mu    sync.Mutex
	waits []sentWait
}

type sentWait struct {
	args  string // the command as sent: "wait 1 300"
	reply int64  // the replicas that confirmed (-1: an error)
}

func (w *waitLog) record(c redis.Cmder) {
	if c.Name() != "wait" {
		return
	}
	var args []string
	for _, a := range c.Args() {
		args = append(args, fmt.Sprint(a))
	}
	sw := sentWait{args: strings.Join(args, " "), reply: -1}
	if ic, ok := c.(*redis.IntCmd); ok && ic.Err() == nil {
		sw.reply = ic.Val()
	}
	w.mu.Lock()
	w.waits = append(w.waits, sw)
	w.mu.Unlock()
}

// take returns the WAITs recorded since the last take.
func (w *waitLog) take() []sentWait {
	w.mu.Lock()
	defer w.mu.Unlock()
	got := w.waits
	w.waits = nil
	return got
}

func (w *waitLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (w *waitLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		err := next(ctx, c)
		w.record(c)
		return err
	}
}

func (w *waitLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			w.record(c)
		}
		return err
	}
}
