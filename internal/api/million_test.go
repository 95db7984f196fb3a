package api_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
)

// BenchmarkMillionItemNDJSON is issue 11's upload: one 1,000,000-item
// NDJSON batch (random 8-puzzles, each with a custom_id, about 100 MiB)
// POSTed over HTTP to the API on a real redis-server with the binary's
// defaults (chunks of 64, MAX_BYTES_IN_FLIGHT 32Mi). The body is made as
// it is sent, so the process's memory is the API's. It reports the time
// to the 202 and the process's peak heap (live objects) and peak memory
// the Go runtime holds from the OS (total less released), sampled every
// 10 ms; both have the idle process's figure subtracted.
//
//	go test -run XXX -bench MillionItemNDJSON -benchtime 1x ./internal/api/
func BenchmarkMillionItemNDJSON(b *testing.B) {
	const items = 1_000_000
	r := redistest.Start(b)
	rdb := r.Client(b)
	st := store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	o := api.OptionsForTest()
	o.MaxBatchBodyBytes, o.MaxBatchItems, o.BodyReadTimeout, o.RequestTimeout, o.MaxPendingPerKey = 256<<20, items, 5*time.Minute, time.Minute, 2*items
	o.Keys = []api.APIKey{{Name: "alice", Key: aliceKey}}
	srv := httptest.NewServer(api.New(st, store.NewHub(), nil, nil, o).Handler())
	defer srv.Close()

	for n := range b.N {
		if n > 0 {
			b.StopTimer()
			if err := rdb.FlushAll(b.Context()).Err(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		runtime.GC()
		base := sampleMemory()
		var peakHeap, peakHeld atomic.Uint64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(10 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				m := sampleMemory()
				if m.heap > peakHeap.Load() {
					peakHeap.Store(m.heap)
				}
				if m.held > peakHeld.Load() {
					peakHeld.Store(m.held)
				}
			}
		}()

		pr, pw := io.Pipe()
		var sent atomic.Int64
		go func() { pw.CloseWithError(writeMillion(pw, items, &sent)) }()
		req, _ := http.NewRequestWithContext(b.Context(), http.MethodPost, srv.URL+"/v1/batches", pr)
		req.Header.Set("Content-Type", "application/x-ndjson")
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		took := time.Since(start)
		close(stop)
		wg.Wait()
		if err != nil {
			b.Fatal(err)
		}
		var ack apitype.BatchCreated
		err = json.NewDecoder(resp.Body).Decode(&ack)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted || err != nil || ack.Total != items || ack.TaskIDs != nil {
			b.Fatalf("%d %+v %v", resp.StatusCode, ack, err)
		}
		bt, err := st.GetBatch(b.Context(), ack.ID)
		if err != nil || bt.Total != items {
			b.Fatalf("batch record %+v %v", bt, err)
		}
		mib := func(v, base uint64) float64 { return float64(v-min(v, base)) / (1 << 20) }
		b.ReportMetric(took.Seconds(), "s/202")
		b.ReportMetric(mib(peakHeap.Load(), base.heap), "peak-heap-MiB")
		b.ReportMetric(mib(peakHeld.Load(), base.held), "peak-held-MiB")
		b.ReportMetric(float64(sent.Load())/(1<<20), "body-MiB")
		if hwm, ok := vmHWM(); ok {
			b.ReportMetric(hwm, "process-VmHWM-MiB")
		}
	}
}

// vmHWM is the process's peak RSS (Linux), in MiB: the test binary's, the
// body's writer included, so an upper bound of the API's.
func vmHWM() (float64, bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return float64(kb) / 1024, err == nil
		}
	}
	return 0, false
}

type memSample struct{ heap, held uint64 }

var memMetrics = []string{"/memory/classes/heap/objects:bytes", "/memory/classes/total:bytes", "/memory/classes/heap/released:bytes"}

// sampleMemory reads the live heap and what the runtime holds from the
// OS (its mapped memory less what it has released), without stopping the
// world.
func sampleMemory() memSample {
	s := make([]metrics.Sample, len(memMetrics))
	for i, n := range memMetrics {
		s[i].Name = n
	}
	metrics.Read(s)
	return memSample{heap: s[0].Value.Uint64(), held: s[1].Value.Uint64() - s[2].Value.Uint64()}
}

// writeMillion writes n NDJSON items like scripts/bench-million.sh's: a
// random 8-puzzle board and the custom_id "a-<i>".
func writeMillion(w io.Writer, n int, sent *atomic.Int64) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	rng := rand.New(rand.NewPCG(1, 1000000))
	b := []int{0, 1, 2, 3, 4, 5, 6, 7, 8}
	for i := range n {
		rng.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
		k, err := fmt.Fprintf(bw, `{"custom_id":"a-%d","kind":"sliding","puzzle":{"board":[[%d,%d,%d],[%d,%d,%d],[%d,%d,%d]]}}`+"\n",
			i, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8])
		if err != nil {
			return err
		}
		sent.Add(int64(k))
	}
	return bw.Flush()
}
