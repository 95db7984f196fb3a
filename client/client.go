// Package client is a Go client for the puzzleq HTTP API (v1).
//
// Create a Client with New and the API's base URL, then solve puzzles one
// at a time or in batches of up to the server's MAX_BATCH_ITEMS, a million
// by default:
//
//	c := client.New("http://localhost:8080", client.WithAPIKey(os.Getenv("PUZZLEQ_API_KEY")))
//	t, err := c.Solve(ctx, client.Sliding(sliding.Puzzle{Board: [][]int{{1, 0, 3}, {4, 2, 5}, {7, 8, 6}}}, sliding.Options{}))
//	...
//	res, err := client.ResultOf[sliding.Result](t) // res.Moves == 3, res.Path == "DRD"
//
// # Requests and results
//
// A Request is made from the solver's own types: Sliding, Sweep and Fill
// take the Puzzle and Options of the packages
// github.com/puzzleq/puzzleq/solvers/sliding, .../solvers/sweep and
// .../solvers/fill, and RawRequest takes the JSON of POST /v1/tasks as it
// is. Those packages hold the results too: ResultOf decodes a completed
// task's (or results line's) answer into sliding.Result, sweep.Result or
// fill.Result, and says why when there is none (*NotCompletedError).
//
// Three calls submit work:
//
//   - Solve submits one request and returns the task once it has ended: one
//     request (POST /v1/tasks?wait=) answered from the task's own end
//     event, then long polls should the wait run out;
//   - Submit submits one request and returns the task at once (or, with
//     WithWait, when it ends or the wait passes); Wait and Get read it
//     later by its ID;
//   - SubmitBatch submits a batch: BatchOf some Requests, an NDJSONBatch
//     streamed from a Body that each retry reads again, or a JudgeBatch of
//     a judge's text input. Its results stream back in submission order
//     (Results), or as the judge's output (BatchOutput).
//
// WithWait, WithIdempotencyKey and WithWebhook configure a submission.
// The resources the client returns (Task, Batch, ...) are the API's wire
// contract, package apitype, under the client's names.
//
// # Errors
//
// An answer of the API with a status of 400 or more is an *Error carrying
// the HTTP status and the API's error code, message and field. Failing to
// reach the server at all (connection refused, DNS, timeouts), after the
// retries, gives an error for which errors.Is(err, ErrUnreachable) holds.
// A task that ran and failed is not a Go error of the call that read it:
// its State is "failed" and its Error says why, and ResultOf answers it
// with a *NotCompletedError.
//
// # Retries
//
// Transient failures (network errors, 5xx, 429) are retried with
// exponential backoff and full jitter, waiting at least as long as the
// server's Retry-After, and never beyond the context's deadline. Requests
// that could create work twice are retried only when that cannot happen:
// Submit, Solve and SubmitBatch are retried on 429 and 503, on failures to
// connect and when the server closed the kept-alive connection it went
// out on while idle, and SubmitBatch with WithIdempotencyKey is retried on
// every transient failure, since the server answers a repeated key with
// the batch the first request created. A results stream that breaks is
// requested again and resumes after the last line it yielded.
//
// # Tracing
//
// Every request carries the trace context of its ctx, written by the
// program's global OpenTelemetry propagator: after
// otel.SetTextMapPropagator(propagation.TraceContext{}), a call made
// inside a span sends its traceparent, and the API's and the worker's
// spans of that request join the caller's trace. Without a propagator
// set, nothing is sent.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/puzzleq/puzzleq/apitype"
)

// TaskState is where a task is in its lifecycle; see apitype.TaskState.
type TaskState = apitype.TaskState

// Task states.
const (
	StatePending   = apitype.TaskStatePending
	StateActive    = apitype.TaskStateActive
	StateCompleted = apitype.TaskStateCompleted
	StateFailed    = apitype.TaskStateFailed
	StateCanceled  = apitype.TaskStateCanceled
)

