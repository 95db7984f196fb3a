package client

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/puzzleq/puzzleq/apitype"
)

// ResultLine is one line of a batch's results: one item, in submission
// order, with its Result (completed) or Error (failed, canceled); an item
// that has not ended has neither.
type ResultLine = apitype.ResultLine

// ResultsOptions are the query of GET /v1/batches/{id}/results.
type ResultsOptions struct {
	// Wait > 0 makes the server hold the request until every item of the
	// batch has ended or Wait (at most its MAX_WAIT, 60s by default)
	// passes; then it answers the items as they are, ended or not.
	Wait time.Duration
	// State, when set, keeps only the items in that state
	// (StateFailed, say).
	State TaskState
	// From, when positive, starts at the item of that index: a caller
	// that has the lines before it does not read them again.
	From int
}

// MaxResultLine bounds one line of a results stream, so that a server
// that never ends a line cannot make the client buffer without end.
const MaxResultLine = 64 << 20

// Results reads a batch's results as they stream: one ResultLine per
// item, in submission order, each decoded as its line arrives, so a
// batch of a million items takes the memory of one line. It can be read
// at any time: items that have not ended come with their state and no
// result.
//
// The request asks for gzip and decodes it, unless WithoutResultsGzip. A stream that breaks (the
// connection, a timeout, a truncated line) is requested again, with the
// client's retries and backoff, from the line after the last one yielded
// (the server's from=), so each index is yielded at most once and in
// order. The error
// of a stream that cannot be read, after the retries, is yielded last,
// with a nil line; it is an *Error for an answer of the API (404 for no
// such batch) and matches ErrUnreachable when the server cannot be
// reached. Breaking out of the loop closes the stream.
//
// Each attempt is bounded by the client's timeout plus Wait until the
// answer starts, and then by the timeout between two reads: a slow but
// moving stream is not cut, a stalled one is.
func (c *Client) Results(ctx context.Context, batchID string, opts ResultsOptions) iter.Seq2[*ResultLine, error] {
	return func(yield func(*ResultLine, error) bool) {
		q := url.Values{}
		if opts.Wait > 0 {
			q.Set("wait", opts.Wait.String())
		}
		if opts.State != "" {
			q.Set("state", string(opts.State))
		}
		enc := "gzip"
		if c.noResultsGzip {
			// Set, or the transport asks for gzip on its own.
			enc = "identity"
		}
		cl := call{method: http.MethodGet, path: "/v1/batches/" + url.PathEscape(batchID) + "/results", query: q,
			header: http.Header{"Accept": {"application/x-ndjson"}, "Accept-Encoding": {enc}},
			wait:   opts.Wait, retry: retryAlways}
		last := opts.From - 1 // the index of the last line yielded
		stopped := false
		err := c.retrying(ctx, cl.retry, func() error {
			if last >= 0 {
				q.Set("from", strconv.Itoa(last+1))
			}
			return c.streamOnce(ctx, cl, func(l *ResultLine) bool {
				if l.Index <= last {
					return true // yielded by an earlier attempt
				}
				last = l.Index
				if !yield(l, nil) {
					stopped = true
					return false
				}
				return true
			})
		})
		if err != nil && !stopped {
			yield(nil, err)
		}
	}
}

// streamOnce makes one request of a results stream and calls each for
// every line until the stream ends or each returns false.
func (c *Client) streamOnce(ctx context.Context, cl call, each func(*ResultLine) bool) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	idle := c.timeout
	timer := time.AfterFunc(c.timeout+cl.wait, func() { cancel(errStalled) })
	defer timer.Stop()
	resp, err := c.send(ctx, cl)
	if err != nil {
		return stalledOr(ctx, err)
	}
	defer resp.Body.Close()
	var body io.Reader = &idleReader{r: resp.Body, timer: timer, idle: idle}
	switch enc := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return stalledOr(ctx, io.ErrUnexpectedEOF)
			}
			return stalledOr(ctx, err)
		}
		defer zr.Close()
		body = zr
	default:
		return &decodeError{fmt.Errorf("unsupported Content-Encoding %q", enc)}
	}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), MaxResultLine)
	for sc.Scan() {
		b := sc.Bytes()
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		l := new(ResultLine)
		if err := decodeResultLine(b, l); err != nil {
			// A line cut short by a broken stream, or a bad server.
			return &decodeError{fmt.Errorf("results line: %w", err)}
		}
		// The consumer's time is not the server's silence.
		timer.Stop()
		more := each(l)
		timer.Reset(idle)
		if !more {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return &decodeError{fmt.Errorf("a results line is longer than %d bytes", MaxResultLine)}
		}
		return stalledOr(ctx, err)
	}
	return nil
}

