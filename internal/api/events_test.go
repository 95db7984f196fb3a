package api_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
)

// sse is one connection to /events, its events read as they come.
type sse struct {
	t      *testing.T
	resp   *http.Response
	events chan sseEvent
}

type sseEvent struct {
	name, id string
	data     []byte
}

// openEvents connects to a batch's events as key, with Last-Event-ID
// lastID unless it is "".
func openEvents(t *testing.T, s *stacktest.Stack, key, batchID, lastID string) *sse {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", s.URL+"/v1/batches/"+batchID+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("GET events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	c := &sse{t: t, resp: resp, events: make(chan sseEvent, 100)}
	go func() {
		defer close(c.events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" {
					c.events <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "id: "):
				ev.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = []byte(strings.TrimPrefix(line, "data: "))
			}
		}
	}()
	t.Cleanup(func() { resp.Body.Close() })
	return c
}

// next returns the next event other than progress, failing after 10 s.
func (c *sse) next() sseEvent {
	c.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				c.t.Fatal("the stream ended")
			}
			if ev.name != "progress" {
				return ev
			}
		case <-deadline:
			c.t.Fatal("no event within 10s")
		}
	}
}

// item reads the next event, which must be an item event, and returns
// its task's index and the event's id.
func (c *sse) item() (int, string) {
	c.t.Helper()
	ev := c.next()
	if ev.name != "item" {
		c.t.Fatalf("event %s %s, want an item", ev.name, ev.data)
	}
	var it apitype.ItemEvent
	if err := json.Unmarshal(ev.data, &it); err != nil {
		c.t.Fatal(err)
	}
	return it.Index, ev.id
}

// A client that loses its stream and resumes it with Last-Event-ID loses
// no event: the tasks that ended while it was away, and one that had
// ended ahead of the stream's position, come again. The tasks end by
// cancellation, so the test, not a worker, says when.
func TestBatchEventsResumeLosesNothing(t *testing.T) {
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:" + aliceEventsKey + ",bob:" + bobEventsKey, "CHUNK_SIZE": "2"})
	item := `{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`
	code, b, _ := s.DoAs(aliceEventsKey, "POST", "/v1/batches", `{"tasks":[`+strings.Repeat(item+",", 4)+item+`]}`)
	if code != http.StatusAccepted {
		t.Fatalf("POST: %d %s", code, b)
	}
	id := stacktest.Decode[apitype.BatchCreated](t, b).ID
	cancel := func(i int) {
		t.Helper()
		if code, b, _ := s.DoAs(aliceEventsKey, "DELETE", "/v1/tasks/"+apitype.ItemID(id, i), nil); code != http.StatusOK {
			t.Fatalf("cancel item %d: %d %s", i, code, b)
		}
	}
	// Another key's batch does not exist for it.
	if code, b, _ := s.DoAs(bobEventsKey, "GET", "/v1/batches/"+id+"/events", nil); code != http.StatusNotFound {
		t.Errorf("bob's GET of alice's events: %d %s", code, b)
	}

	got := map[int]int{}
	a := openEvents(t, s, aliceEventsKey, id, "")
	cancel(0)
	i, last := a.item()
	got[i]++
	if i != 0 || last != "1" {
		t.Fatalf("first item event: index %d id %s, want 0 and 1", i, last)
	}
	cancel(2) // ahead of the stream's position: its id stays 1
	i, id2 := a.item()
	got[i]++
	if i != 2 || id2 != "1" {
		t.Fatalf("second item event: index %d id %s, want 2 and 1", i, id2)
	}
	a.resp.Body.Close()

	// While no one listens.
	cancel(1)
	cancel(4)
	r := openEvents(t, s, aliceEventsKey, id, id2)
	for range 3 {
		i, last = r.item()
		got[i]++
	}
	cancel(3)
	i, last = r.item()
	got[i]++
	if ev := r.next(); ev.name != "done" {
		t.Fatalf("after the last item: %s %s", ev.name, ev.data)
	} else if p := stacktest.Decode[apitype.BatchProgress](t, ev.data); !p.Done || p.Counts.Canceled != 5 {
		t.Errorf("done event %s", ev.data)
	}
	if last != "5" {
		t.Errorf("the last item's id is %s, want 5", last)
	}
	for i := range 5 {
		if got[i] == 0 {
			t.Errorf("item %d was never sent (got %v)", i, got)
		}
	}
	if got[2] != 2 {
		t.Errorf("item 2, ahead of the position the client resumed from, was sent %d times, want twice: %v", got[2], got)
	}
	if _, ok := <-r.events; ok {
		t.Error("the stream goes on after done")
	}
}

