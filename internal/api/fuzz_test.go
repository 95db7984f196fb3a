package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
)

// FuzzHTTPDecoding sends arbitrary bodies through the real Gin handlers of
// POST /v1/tasks and POST /v1/batches (JSON, NDJSON and judge text). Whatever the
// bytes, the answer is a 2xx, or a 4xx with an error object carrying a code
// and a message: never a 5xx, never a panic. The fuzz loop runs on
// miniredis for speed; the bad-input corpus test covers the same path on a
// real redis-server.
func FuzzHTTPDecoding(f *testing.F) {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		f.Fatal(err)
	}
	defer mr.Close()
	rdb := redistest.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	srv := api.New(store.New(rdb, store.Options{Prefix: "pq:", TaskTTL: time.Hour, ResultTTL: time.Hour}), store.NewHub(), nil, nil,
		fuzzOptions())
	h := srv.Handler()

	for _, s := range []string{
		`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`,
		`{"kind":"sweep","puzzle":{"board":["..*","..."]},"options":{"max_nodes":10}}`,
		`{"kind":"fill","puzzle":{"game_board":[[0,1]],"table":[[1,0]]},"options":{"allow_flip":true}}`,
		`{"tasks":[{"kind":"sweep","puzzle":{"board":["."]}}]}`,
		"1 0 3\n4 2 5\n7 8 6\n", "2 2\n..\n.*\n", `{"game_board":[[0]],"table":[[1]]}`,
		`{"kind":"sliding","kind":"sweep"}`, `{"tasks":[]}`, "\xff\xfe", `[[[[[[`,
		// Names that encoding/json would fold or merge: each is a 400.
		`{"kind":"sliding","KIND":"sweep","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`,
		`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]],"Board":[[1,2,3],[4,5,6],[7,0,8]]}}`,
		"{\"kind\":\"sliding\",\"\u212aind\":\"sweep\",\"puzzle\":{\"board\":[[1,0],[3,2]]}}",
		`{"tasks":[],"TASKS":[{"kind":"sweep","puzzle":{"board":["."]}}]}`,
		"{\"tasks\":[],\"ta\u017fks\":[{\"kind\":\"sweep\",\"puzzle\":{\"board\":[\".\"]}}]}",
		`{"tasks":[{"kind":"sweep","puzzle":{"board":["."]},"options":{"max_nodes":1,"max_nodes":2}}]}`,
		`{"game_board":[[0,1]],"TABLE":[[1,0]]}`, `{"game_board":[[0,1]],"table":[[0,0]],"table":[[1,0]]}`,
	} {
		for _, target := range []uint8{0, 1, 2, 3, 4, 5} {
			f.Add(target, []byte(s))
		}
	}
	// NDJSON batches (target 5): lines, custom_ids, repeats.
	for _, s := range []string{
		"{\"custom_id\":\"a\",\"kind\":\"sweep\",\"puzzle\":{\"board\":[\".\"]}}\n\n{\"kind\":\"sweep\",\"puzzle\":{\"board\":[\"..\"]}}",
		"{\"custom_id\":\"a\",\"kind\":\"sweep\",\"puzzle\":{\"board\":[\".\"]}}\n{\"custom_id\":\"a\",\"kind\":\"sweep\",\"puzzle\":{\"board\":[\".\"]}}\n",
		"{\"custom_id\":7,\"kind\":\"sweep\",\"puzzle\":{\"board\":[\".\"]}}\r\n", "\n\n", "{\n}\n", "\u00a0{\"kind\":\"sweep\",\"puzzle\":{\"board\":[\".\"]}}",
	} {
		f.Add(uint8(5), []byte(s))
	}
	paths := []string{"/v1/tasks", "/v1/batches", "/v1/batches?format=boj1525", "/v1/batches?format=boj9944", "/v1/batches?format=p84021", "/v1/batches"}
	f.Fuzz(func(t *testing.T, target uint8, body []byte) {
		path := paths[int(target)%len(paths)]
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		if int(target)%len(paths) == 5 {
			req.Header.Set("Content-Type", "application/x-ndjson")
		}
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("POST %s %q: %d %s", path, body, rec.Code, rec.Body.Bytes())
		}
		if rec.Code >= 400 {
			var e apitype.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
				t.Fatalf("POST %s %q: %d with a bad error body %q", path, body, rec.Code, rec.Body.Bytes())
			}
		}
	})
}

// fuzzOptions keeps fuzzed bodies small.
func fuzzOptions() api.Options {
	o := api.OptionsForTest()
	o.MaxBodyBytes, o.MaxBatchBodyBytes, o.MaxBatchItems = 64<<10, 64<<10, 50
	return o
}
