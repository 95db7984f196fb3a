package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/testgen"
)

// BenchmarkIngestNDJSON100k is the upload of scripts/bench-submit.sh:
// 100,000 distinct random 8-puzzles as one NDJSON batch (about 5 MiB),
// POSTed over HTTP to the API on a real redis-server with the binary's
// defaults (chunks of 64, FEED_DEPTH 64), "ids" with a custom_id on every
// line. It reports the process's CPU per item (the API's, with the
// client's few writes), the time from the first byte to the 202 and from
// the last byte (the client's last write of the body) to the 202: the
// part of an upload that no faster client can hide.
//
//	go test -run '^$' -bench IngestNDJSON100k -benchtime 5x ./internal/api/
func BenchmarkIngestNDJSON100k(b *testing.B) {
	for _, tc := range []struct {
		name string
		ids  bool
	}{{"plain", false}, {"ids", true}} {
		b.Run(tc.name, func(b *testing.B) { benchIngest(b, 100_000, tc.ids) })
	}
}

func benchIngest(b *testing.B, items int, ids bool) {
	r := redistest.Start(b)
	rdb := r.Client(b)
	st := store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	o := api.OptionsForTest()
	o.MaxBatchBodyBytes, o.MaxBatchItems, o.BodyReadTimeout, o.RequestTimeout, o.MaxPendingPerKey = 64<<20, items, time.Minute, time.Minute, 2*items
	o.Keys = []api.APIKey{{Name: "alice", Key: aliceKey}}
	srv := httptest.NewServer(api.New(st, store.NewHub(), nil, nil, o).Handler())
	defer srv.Close()
	body := benchLines(items, ids)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var tail time.Duration
	cpu0 := int64(testgen.ProcessCPU())
	for n := range b.N {
		if n > 0 {
			b.StopTimer()
			if err := rdb.FlushAll(b.Context()).Err(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		lr := &lastByteReader{r: bytes.NewReader(body)}
		req, _ := http.NewRequestWithContext(b.Context(), http.MethodPost, srv.URL+"/v1/batches", lr)
		req.ContentLength = int64(len(body))
		req.Header.Set("Content-Type", "application/x-ndjson")
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		end := time.Now()
		var ack apitype.BatchCreated
		err = json.NewDecoder(resp.Body).Decode(&ack)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted || err != nil || ack.Total != items {
			b.Fatalf("%d %+v %v", resp.StatusCode, ack, err)
		}
		tail += end.Sub(time.Unix(0, lr.last.Load()))
	}
	b.ReportMetric(float64(int64(testgen.ProcessCPU())-cpu0)/float64(b.N)/float64(items)/1e3, "cpu-us/item")
	b.ReportMetric(tail.Seconds()/float64(b.N), "s-last-byte-to-202")
}

// lastByteReader records when the body's last byte was handed to the
// transport.
type lastByteReader struct {
	r    io.Reader
	last atomic.Int64
}

func (l *lastByteReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if err == io.EOF {
		l.last.CompareAndSwap(0, time.Now().UnixNano())
	}
	return n, err
}

// benchLines is n distinct random 8-puzzles, one NDJSON line each, in
// bench-submit.sh's shape; with ids every line has a custom_id.
func benchLines(n int, ids bool) []byte {
	var buf bytes.Buffer
	rng := rand.New(rand.NewPCG(2026, 11))
	seen := map[[9]int]bool{}
	for len(seen) < n {
		var b [9]int
		for i := range b {
			b[i] = i
		}
		rng.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
		if seen[b] {
			continue
		}
		seen[b] = true
		if ids {
			fmt.Fprintf(&buf, `{"custom_id":"a-%d",`, len(seen))
		} else {
			buf.WriteByte('{')
		}
		fmt.Fprintf(&buf, `"kind":"sliding","puzzle":{"board":[[%d,%d,%d],[%d,%d,%d],[%d,%d,%d]]}}`+"\n",
			b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8])
	}
	return buf.Bytes()
}
