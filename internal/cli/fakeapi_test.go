package cli_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
)

// fakeAPI speaks the batch contract of issue 11 (POST /v1/batches as
// NDJSON, GET /v1/batches/{id} and /results) without solving anything, so
// that puzzlectl's side of it can be tested fast and its faults injected.
// An item's result is {"item":<index>}; an item whose request has
// "max_nodes":1 fails with budget_exceeded. Each request of /results ends
// perPoll more items of the batch (all of them when perPoll is 0), then
// answers, so a run must come back for the rest.
type fakeAPI struct {
	*httptest.Server
	t       *testing.T
	perPoll int
	// dropPosts is how many accepted batch POSTs lose their answer.
	dropPosts int
	// cutResults is how many /results answers break after a few lines.
	cutResults int
	// never: items never end (no workers).
	never bool
	// hold is how long each /results request is held, as a ?wait would.
	hold time.Duration
	// rejectLine > 0 refuses every batch that has that many lines with a
	// 400 naming its last line, as the API names a bad line.
	rejectLine int

	mu      sync.Mutex
	batches map[string]*fakeBatch // by ID
	byKey   map[string]*fakeBatch
	order   []*fakeBatch
	posts   []fakePost
	polls   []string // the query of each /results request
	gzipped int      // /results answers sent gzipped
	counts  int      // GET /v1/batches/{id} requests
}

type fakePost struct {
	contentType, key string
	lines            int
}

type fakeBatch struct {
	id    string
	key   string
	sum   [32]byte
	items []fakeItem
	ended int
}

type fakeItem struct {
	customID *string
	fails    bool
}

func startFakeAPI(t *testing.T, configure func(*fakeAPI)) *fakeAPI {
	t.Helper()
	f := &fakeAPI{t: t, batches: map[string]*fakeBatch{}, byKey: map[string]*fakeBatch{}}
	if configure != nil {
		configure(f)
	}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == "POST" && r.URL.Path == "/v1/batches":
		f.post(w, r)
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/v1/batches/") && strings.HasSuffix(r.URL.Path, "/results"):
		f.results(w, r, strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/batches/"), "/results"))
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/v1/batches/"):
		f.batch(w, strings.TrimPrefix(r.URL.Path, "/v1/batches/"))
	default:
		fakeError(w, 404, "not_found", "no such route")
	}
}

func fakeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(apitype.ErrorBody{Error: apitype.Error{Code: code, Message: msg}})
}