// A batch run by a worker streams every task once, in whatever order the
// tasks end, and its progress.
func TestBatchEventsLive(t *testing.T) {
	s := stacktest.StartWith(t, 1, map[string]string{"API_KEYS": "alice:" + aliceEventsKey, "CHUNK_SIZE": "4"})
	items := make([]string, 30)
	for i := range items {
		items[i] = `{"kind":"sweep","puzzle":{"board":["...","*..",".*."]}}`
	}
	code, b, _ := s.DoAs(aliceEventsKey, "POST", "/v1/batches", `{"tasks":[`+strings.Join(items, ",")+`]}`)
	if code != http.StatusAccepted {
		t.Fatalf("POST: %d %s", code, b)
	}
	id := stacktest.Decode[apitype.BatchCreated](t, b).ID
	c := openEvents(t, s, aliceEventsKey, id, "")
	seen := map[int]bool{}
	progress := 0
	deadline := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case ev, ok := <-c.events:
			if !ok {
				t.Fatalf("the stream ended before done, having sent %d items", len(seen))
			}
			switch ev.name {
			case "progress":
				progress++
			case "item":
				it := stacktest.Decode[apitype.ItemEvent](t, ev.data)
				if seen[it.Index] {
					t.Errorf("item %d sent twice without a resume", it.Index)
				}
				seen[it.Index] = true
				if it.State != apitype.TaskStateCompleted || len(it.Result) == 0 {
					t.Errorf("item event %s", ev.data)
				}
			case "done":
				done = true
			}
		case <-deadline:
			t.Fatalf("not done within 30s; %d items seen", len(seen))
		}
	}
	if len(seen) != len(items) || progress < 1 {
		t.Errorf("%d of %d items, %d progress events", len(seen), len(items), progress)
	}
}

// A stream is bounded: it ends after MAX_WAIT even if the batch is not
// done, without a done event, for the client to resume.
func TestBatchEventsEndAfterMaxWait(t *testing.T) {
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:" + aliceEventsKey, "MAX_WAIT": "1s"})
	code, b, _ := s.DoAs(aliceEventsKey, "POST", "/v1/batches", `{"tasks":[{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}]}`)
	if code != http.StatusAccepted {
		t.Fatalf("POST: %d %s", code, b)
	}
	start := time.Now()
	c := openEvents(t, s, aliceEventsKey, stacktest.Decode[apitype.BatchCreated](t, b).ID, "")
	var names []string
	for ev := range c.events {
		names = append(names, ev.name)
	}
	if took := time.Since(start); took < time.Second || took > 5*time.Second {
		t.Errorf("the stream lasted %v, want about MAX_WAIT (1s)", took)
	}
	if strings.Join(names, ",") != "progress" {
		t.Errorf("events %v, want only the first progress", names)
	}
}