// Client talks to one puzzleq API. It is safe for concurrent use.
type Client struct {
	base        string
	hc          *http.Client
	apiKey      string
	userAgent   string
	maxRetries  int
	minBackoff  time.Duration
	maxBackoff  time.Duration
	timeout     time.Duration
	sleep       func(ctx context.Context, d time.Duration) error
	onRetryHook func(attempt int, err error, wait time.Duration)
	// noResultsGzip asks for results streams as they are.
	noResultsGzip bool
}

// Option configures a Client.
type Option func(*Client)

// WithAPIKey sends key as "Authorization: Bearer <key>". An empty key
// sends nothing.
func WithAPIKey(key string) Option { return func(c *Client) { c.apiKey = key } }

// WithHTTPClient uses hc for every request instead of a client of its own.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithRetries sets how many times a transient failure is retried (default
// 6). Zero disables retries. Retries of 429 answers are not counted: the
// server is up and says when to come back, so they go on until the
// context ends.
func WithRetries(n int) Option { return func(c *Client) { c.maxRetries = max(n, 0) } }

// WithBackoff sets the first and the longest wait between retries
// (defaults 100ms and 5s). Each wait is drawn uniformly from [0, d] with d
// doubling from min up to max, and is at least the server's Retry-After.
func WithBackoff(min, max time.Duration) Option {
	return func(c *Client) { c.minBackoff, c.maxBackoff = min, max }
}

// WithTimeout bounds each attempt of a request (default 30s); a long
// poll's wait is added to it.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// WithRetryHook calls f before each retry with the attempt number (1 for
// the first retry), the error that caused it and the wait, e.g. to log it.
func WithRetryHook(f func(attempt int, err error, wait time.Duration)) Option {
	return func(c *Client) { c.onRetryHook = f }
}

// WithoutResultsGzip asks for batch results (Results) uncompressed. A
// results stream is gzipped by default, which saves most of its bytes on
// a network and costs CPU at both ends: for a server on the same machine
// the bytes are free and the CPU is not.
func WithoutResultsGzip() Option { return func(c *Client) { c.noResultsGzip = true } }

// New returns a client of the API at baseURL, e.g. "http://localhost:8080".
func New(baseURL string, opts ...Option) *Client {
	c := &Client{
		base:       strings.TrimRight(baseURL, "/"),
		userAgent:  "puzzleq-go-client",
		maxRetries: 6,
		minBackoff: 100 * time.Millisecond,
		maxBackoff: 5 * time.Second,
		timeout:    30 * time.Second,
		sleep:      sleepCtx,
	}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		// A results stream of a million lines is read, and a batch body
		// written, in 4 KiB syscalls by default.
		tr.ReadBufferSize, tr.WriteBufferSize = 64<<10, 64<<10
		c.hc = &http.Client{Transport: tr}
	}
	if c.minBackoff <= 0 {
		c.minBackoff = time.Millisecond
	}
	if c.maxBackoff < c.minBackoff {
		c.maxBackoff = c.minBackoff
	}
	return c
}

// CloseIdleConnections closes the idle keep-alive connections of the
// client's HTTP transport.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// BaseURL returns the API's base URL.
func (c *Client) BaseURL() string { return c.base }

// The resources of the API are the wire contract's (package apitype),
// under the client's names.
type (
	// Task is the task resource. Terminal reports whether it has ended;
	// Progress is set while a long search runs.
	Task = apitype.Task
	// TaskError says why a task failed or was canceled.
	TaskError = apitype.TaskError
	// Progress is a long search's latest report.
	Progress = apitype.Progress
	// Counts are a batch's tasks per state; Ended counts those that ended.
	Counts = apitype.Counts
	// Batch is the batch resource: counts, whether every task has ended,
	// and one page of its tasks in submission order.
	Batch = apitype.Batch
)

// BatchSubmission is the answer to SubmitBatch: the
// batch's ID and size, and its items' IDs when it has at most MaxListedIDs
// items (ItemID gives any item's).
type BatchSubmission struct {
	apitype.BatchCreated
	// Replayed is true when the server answered a repeated idempotency
	// key with the batch an earlier request created.
	Replayed bool `json:"-"`
}

