package api_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/stacktest"
	"github.com/puzzleq/puzzleq/tasks"
)

const corpusDir = "../../testdata/badinput"

// badCase is one line of testdata/badinput/cases.tsv.
type badCase struct {
	name, method, path string
	status             int
	code, field, body  string
}

func loadBadCases(t *testing.T) []badCase {
	t.Helper()
	f, err := os.Open(filepath.Join(corpusDir, "cases.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []badCase
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		if strings.HasPrefix(sc.Text(), "#") || strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		p := strings.Split(sc.Text(), "\t")
		if len(p) != 7 {
			t.Fatalf("cases.tsv line %d: %d columns, want 7", line, len(p))
		}
		st, err := strconv.Atoi(p[3])
		if err != nil {
			t.Fatalf("cases.tsv line %d: status %q", line, p[3])
		}
		out = append(out, badCase{p[0], p[1], p[2], st, p[4], p[5], p[6]})
	}
	return out
}

// body returns the request body of a case and its length (-1: sent
// chunked, so the server cannot refuse it by Content-Length alone).
func (c badCase) reader(t *testing.T) (io.Reader, int64) {
	t.Helper()
	switch c.body {
	case "-":
		return nil, 0
	case "gen:deep":
		b := []byte(strings.Repeat(`{"kind":`, 50000))
		return bytes.NewReader(b), int64(len(b))
	case "gen:100mb":
		// Streamed, never held in memory: a client may claim and send a
		// huge body; the server must refuse it without reading it.
		return io.LimitReader(repeatReader('['), 100<<20), 100 << 20
	case "gen:overlimit":
		b := `{"kind":"sweep","puzzle":{"board":["` + strings.Repeat(".", 1<<20) + `"]}}`
		return struct{ io.Reader }{strings.NewReader(b)}, -1
	case "gen:batch-too-many":
		item := `{"kind":"sweep","puzzle":{"board":["."]}}`
		b := `{"tasks":[` + strings.TrimSuffix(strings.Repeat(item+",", 10001), ",") + `]}`
		return strings.NewReader(b), int64(len(b))
	}
	if strings.HasPrefix(c.body, "gen:") {
		t.Fatalf("%s: unknown generator %s", c.name, c.body)
	}
	b, err := os.ReadFile(filepath.Join(corpusDir, c.body))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b), int64(len(b))
}

type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

func TestBadInputCorpus(t *testing.T) {
	t.Parallel()
	cases := loadBadCases(t)
	if len(cases) < 50 {
		t.Fatalf("the corpus has %d cases, want at least 50", len(cases))
	}
	// batch-too-many sends 10,001 items: the corpus holds the limit
	// where it was, not at the 1,000,000 default.
	s := stacktest.StartWith(t, 0, map[string]string{"MAX_BATCH_ITEMS": "10000"})
	for _, c := range cases {
		body, n := c.reader(t)
		req, err := http.NewRequest(c.method, s.URL+c.path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = n
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			// The server may close the connection after refusing a body it
			// will not read; the status must still have been sent.
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		var e apitype.ErrorBody
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Errorf("%s: body is not an error object: %q", c.name, raw)
			continue
		}
		switch {
		case resp.StatusCode != c.status:
			t.Errorf("%s: status %d, want %d: %s", c.name, resp.StatusCode, c.status, raw)
		case c.code != "" && e.Error.Code != c.code:
			t.Errorf("%s: code %q, want %q: %s", c.name, e.Error.Code, c.code, raw)
		case e.Error.Code == "" || e.Error.Message == "":
			t.Errorf("%s: error without code or message: %s", c.name, raw)
		case c.field == "" && e.Error.Field != "":
			t.Errorf("%s: field %q, want none: %s", c.name, e.Error.Field, raw)
		case !strings.HasPrefix(e.Error.Field, c.field):
			t.Errorf("%s: field %q, want %q...: %s", c.name, e.Error.Field, c.field, raw)
		}
	}
	if n := s.Records(); n != 0 {
		t.Errorf("rejected requests left %d records", n)
	}
	for _, queue := range slices.Concat(tasks.Queues, tasks.CheapQueues) {
		if q := s.Queued(queue); q != 0 {
			t.Errorf("rejected requests enqueued %d tasks on %s", q, queue)
		}
	}
}