func (f *fakeAPI) post(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	key := r.Header.Get("Idempotency-Key")
	var items []fakeItem
	n := 0
	for l := range bytes.Lines(body) {
		n++
		var item struct {
			CustomID *string         `json:"custom_id"`
			Kind     string          `json:"kind"`
			Puzzle   json.RawMessage `json:"puzzle"`
			Options  json.RawMessage `json:"options"`
		}
		if err := json.Unmarshal(l, &item); err != nil || item.Kind == "" {
			fakeError(w, 400, "invalid_request", fmt.Sprintf("line %d: not an item: %q", n, l))
			return
		}
		items = append(items, fakeItem{customID: item.CustomID, fails: bytes.Contains(item.Options, []byte(`"max_nodes":1`))})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.posts = append(f.posts, fakePost{contentType: r.Header.Get("Content-Type"), key: key, lines: n})
	if f.rejectLine > 0 && n >= f.rejectLine {
		fakeError(w, 400, "invalid_puzzle", fmt.Sprintf("line %d: puzzle.board: the server says no", f.rejectLine))
		return
	}
	if r.Header.Get("Content-Type") != "application/x-ndjson" {
		fakeError(w, 415, "unsupported_media_type", "want application/x-ndjson")
		return
	}
	sum := sha256.Sum256(body)
	b, replay := f.byKey[key]
	if replay && b.sum != sum {
		fakeError(w, 422, "idempotency_mismatch", "the key was used with another body")
		return
	}
	if !replay {
		b = &fakeBatch{id: fmt.Sprintf("%032x", len(f.order)+1), key: key, sum: sum, items: items}
		f.batches[b.id] = b
		if key != "" {
			f.byKey[key] = b
		}
		f.order = append(f.order, b)
	}
	if f.dropPosts > 0 {
		f.dropPosts--
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
		return
	}
	if replay {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(http.StatusAccepted)
	created := apitype.BatchCreated{ID: b.id, Total: len(b.items)}
	if len(b.items) <= apitype.MaxListedIDs {
		for i := range b.items {
			created.TaskIDs = append(created.TaskIDs, apitype.ItemID(b.id, i))
		}
	}
	json.NewEncoder(w).Encode(created)
}

func (f *fakeAPI) stateOf(b *fakeBatch, i int) apitype.TaskState {
	switch {
	case i >= b.ended:
		return apitype.TaskStatePending
	case b.items[i].fails:
		return apitype.TaskStateFailed
	}
	return apitype.TaskStateCompleted
}

func (f *fakeAPI) batch(w http.ResponseWriter, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts++
	b, ok := f.batches[id]
	if !ok {
		fakeError(w, 404, "not_found", "no such batch")
		return
	}
	out := apitype.Batch{ID: b.id, Total: len(b.items), Done: b.ended == len(b.items), Tasks: []apitype.Task{}}
	for i := range b.items {
		switch f.stateOf(b, i) {
		case apitype.TaskStatePending:
			out.Counts.Pending++
		case apitype.TaskStateFailed:
			out.Counts.Failed++
		default:
			out.Counts.Completed++
		}
	}
	json.NewEncoder(w).Encode(out)
}

func (f *fakeAPI) results(w http.ResponseWriter, r *http.Request, id string) {
	if f.hold > 0 {
		select {
		case <-time.After(f.hold):
		case <-r.Context().Done():
			return
		}
	}
	f.mu.Lock()
	b, ok := f.batches[id]
	if !ok {
		f.mu.Unlock()
		fakeError(w, 404, "not_found", "no such batch")
		return
	}
	f.polls = append(f.polls, r.URL.RawQuery)
	if !f.never {
		b.ended = len(b.items)
		if f.perPoll > 0 {
			b.ended = min(len(b.items), len(f.polls)*f.perPoll)
		}
	}
	// Render under the lock: the states are of this moment.
	var buf bytes.Buffer
	for i, it := range b.items {
		l := apitype.ResultLine{Index: i, ID: apitype.ItemID(b.id, i), CustomID: it.customID, State: f.stateOf(b, i)}
		switch l.State {
		case apitype.TaskStateCompleted:
			l.Result = json.RawMessage(fmt.Sprintf(`{"item":%d}`, i))
		case apitype.TaskStateFailed:
			l.Error = &apitype.TaskError{Code: "budget_exceeded", Message: "search exceeded max_nodes"}
		}
		line, _ := json.Marshal(l)
		buf.Write(append(line, '\n'))
	}
	cut := f.cutResults > 0
	if cut {
		f.cutResults--
	}
	var out io.Writer = w
	var zw *gzip.Writer
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		f.gzipped++
		w.Header().Set("Content-Encoding", "gzip")
		zw = gzip.NewWriter(w)
		out = zw
	}
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-ndjson")
	if cut {
		// A few lines and half of the next, then the connection breaks.
		data := buf.Bytes()
		n := min(len(data)/2, 2000)
		out.Write(data[:n])
		if zw != nil {
			zw.Flush()
		}
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
		return
	}
	bw := bufio.NewWriter(out)
	bw.Write(buf.Bytes())
	bw.Flush()
	if zw != nil {
		zw.Close()
	}
}

// countReads is how many times the batches' counts were read.
func (f *fakeAPI) countReads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts
}

// snapshot returns copies of what the fake recorded.
func (f *fakeAPI) snapshot() (posts []fakePost, batches int, polls []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakePost(nil), f.posts...), len(f.order), append([]string(nil), f.polls...)
}

// waitBatches waits (bounded) until the fake holds n batches.
func (f *fakeAPI) waitBatches(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, got, _ := f.snapshot(); got >= n {
			return
		}
	}
	t.Fatalf("the fake API never held %d batches", n)
}