// Health is the answer of /healthz and /readyz.
type Health struct {
	// Live is true when /healthz answered 200.
	Live bool `json:"live"`
	// Ready is true when /readyz answered 200 (Redis answers).
	Ready bool `json:"ready"`
	// Reason is the server's message when it is not ready.
	Reason string `json:"reason,omitempty"`
}

// Error is an error answer of the API.
type Error struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Code, Message and Field are the API's error body.
	Code, Message, Field string
	// RetryAfter is the server's Retry-After, if any.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (HTTP %d", e.Message, e.StatusCode)
	if e.Code != "" {
		b.WriteString(", " + e.Code)
	}
	if e.Field != "" {
		b.WriteString(", field " + e.Field)
	}
	b.WriteString(")")
	return b.String()
}

// Temporary reports whether the same request may succeed later: 429 and
// 5xx answers.
func (e *Error) Temporary() bool {
	return e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500
}

// IsNotFound reports whether err is a 404 of the API.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.StatusCode == http.StatusNotFound
}

// ErrUnreachable is matched (errors.Is) by the errors of requests that never
// got an answer from the server, retries included.
var ErrUnreachable = errors.New("server unreachable")

type unreachableError struct {
	base string
	err  error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach %s: %v", e.base, e.err)
}
func (e *unreachableError) Unwrap() []error { return []error{ErrUnreachable, e.err} }