// A key holds at most MAX_STREAMS_PER_KEY streams open: one more is 429
// with the error object, another key is not affected, and a closed
// stream frees its place.
func TestBatchEventsStreamsPerKeyBounded(t *testing.T) {
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:" + aliceEventsKey + ",bob:" + bobEventsKey,
		"MAX_STREAMS_PER_KEY": "2"})
	submit := func(key string) string {
		t.Helper()
		code, b, _ := s.DoAs(key, "POST", "/v1/batches", `{"tasks":[{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}]}`)
		if code != http.StatusAccepted {
			t.Fatalf("POST: %d %s", code, b)
		}
		return stacktest.Decode[apitype.BatchCreated](t, b).ID
	}
	id, bobID := submit(aliceEventsKey), submit(bobEventsKey)
	first := openEvents(t, s, aliceEventsKey, id, "")
	openEvents(t, s, aliceEventsKey, id, "")
	code, b, _ := s.DoAs(aliceEventsKey, "GET", "/v1/batches/"+id+"/events", nil)
	if e := stacktest.Decode[apitype.ErrorBody](t, b); code != http.StatusTooManyRequests || e.Error.Code != apitype.CodeRateLimited || e.Error.Message == "" {
		t.Fatalf("a third stream of alice: %d %s, want 429 rate_limited", code, b)
	}
	openEvents(t, s, bobEventsKey, bobID, "") // bob's own two are his
	first.resp.Body.Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", s.URL+"/v1/batches/"+id+"/events", nil)
		req.Header.Set("Authorization", "Bearer "+aliceEventsKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed stream did not free its place: %d", resp.StatusCode)
		}
	}
}

