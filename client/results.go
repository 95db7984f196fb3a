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
	"strings"
	"time"

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
// The request asks for gzip and decodes it. A stream that breaks (the
// connection, a timeout, a truncated line) is requested again, with the
// client's retries and backoff, and the lines already yielded are
// skipped, so each index is yielded at most once and in order. The error
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
		cl := call{method: http.MethodGet, path: "/v1/batches/" + url.PathEscape(batchID) + "/results", query: q,
			header: http.Header{"Accept": {"application/x-ndjson"}, "Accept-Encoding": {"gzip"}},
			wait:   opts.Wait, retry: retryAlways}
		last := -1 // the index of the last line yielded
		stopped := false
		err := c.retrying(ctx, cl.retry, func() error {
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
		if err := json.Unmarshal(b, l); err != nil {
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