// Submit submits one request and returns the task: pending, or completed
// with Cached set when the server had the answer. WithWait holds the
// request until the task ends or the wait passes. It is retried only when
// the server surely created nothing (see Retries); a connection lost
// during a wait loses the task's ID, since the server sends it with the
// answer.
func (c *Client) Submit(ctx context.Context, req Request, opts ...SubmitOption) (*Task, error) {
	cl, err := taskCall(req, submitOpts(opts))
	if err != nil {
		return nil, err
	}
	var t Task
	if _, err := c.do(ctx, cl, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Solve submits one request and returns the task once it has ended: one
// request when it ends within the wait, then long polls until it ends or
// ctx does. Each wait is WithWait's, 30s by default. ResultOf reads its
// result as the solver's type.
func (c *Client) Solve(ctx context.Context, req Request, opts ...SubmitOption) (*Task, error) {
	o := submitOpts(opts)
	if o.wait <= 0 {
		o.wait = defaultWait
	}
	cl, err := taskCall(req, o)
	if err != nil {
		return nil, err
	}
	var t Task
	if _, err := c.do(ctx, cl, &t); err != nil {
		return nil, err
	}
	if t.State.Terminal() {
		return &t, nil
	}
	return c.wait(ctx, t.ID, o.wait)
}

// defaultWait is the long poll of Solve and Wait.
const defaultWait = 30 * time.Second

// Wait returns the task once it has ended, long polling (Get with a wait
// of 30s) until it does or ctx ends.
func (c *Client) Wait(ctx context.Context, id string) (*Task, error) {
	return c.wait(ctx, id, defaultWait)
}

func (c *Client) wait(ctx context.Context, id string, each time.Duration) (*Task, error) {
	for {
		t, err := c.Get(ctx, id, each)
		if err != nil || t.State.Terminal() {
			return t, err
		}
	}
}

// Get reads a task. With wait > 0 the server holds the request until the
// task ends or wait (at most the server's MAX_WAIT, 60s by default) passes.
func (c *Client) Get(ctx context.Context, id string, wait time.Duration) (*Task, error) {
	var t Task
	q := url.Values{}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	_, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/tasks/" + url.PathEscape(id), query: q, wait: wait, retry: retryAlways}, &t)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// Cancel cancels a task that has not ended and returns it. It is safe to
// repeat (and is retried when an answer is lost): a task that a cancel
// ended is returned again. Cancelling a task that completed or failed is
// an *Error with status 409.
func (c *Client) Cancel(ctx context.Context, id string) (*Task, error) {
	var t Task
	_, err := c.do(ctx, call{method: http.MethodDelete, path: "/v1/tasks/" + url.PathEscape(id), retry: retryAlways}, &t)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// Retry queues a failed or canceled batch item again, under its ID, and
// returns it, now pending. It is safe to repeat (and is retried when an
// answer is lost): an item that has not ended is returned as it is. A
// completed item, a single task's ID (submit its request again instead)
// and a cheap item whose chunk still runs other items are an *Error with
// status 409.
func (c *Client) Retry(ctx context.Context, id string) (*Task, error) {
	var t Task
	_, err := c.do(ctx, call{method: http.MethodPost, path: "/v1/tasks/" + url.PathEscape(id) + "/retry", retry: retryAlways}, &t)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// SubmitBatch submits a batch: BatchOf some Requests, an NDJSONBatch or
// a JudgeBatch. WithIdempotencyKey makes it safe to repeat, and
// WithWebhook names its completion webhook. Without a key it is retried
// only when the server surely created nothing.
//
// A batch of more than MaxListedIDs items has no TaskIDs in the answer:
// its items are ItemID(ID, 0) to ItemID(ID, Total-1) (see
// BatchSubmission.ItemID).
func (c *Client) SubmitBatch(ctx context.Context, in BatchInput, opts ...SubmitOption) (*BatchSubmission, error) {
	o := submitOpts(opts)
	switch {
	case in.err != nil:
		return nil, in.err
	case in.body.open == nil:
		return nil, errors.New("empty BatchInput: make one with BatchOf, NDJSONBatch or JudgeBatch")
	case o.waitSet:
		return nil, errors.New("WithWait applies to Submit and Solve; a batch submission takes no wait")
	}
	var q url.Values
	if in.format != "" {
		q = url.Values{"format": {in.format}}
	}
	cl := call{method: http.MethodPost, path: "/v1/batches", query: o.query(q), body: in.body,
		contentType: in.contentType, retry: retryIfNotAccepted}
	if o.idempotencyKey != "" {
		cl.header = http.Header{"Idempotency-Key": {o.idempotencyKey}}
		cl.retry = retryAlways
	}
	var s BatchSubmission
	h, err := c.do(ctx, cl, &s)
	if err != nil {
		return nil, err
	}
	s.Replayed = h.Get("Idempotent-Replayed") == "true"
	return &s, nil
}

// GetBatch reads a batch's counts and the page of its tasks starting at
// cursor ("" for the first page; then the NextCursor of the previous page),
// of at most limit tasks (0: the server's default, 100; at most 1000).
// With wait > 0 the server holds the request until every task has ended or
// wait passes.
func (c *Client) GetBatch(ctx context.Context, id, cursor string, limit int, wait time.Duration) (*Batch, error) {
	q := url.Values{}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	var b Batch
	_, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/batches/" + url.PathEscape(id), query: q, wait: wait, retry: retryAlways}, &b)
	if err != nil {
		return nil, err
	}
	return &b, nil
}

// CancelBatch cancels every task of a batch that has not ended and returns
// how many this call canceled. It is retried like any idempotent request:
// a retry finishes a cancel cut off part way, and once a cancel has ended
// the batch it returns 0 and no error. A batch that ended without a cancel
// is a 409 *Error with code apitype.CodeConflict.
func (c *Client) CancelBatch(ctx context.Context, id string) (int, error) {
	var r apitype.BatchCanceled
	_, err := c.do(ctx, call{method: http.MethodDelete, path: "/v1/batches/" + url.PathEscape(id), retry: retryAlways}, &r)
	return r.Canceled, err
}

// DeleteBatch deletes a batch whose tasks have all ended (completed,
// failed or canceled), with its results; from then on it and its tasks
// are not found. A batch with tasks that have not ended is a 409 *Error
// (CancelBatch it first, and wait). It is safe to repeat, and retried
// when an answer is lost: a repeat by the same key succeeds as the first
// did.
func (c *Client) DeleteBatch(ctx context.Context, id string) error {
	q := url.Values{"purge": {"true"}}
	_, err := c.do(ctx, call{method: http.MethodDelete, path: "/v1/batches/" + url.PathEscape(id), query: q, retry: retryAlways}, nil)
	return err
}

// DeleteTask deletes a single task that has ended; from then on it is not
// found (the result cache, shared by every request for the same puzzle,
// stays). A task that has not ended is a 409 *Error (Cancel it first); a
// batch item's ID is a 400 (DeleteBatch its batch). It is safe to repeat,
// and retried when an answer is lost.
func (c *Client) DeleteTask(ctx context.Context, id string) error {
	q := url.Values{"purge": {"true"}}
	_, err := c.do(ctx, call{method: http.MethodDelete, path: "/v1/tasks/" + url.PathEscape(id), query: q, retry: retryAlways}, nil)
	return err
}

// BatchOutput returns a finished batch's output: the judge's answer for a
// judge-format batch, JSON lines of results for a JSON one. With wait > 0
// the server first waits up to wait for the batch to end. A batch that has
// not ended, or has a task that did not complete, is a 409 *Error with code
// apitype.CodeIncomplete.
func (c *Client) BatchOutput(ctx context.Context, id string, wait time.Duration) ([]byte, error) {
	q := url.Values{}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	var out []byte
	_, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/batches/" + url.PathEscape(id) + "/output", query: q, wait: wait, retry: retryAlways, raw: &out}, nil)
	return out, err
}

// Body is a request body that each attempt of a request reads again from
// its start, as a retry must. Make one with BytesBody, ReaderAtBody or
// FuncBody; the zero Body is no body.
//
// A Body never holds a copy of what it reads: a large NDJSON file can be
// sent from disk (ReaderAtBody with an *os.File) or generated on the fly
// (FuncBody), and a retry reads it again rather than keeping the bytes of
// the first attempt.
type Body struct {
	open func() (io.Reader, error)
	size int64
}

// BytesBody is a body of b, which must not change while a request runs.
func BytesBody(b []byte) Body {
	return Body{open: func() (io.Reader, error) { return bytes.NewReader(b), nil }, size: int64(len(b))}
}

// ReaderAtBody is a body of the size bytes of r from offset 0, read with
// ReadAt (so attempts never share a file offset): an *os.File, for one.
func ReaderAtBody(r io.ReaderAt, size int64) Body {
	return Body{open: func() (io.Reader, error) { return io.NewSectionReader(r, 0, size), nil }, size: size}
}

// FuncBody is a body of size bytes that open returns afresh for each
// attempt; every reader it returns must yield the same size bytes. An
// error of open, or of reading what it returned, ends the request without
// a retry.
func FuncBody(size int64, open func() (io.Reader, error)) Body {
	return Body{open: open, size: size}
}

// Size is the body's length in bytes.
func (b Body) Size() int64 { return b.size }

// uploadRate is the slowest upload an attempt's timeout allows for, so
// that the timeout bounds the server's silence and not the size of the
// body: a 256 MiB batch on a slow link is not cut at 30s.
const uploadRate = 1 << 20 // bytes per second

func (b Body) uploadTime() time.Duration {
	return time.Duration(b.size/uploadRate) * time.Second
}

// bodyError is a failure to read a request's body: local, so it is never
// retried or called unreachable.
type bodyError struct{ err error }

func (e *bodyError) Error() string { return "read request body: " + e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

// bodyReader tags the errors of a body's reader as bodyErrors, so that
// they can be told from the transport's after the transport wraps them.
type bodyReader struct{ r io.Reader }

func (b bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		err = &bodyError{err}
	}
	return n, err
}

// MaxListedIDs is the largest batch whose submission lists its items' IDs.
const MaxListedIDs = apitype.MaxListedIDs

// ItemID is the ID of the item at index (0-based, in submission order) of
// batch batchID: "<batch_id>-<index>". Item IDs are derived, not listed,
// for a large batch.
func ItemID(batchID string, index int) string { return apitype.ItemID(batchID, index) }

// ParseItemID splits an item ID made by ItemID; ok is false for anything
// else, a single task's ID included.
func ParseItemID(id string) (batchID string, index int, ok bool) { return apitype.ParseItemID(id) }

// ItemID returns the ID of the batch's item at index, whether or not the
// answer listed TaskIDs.
func (s *BatchSubmission) ItemID(index int) string {
	if index >= 0 && index < len(s.TaskIDs) {
		return s.TaskIDs[index]
	}
	return apitype.ItemID(s.ID, index)
}

// Health checks /healthz and /readyz. A server that answers but is not
// ready is not an error: Ready is false and Reason says why.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	h := &Health{}
	if _, err := c.do(ctx, call{method: http.MethodGet, path: "/healthz", retry: retryAlways}, nil); err != nil {
		return nil, err
	}
	h.Live = true
	// One attempt: a 503 from /readyz is the answer, not a transient error.
	_, err := c.do(ctx, call{method: http.MethodGet, path: "/readyz", retry: retryNever}, nil)
	var e *Error
	switch {
	case err == nil:
		h.Ready = true
	case errors.As(err, &e):
		h.Reason = e.Message
	default:
		return nil, err
	}
	return h, nil
}

type retryPolicy int

const (
	retryNever retryPolicy = iota
	// retryIfNotAccepted retries only when the request surely created
	// nothing: 429, 503, no connection, or an idle connection the server
	// closed.
	retryIfNotAccepted
	// retryAlways retries every transient failure: idempotent requests.
	retryAlways
)

type call struct {
	method, path string
	query        url.Values
	header       http.Header
	body         Body
	contentType  string // of body; application/json when empty
	wait         time.Duration
	retry        retryPolicy
	raw          *[]byte
}

// do runs a call with retries and decodes a 2xx JSON answer into out.
func (c *Client) do(ctx context.Context, cl call, out any) (http.Header, error) {
	var h http.Header
	err := c.retrying(ctx, cl.retry, func() error {
		var err error
		h, err = c.once(ctx, cl, out)
		return err
	})
	return h, err
}

// retrying runs attempt until it succeeds, or fails in a way policy does
// not retry, or the retries or the context run out, waiting between
// attempts as the package documentation says.
func (c *Client) retrying(ctx context.Context, policy retryPolicy, attempt func() error) error {
	backoff := c.minBackoff
	retries := 0
	for n := 1; ; n++ {
		err := attempt()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return wrapCtx(ctx, err)
		}
		retryable, after, counted := c.classify(policy, err)
		if !retryable || (counted && retries >= c.maxRetries) {
			return c.final(err)
		}
		if counted {
			retries++
		}
		wait := time.Duration(rand.Int64N(int64(backoff) + 1))
		wait = max(wait, after)
		backoff = min(2*backoff, c.maxBackoff)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return c.final(err)
		}
		if c.onRetryHook != nil {
			c.onRetryHook(n, err, wait)
		}
		if serr := c.sleep(ctx, wait); serr != nil {
			return wrapCtx(ctx, c.final(err))
		}
	}
}

func wrapCtx(ctx context.Context, err error) error {
	if errors.Is(err, ctx.Err()) {
		return err
	}
	return fmt.Errorf("%w (%v)", ctx.Err(), err)
}

// final turns a network error into an unreachable error.
func (c *Client) final(err error) error {
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	var de *decodeError
	var be *bodyError
	if errors.As(err, &de) || errors.As(err, &be) {
		return err
	}
	return &unreachableError{base: c.base, err: err}
}

type decodeError struct{ err error }

func (e *decodeError) Error() string { return "decode response: " + e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }

// classify says whether err may be retried under policy, the least wait
// the server asked for, and whether the retry counts against maxRetries.
func (c *Client) classify(policy retryPolicy, err error) (retry bool, after time.Duration, counted bool) {
	if policy == retryNever {
		return false, 0, true
	}
	var e *Error
	if errors.As(err, &e) {
		switch {
		case e.StatusCode == http.StatusTooManyRequests:
			return true, e.RetryAfter, false
		case e.StatusCode == http.StatusServiceUnavailable:
			return true, e.RetryAfter, true
		case e.StatusCode == http.StatusConflict && e.Code == apitype.CodeInProgress:
			// An idempotent batch submission still being processed.
			return true, e.RetryAfter, true
		case e.StatusCode >= 500:
			return policy == retryAlways, e.RetryAfter, true
		}
		return false, 0, true
	}
	var de *decodeError
	if errors.As(err, &de) {
		return policy == retryAlways, 0, true
	}
	var be *bodyError
	if errors.As(err, &be) {
		return false, 0, true
	}
	// A network error. Without an answer a non-idempotent request may have
	// been accepted, unless the connection was never made.
	if policy == retryAlways || notConnected(err) {
		return true, 0, true
	}
	return false, 0, true
}

// notConnected reports whether err happened before the server could act
// on the request: the connection was never made, or the server closed a
// kept-alive connection while it was idle, just as the request went out
// on it (net/http's "server closed idle connection": an HTTP server
// closes only connections on which no request has started, so the
// request was not read). An API pod shutting down closes its idle
// connections, and without this a submission that met one failed with
// "cannot reach" instead of going to another replica.
func notConnected(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.Is(err, syscall.ECONNREFUSED) || serverClosedIdle(err)
}

// serverClosedIdle reports whether err is net/http's errServerClosedIdle,
// which is not exported; its text is its identity.
func serverClosedIdle(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if err.Error() == "http: server closed idle connection" {
			return true
		}
	}
	return false
}

func (c *Client) once(ctx context.Context, cl call, out any) (http.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout+cl.wait+cl.body.uploadTime())
	defer cancel()
	resp, err := c.send(ctx, cl)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if cl.raw != nil {
		*cl.raw = data
		return resp.Header, nil
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return nil, &decodeError{err}
		}
	}
	return resp.Header, nil
}