// Stopping the API ends its streams at once, without done, rather than
// holding them to SHUTDOWN_TIMEOUT (or MAX_WAIT) and cutting them.
func TestBatchEventsEndOnShutdown(t *testing.T) {
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:" + aliceEventsKey, "SHUTDOWN_TIMEOUT": "20s"})
	code, b, _ := s.DoAs(aliceEventsKey, "POST", "/v1/batches", `{"tasks":[{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}]}`)
	if code != http.StatusAccepted {
		t.Fatalf("POST: %d %s", code, b)
	}
	c := openEvents(t, s, aliceEventsKey, stacktest.Decode[apitype.BatchCreated](t, b).ID, "")
	if ev := <-c.events; ev.name != "progress" {
		t.Fatalf("first event %s", ev.name)
	}
	start := time.Now()
	s.Close()
	for ev := range c.events {
		if ev.name == "done" {
			t.Error("a stream cut by shutdown sent done")
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the stream ended %v after the stop began, want at once (SHUTDOWN_TIMEOUT is 20s)", took)
	}
}

// The keys of the events tests: long enough for the API to start.
const (
	aliceEventsKey = "alice-events-key-0123456789"
	bobEventsKey   = "bob-events-key-0123456789ab"
)

// A client that stops reading is cut off, and its connection closed: the
// stream's write deadline (REQUEST_TIMEOUT) cuts the stream, and the
// response writer's failed write ends the connection, so a client that
// never reads again holds neither a goroutine nor a connection. 40,000
// canceled items make some 7 MB of events, more than the socket buffers
// hold, so the stream cannot have ended by itself before the cut.
//
// The cut is seen from the server's side before the client reads again:
// with MAX_STREAMS_PER_KEY=1 a second stream of the key is refused (429)
// while the first holds its slot, and admitted once the cut freed it. A
// fixed pause instead failed on a loaded machine: the stream had not yet
// filled the buffers when the client resumed reading, so it was never
// blocked for the deadline and never cut.
func TestBatchEventsSlowReaderCut(t *testing.T) {
	s := stacktest.StartWith(t, 0, map[string]string{"API_KEYS": "alice:" + aliceEventsKey, "REQUEST_TIMEOUT": "1s",
		"MAX_STREAMS_PER_KEY": "1"})
	code, b, _ := s.DoAs(aliceEventsKey, "POST", "/v1/batches",
		strings.Repeat(`{"kind":"sliding","puzzle":{"board":[[1,2,3],[4,5,6],[7,0,8]]}}`+"\n", 40000), "Content-Type", "application/x-ndjson")
	if code != http.StatusAccepted {
		t.Fatalf("POST: %d %.200s", code, b)
	}
	id := stacktest.Decode[apitype.BatchCreated](t, b).ID
	// Canceling 40,000 items may pass the 1 s REQUEST_TIMEOUT this test
	// needs for the cut on a loaded machine. A cancel is safe to repeat: one
	// that timed out has canceled what it reached, and the next goes on
	// (its walk over chunks already canceled is quick), with 200 even
	// when the first had already ended the batch. So the client repeats
	// it for a minute, not a fixed number of times (five tries all ran
	// out of their 1 s at load 30), and the check below still fails a
	// cancel that never ends.
	for try, deadline := 1, time.Now().Add(time.Minute); ; try++ {
		code, b, _ := s.DoAs(aliceEventsKey, "DELETE", "/v1/batches/"+id, nil)
		if code == http.StatusOK {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("cancel (try %d): %d %s", try, code, b)
		}
		code, b, _ = s.DoAs(aliceEventsKey, "GET", "/v1/batches/"+id, nil)
		if code != http.StatusOK {
			t.Fatalf("GET the batch during its cancel: %d %.300s", code, b)
		}
		t.Logf("cancel (try %d): 503 with %d of 40000 items canceled", try, stacktest.Decode[apitype.Batch](t, b).Counts.Canceled)
	}
	if code, b, _ := s.DoAs(aliceEventsKey, "GET", "/v1/batches/"+id, nil); code != http.StatusOK ||
		stacktest.Decode[apitype.Batch](t, b).Counts.Canceled != 40000 {
		t.Fatalf("after the cancel the batch reads %d: %.300s", code, b)
	}
	request := []byte("GET /v1/batches/" + id + "/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + aliceEventsKey + "\r\n\r\n")
	conn := dialSmallBuffer(t, s.URL)
	if _, err := conn.Write(request); err != nil {
		t.Fatal(err)
	}
	// The stream is open (and holds the key's slot) once its status line
	// came; the rest stays unread.
	br := bufio.NewReaderSize(deadlineReader{conn, 10 * time.Second}, 4096)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, " 200 ") {
		t.Fatalf("the stream's status line: %q %v", line, err)
	}
	cutAt := time.Time{}
	for range 600 { // at most 60 s
		code := streamStatus(t, s.URL, request)
		if code == http.StatusOK {
			cutAt = time.Now()
			break
		}
		if code != http.StatusTooManyRequests {
			t.Fatalf("a second stream of the key: %d, want 429 while the first is open, then 200", code)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if cutAt.IsZero() {
		t.Fatal("the stream of a client that reads nothing still holds its slot after 60 s")
	}
	// What was sent comes, then the end of the connection, at once: not
	// after IdleTimeout (2 min) or never.
	start := time.Now()
	got, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("after %d bytes: %v (the connection stayed open %v after the cut)", len(got), err, time.Since(start))
	}
	if bytes.Contains(got, []byte("event: done")) {
		t.Errorf("read %d bytes and the done event: the whole stream came, so the reader was not cut", len(got))
	}
	t.Logf("FIGURES slow reader: %d bytes arrived before the cut; connection closed %v after it began reading", len(got), time.Since(start))
}

// dialSmallBuffer connects to the stack's API with a 4 KiB receive
// buffer, so that a client that does not read blocks the server's writes
// soon.
func dialSmallBuffer(t *testing.T, url string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.DialContext(t.Context(), "tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// streamStatus sends request on a new connection and returns the status
// code of its answer, closing the connection after the status line.
func streamStatus(t *testing.T, url string, request []byte) int {
	t.Helper()
	conn := dialSmallBuffer(t, url)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(request); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("a second stream: %v", err)
	}
	var proto string
	var code int
	if _, err := fmt.Sscan(line, &proto, &code); err != nil {
		t.Fatalf("a second stream's status line %q: %v", line, err)
	}
	return code
}

// deadlineReader reads from a connection with a deadline per read.
type deadlineReader struct {
	c net.Conn
	d time.Duration
}

func (r deadlineReader) Read(p []byte) (int, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(r.d))
	return r.c.Read(p)
}
