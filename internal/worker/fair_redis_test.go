package worker_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// The keys with expensive work share the cluster's solver slots by
// weight. These tests run two real asynq servers ("workers") on a real
// redis-server, with an hour's retry delay for a parked run: work that
// ends at all ended by promotion.

// sweepBoards returns rows*cols distinct sweep boards of that size, one
// mine each: searches that count as expensive and end in microseconds.
func sweepBoards(rows, cols int) []string {
	out := make([]string, 0, rows*cols)
	for i := range rows * cols {
		b := make([]string, rows)
		for r := range rows {
			row := []byte(strings.Repeat(".", cols))
			if r == i/cols {
				row[i%cols] = '*'
			}
			b[r] = string(row)
		}
		out = append(out, `{"kind":"sweep","puzzle":{"board":["`+strings.Join(b, `","`)+`"]}}`)
	}
	return out
}

// waitCompleted waits up to 60 s for every single task in ids to
// complete.
func (f *unitFixture) waitCompleted(t *testing.T, ids []string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range ids {
		for ; ; time.Sleep(10 * time.Millisecond) {
			tk, err := f.store.Get(f.ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if tk.State == apitype.TaskStateCompleted {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is %s after 60 s", id, tk.State)
			}
		}
	}
}

// checkDrained fails unless within 5 s no key holds a slot or has a
// parked run (a batch item's run frees its slot after it writes the
// item's outcome, so the batch may be done a moment before).
func (f *unitFixture) checkDrained(t *testing.T, owners ...string) {
	t.Helper()
	for _, o := range owners {
		var held, parked int
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if held, err = f.store.Running(f.ctx, o); err == nil {
				parked, err = f.store.Parked(f.ctx, o)
			}
			if err != nil || (held == 0 && parked == 0) || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || held != 0 || parked != 0 {
			t.Errorf("%s holds %d slots and has %d parked runs at the end (%v)", o, held, parked, err)
		}
	}
}

// A key alone uses every solver slot of the cluster (two workers of 3
// slots), not half of them, and never more.
func TestLoneKeyUsesEverySlot(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	const slots = 6
	h := worker.NewHandler(f.store, nil, testLimits(), worker.NewMetrics(prometheus.NewRegistry()), nil)
	h.SetGate(f.store, func() int { return 0 })
	h.SetSlots(func() int { return slots })
	most := concurrency(h, 150*time.Millisecond)
	client := asynq.NewClientFromRedisClient(f.rdb)
	var ids []string
	for i, req := range sweepBoards(3, 6) {
		id := fmt.Sprint("a", i)
		f.enqueueSingle(t, client, id, "a", req)
		ids = append(ids, id)
	}
	f.slotServer(t, h, slots/2)
	f.slotServer(t, h, slots/2)
	f.waitCompleted(t, ids)
	if got := most.Load(); got != slots {
		t.Errorf("a lone key ran at most %d searches at once on %d slots", got, slots)
	}
	f.checkDrained(t, "a")
}

// Keys of weights 1 and 3 competing on 8 slots (two workers of 8, so
// that the workers could run 16) hold about 2 and 6 while both have runs
// waiting, and never more than 8 together. a's runs come first and take
// every slot; the mean counts that head start (one solve's time).
func TestWeightedKeysShareTheSlots(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	const slots = 8
	if err := f.store.SetWeights(f.ctx, map[string]int{"a": 1, "b": 3}); err != nil {
		t.Fatal(err)
	}
	h := worker.NewHandler(f.store, nil, testLimits(), worker.NewMetrics(prometheus.NewRegistry()), nil)
	h.SetGate(f.store, func() int { return 0 })
	h.SetSlots(func() int { return slots })
	most := concurrency(h, 250*time.Millisecond)
	client := asynq.NewClientFromRedisClient(f.rdb)
	var ids []string
	// a's runs come first, so a alone takes every slot before b arrives.
	for i, req := range sweepBoards(5, 8) {
		id := fmt.Sprint("a", i)
		f.enqueueSingle(t, client, id, "a", req)
		ids = append(ids, id)
	}
	for i, req := range sweepBoards(6, 10) {
		id := fmt.Sprint("b", i)
		f.enqueueSingle(t, client, id, "b", req)
		ids = append(ids, id)
	}
	f.slotServer(t, h, slots)
	f.slotServer(t, h, slots)

	// Sample while both keys have runs waiting.
	var samples, sumA, sumB, peak int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			pa, _ := f.store.Parked(f.ctx, "a")
			pb, _ := f.store.Parked(f.ctx, "b")
			ha, _ := f.store.Running(f.ctx, "a")
			hb, _ := f.store.Running(f.ctx, "b")
			peak = max(peak, ha+hb)
			if pa > 0 && pb > 0 {
				samples++
				sumA += ha
				sumB += hb
			}
			if samples > 0 && (pa == 0 || pb == 0) {
				return
			}
		}
	}()
	f.waitCompleted(t, ids)
	<-done
	if samples < 10 {
		t.Fatalf("only %d samples with both keys waiting", samples)
	}
	meanA, meanB := float64(sumA)/float64(samples), float64(sumB)/float64(samples)
	share := meanB / (meanA + meanB)
	t.Logf("while both waited (%d samples): a held %.2f, b %.2f of %d slots (b's share %.2f)", samples, meanA, meanB, slots, share)
	// The weights set the share of the slots held, which is what is
	// checked: b's is 3/4, less a's head start (0.68 on a quiet machine),
	// and at least 0.6, well clear of equal weights' 0.5. How many are
	// held at a sample also counts the
	// moments between one run's end and the next one's start, which a
	// loaded machine stretches (6.8 of 8 held in one CI run), so the
	// total is held only to a loose floor here; TestLoneKeyUsesEverySlot
	// holds the slots' use.
	if share < 0.6 || share > 0.9 || meanA+meanB < slots/2 {
		t.Errorf("weights 1 and 3 on %d slots: a held %.2f, b %.2f on average (b's share %.2f); want about 2 and 6, a share of 0.75", slots, meanA, meanB, share)
	}
	if got := most.Load(); got > slots || peak > slots {
		t.Errorf("%d searches ran at once (%d slots held) on %d slots", got, peak, slots)
	}
	f.checkDrained(t, "a", "b")
}