// errStalled is the cause of a stream's context when the server went
// silent for longer than the client's timeout.
var errStalled = errors.New("the server sent nothing for longer than the timeout")

// stalledOr names a stall as the cause of err when it was one.
func stalledOr(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), errStalled) {
		return fmt.Errorf("%w: %w", errStalled, err)
	}
	return err
}

// idleReader pushes its timer back by idle on every read that returns
// data: the timer bounds the silence between reads, not the stream.
type idleReader struct {
	r     io.Reader
	timer *time.Timer
	idle  time.Duration
}

func (r *idleReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.timer.Reset(r.idle)
	}
	return n, err
}

// decodeResultLine decodes one line of a results stream into l, as
// json.Unmarshal would. The lines of a puzzleq API have one shape, which is
// read here without reflection, the result's bytes checked and copied as
// they are: a million-line stream spends its client's CPU on this. A line
// of any other shape (other members or order, escapes, non-ASCII, spaces)
// goes to json.Unmarshal, so what is accepted and how it is read do not
// change.
func decodeResultLine(b []byte, l *ResultLine) error {
	if fastResultLine(b, l) {
		return nil
	}
	*l = ResultLine{}
	return json.Unmarshal(b, l)
}

// fastResultLine reads b when it is exactly
// {"index":N,"id":"...","custom_id":null|"...","state":"..."[,"result":V]}
// with plain ASCII strings, and reports whether it was.
func fastResultLine(b []byte, l *ResultLine) bool {
	p, ok := cutPrefix(b, `{"index":`)
	if !ok {
		return false
	}
	n := 0
	for n < len(p) && n < 18 && p[n] >= '0' && p[n] <= '9' {
		n++
	}
	if n == 0 || (n > 1 && p[0] == '0') {
		return false
	}
	index := 0
	for _, c := range p[:n] {
		index = index*10 + int(c-'0')
	}
	p = p[n:]
	if p, ok = cutPrefix(p, `,"id":`); !ok {
		return false
	}
	id, p, ok := plainString(p)
	if !ok {
		return false
	}
	if p, ok = cutPrefix(p, `,"custom_id":`); !ok {
		return false
	}
	var customID *string
	if q, isNull := cutPrefix(p, "null"); isNull {
		p = q
	} else {
		var cid []byte
		if cid, p, ok = plainString(p); !ok {
			return false
		}
		s := string(cid)
		customID = &s
	}
	if p, ok = cutPrefix(p, `,"state":`); !ok {
		return false
	}
	state, p, ok := plainString(p)
	if !ok {
		return false
	}
	var result []byte
	switch {
	case len(p) == 1 && p[0] == '}':
	case bytes.HasPrefix(p, []byte(`,"result":`)) && len(p) > len(`,"result":`)+1 && p[len(p)-1] == '}':
		v := p[len(`,"result":`) : len(p)-1]
		if isSpace(v[0]) || isSpace(v[len(v)-1]) ||
			!jsontext.Value(v).IsValid(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)) {
			return false
		}
		result = bytes.Clone(v)
	default:
		return false // an error member, or another shape
	}
	*l = ResultLine{Index: index, ID: string(id), CustomID: customID, State: stateOf(state), Result: result}
	return true
}

func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return b, false
	}
	return b[len(prefix):], true
}

// plainString reads a JSON string at the start of b that has no escapes
// and only printable ASCII, so that its bytes are its value.
func plainString(b []byte) (s, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, b, false
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return b[1:i], b[i+1:], true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, b, false
		}
	}
	return nil, b, false
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// stateOf returns the state named by b, without allocating for the
// states the API has.
func stateOf(b []byte) TaskState {
	for _, st := range [...]TaskState{StateCompleted, StateFailed, StateCanceled, StatePending, StateActive} {
		if string(b) == string(st) {
			return st
		}
	}
	return TaskState(b)
}