// send makes one attempt of cl and returns a 2xx answer with its body
// unread; an answer of 400 or more is an *Error.
func (c *Client) send(ctx context.Context, cl call) (*http.Response, error) {
	u := c.base + cl.path
	if len(cl.query) > 0 {
		u += "?" + cl.query.Encode()
	}
	var body io.Reader
	if cl.body.open != nil {
		r, err := cl.body.open()
		if err != nil {
			return nil, &bodyError{err}
		}
		body = bodyReader{r}
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, u, body)
	if err != nil {
		return nil, err
	}
	if cl.body.open != nil {
		// The transport sends a length only for the readers it knows;
		// a streamed body has one too, so the server can refuse a body
		// over its limit before reading it.
		req.ContentLength = cl.body.size
		req.GetBody = func() (io.ReadCloser, error) {
			r, err := cl.body.open()
			if err != nil {
				return nil, &bodyError{err}
			}
			return io.NopCloser(bodyReader{r}), nil
		}
		if cl.body.size == 0 {
			req.Body, req.GetBody = http.NoBody, nil
		}
	}
	for k, v := range cl.header {
		req.Header[k] = v
	}
	if cl.body.open != nil {
		ct := cl.contentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "application/json")
	}
	req.Header.Set("User-Agent", c.userAgent)
	// The caller's trace context (W3C traceparent, or whatever the
	// program's global propagator writes) goes with every request, so
	// the API's spans join the caller's trace. Until the program sets a
	// propagator (otel.SetTextMapPropagator) this writes nothing.
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var be *bodyError
		if errors.As(err, &be) {
			return nil, be
		}
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err != nil {
			return nil, err
		}
		return nil, apiError(resp, data)
	}
	return resp, nil
}

func apiError(resp *http.Response, data []byte) *Error {
	e := &Error{StatusCode: resp.StatusCode}
	var body apitype.ErrorBody
	if json.Unmarshal(data, &body) == nil && body.Error.Message != "" {
		e.Code, e.Message, e.Field = body.Error.Code, body.Error.Message, body.Error.Field
	} else {
		e.Message = strings.TrimSpace(string(data))
		if len(e.Message) > 200 {
			e.Message = e.Message[:200] + "..."
		}
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		if n, err := strconv.Atoi(ra); err == nil && n >= 0 {
			e.RetryAfter = time.Duration(n) * time.Second
		} else if t, err := http.ParseTime(ra); err == nil {
			e.RetryAfter = max(time.Until(t), 0)
		}
	}
	return e
}

// sleepCtx sleeps d or until ctx ends (Client.sleep's default).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