// A batch's items go through the same share as single tasks: a key's
// batch of searches and another key's single searches on a cluster of 4
// slots (two workers of 4) all end by promotion, every slot is used and
// never more than 4 run at once.
func TestBatchAndSinglesShareTheSlots(t *testing.T) {
	t.Parallel()
	f := newUnitFixture(t)
	const slots, n = 4, 15
	h := worker.NewHandler(f.store, nil, testLimits(), worker.NewMetrics(prometheus.NewRegistry()), nil)
	h.SetGate(f.store, func() int { return 0 })
	h.SetSlots(func() int { return slots })
	h.SetFeed(f.store, n)
	most := concurrency(h, 100*time.Millisecond)
	f.stageOwned(t, "b1", "a", sweepBoards(3, 5))
	if _, err := worker.FeedQueue(f.ctx, f.store, tasks.QueueBulk, n, n); err != nil {
		t.Fatal(err)
	}
	client := asynq.NewClientFromRedisClient(f.rdb)
	var ids []string
	for i, req := range sweepBoards(2, 4) {
		id := fmt.Sprint("s", i)
		f.enqueueSingle(t, client, id, "b", req)
		ids = append(ids, id)
	}
	f.slotServer(t, h, slots)
	f.slotServer(t, h, slots)
	f.waitCompleted(t, ids)
	b := f.waitDone(t, "b1")
	if got := b.Counts[apitype.TaskStateCompleted]; got != n {
		t.Fatalf("batch completed %d of %d: %v", got, n, b.Counts)
	}
	if got := most.Load(); got != slots {
		t.Errorf("at most %d searches ran at once on %d slots", got, slots)
	}
	f.checkDrained(t, "a", "b")
}
