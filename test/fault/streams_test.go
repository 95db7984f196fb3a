//go:build fault

package fault

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
)

// TestEventStreamsMemory holds the API's resident memory to its
// documented bound (256 MiB, docs/guarantees.md) with 48 event streams
// open on three 99,991-item batches whose first item is slow (one of the
// hardest 15-puzzles, solved on the 6-6-3 tables): every other item ends while
// the first has not, so a stream's watermark stays at 0 and it has to
// remember what it sent ahead of it. It does so in a fixed window of bits
// (16 KiB a stream), where it kept a set of every such item (45 B each,
// 286 MiB for these 48 streams). The streams are then reopened from
// Last-Event-ID 0, which rebuilds that state. Every stream must send
// every ended item once.
func TestEventStreamsMemory(t *testing.T) {
	timed(t)
	const (
		batches   = 3
		perBatch  = 99991
		perStream = 16
		apiMax    = 256 << 10 // KiB
	)
	// One of the hardest 15-puzzles (80 moves; minutes on the 6-6-3
	// tables): the same board first in every batch, so one solve, which
	// the three items join, holds one slot while the rest end.
	tiles, err := parseTiles(hardest80)
	if err != nil {
		t.Fatal(err)
	}
	slow := newHard15("hardest80", tiles, 80)
	c := newCluster(t, clusterOpts{workers: 2, authed: true,
		api: map[string]string{"MAX_STREAMS_PER_KEY": "48", "MAX_PENDING_PER_KEY": "400000", "MAX_WAIT": "5m",
			"GOMEMLIMIT": "230MiB"}, // as the binary sets it in a 256 MiB container (TestMemory)
		worker: map[string]string{"SLIDING_DEADLINE": "5m"}})
	ids := make([]string, batches)
	for i := range ids {
		reqs := append([]string{slow.req}, eightPuzzles(perBatch-1, int64(90+i))...)
		var ack apitype.BatchCreated
		if err := json.Unmarshal(c.must("POST", "/v1/batches", batchBody(reqs), http.StatusAccepted), &ack); err != nil || ack.Total != perBatch {
			t.Fatalf("batch answer: %+v %v", ack, err)
		}
		ids[i] = ack.ID
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()

	// stream reads one batch's events from Last-Event-ID from until it
	// has seen want item events or ctx ends, and counts them by index.
	stream := func(ctx context.Context, id string, from, want int) (map[int]int, error) {
		seen := map[int]int{}
		n := 0
		for ctx.Err() == nil && n < want {
			req, _ := http.NewRequestWithContext(ctx, "GET", c.api.URL()+"/v1/batches/"+id+"/events", nil)
			req.Header.Set("Authorization", "Bearer "+c.key)
			req.Header.Set("Last-Event-ID", strconv.Itoa(from))
			resp, err := hc.Do(req)
			if err != nil {
				return seen, err
			}
			if resp.StatusCode != http.StatusOK {
				resp.Body.Close()
				return seen, &statusError{resp.StatusCode}
			}
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			item := false
			for n < want && sc.Scan() {
				line := sc.Text()
				switch {
				case line == "event: item":
					item = true
				case strings.HasPrefix(line, "data: ") && item:
					var ev apitype.ItemEvent
					if err := json.Unmarshal([]byte(line[len("data: "):]), &ev); err != nil {
						resp.Body.Close()
						return seen, err
					}
					seen[ev.Index]++
					n++
					item = false
				case strings.HasPrefix(line, "id: "):
					from = atoiOr(line[len("id: "):], from)
				}
			}
			resp.Body.Close()
		}
		return seen, ctx.Err()
	}

	// open starts perStream streams on each batch and waits for each to
	// have sent every item but the first, which is still being solved.
	round := func(what string) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		var bad atomic.Int64
		start := time.Now()
		for _, id := range ids {
			for range perStream {
				wg.Add(1)
				go func() {
					defer wg.Done()
					seen, err := stream(ctx, id, 0, perBatch-1)
					if len(seen) != perBatch-1 || seen[0] != 0 {
						if bad.Add(1) <= 3 {
							t.Errorf("%s: a stream on %s sent %d distinct items (item 0 %d times), want %d: %v", what, id, len(seen), seen[0], perBatch-1, err)
						}
						return
					}
					for i, k := range seen {
						if k != 1 {
							if bad.Add(1) <= 3 {
								t.Errorf("%s: a stream on %s sent item %d %d times", what, id, i, k)
							}
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		t.Logf("streams: FIGURES %s: %d streams on %d batches of %d with a slow first item, all items but the first sent once in %v; api peak_rss=%s",
			what, perStream*batches, batches, perBatch, time.Since(start).Round(time.Millisecond), fmtKB(c.api.PeakRSS()))
	}
	round("from the start")
	for _, id := range ids {
		if b, ok := c.batchCounts(id); !ok || b.Done {
			t.Fatalf("precondition: batch %s done (%v) while the streams were open: its first item was not slow", id, ok)
		}
	}
	round("reopened from Last-Event-ID 0")
	if rss := c.api.PeakRSS(); rss > apiMax {
		t.Errorf("API peak RSS %s with %d event streams, bound %s", fmtKB(rss), perStream*batches, fmtKB(apiMax))
	}
	for _, id := range ids {
		c.must("DELETE", "/v1/batches/"+id, nil, http.StatusOK)
	}
}

type statusError struct{ code int }

func (e *statusError) Error() string { return "status " + strconv.Itoa(e.code) }

func atoiOr(s string, or int) int {
	if n, err := strconv.Atoi(s); err == nil {
		return n
	}
	return or
}
