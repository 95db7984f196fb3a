package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/puzzleq/puzzleq/solvers/fill"
	"github.com/puzzleq/puzzleq/solvers/sliding"
	"github.com/puzzleq/puzzleq/solvers/sweep"
)

// Request is one puzzle to solve: the body of POST /v1/tasks, or one item
// of a batch. Make one with Sliding, Sweep or Fill from the solver's own
// types, or with RawRequest from JSON; the zero Request is invalid.
type Request struct {
	body     json.RawMessage
	customID string
	err      error
}

// wireRequest is the JSON of a Request.
type wireRequest struct {
	CustomID string `json:"custom_id,omitempty"`
	Kind     string `json:"kind"`
	Puzzle   any    `json:"puzzle"`
	Options  any    `json:"options,omitempty"`
}

// newRequest encodes a request of kind; options that encode to {} (the
// defaults) are left out.
func newRequest(kind string, puzzle, options any) Request {
	o, err := json.Marshal(options)
	if err != nil {
		return Request{err: fmt.Errorf("encode %s options: %w", kind, err)}
	}
	w := wireRequest{Kind: kind, Puzzle: puzzle}
	if !bytes.Equal(o, []byte("{}")) {
		w.Options = json.RawMessage(o)
	}
	b, err := json.Marshal(w)
	if err != nil {
		return Request{err: fmt.Errorf("encode %s puzzle: %w", kind, err)}
	}
	return Request{body: b}
}

// Sliding is a request to solve a sliding-tile board; its result is a
// sliding.Result.
func Sliding(p sliding.Puzzle, o sliding.Options) Request { return newRequest("sliding", p, o) }

// Sweep is a request to solve a rolling-ball board; its result is a
// sweep.Result.
func Sweep(p sweep.Puzzle, o sweep.Options) Request { return newRequest("sweep", p, o) }

// Fill is a request to fit a table's pieces into a game board's holes;
// its result is a fill.Result.
func Fill(p fill.Puzzle, o fill.Options) Request { return newRequest("fill", p, o) }

// RawRequest is a request given as its JSON, {"kind", "puzzle",
// "options"?}, as a file or another program has it. The client sends it as
// it is, so it never drops a member the server understands; the server
// validates it.
func RawRequest(body []byte) Request {
	if !json.Valid(body) {
		return Request{err: errors.New("the request is not valid JSON")}
	}
	return Request{body: bytes.Clone(body)}
}

// WithCustomID returns the request with custom_id set: the caller's name
// for it as a batch item, echoed in its results. A single task takes none,
// and a RawRequest that names one already must not get another.
func (r Request) WithCustomID(id string) Request {
	r.customID = id
	return r
}

// json returns the request's JSON, with its custom_id when it has one.
func (r Request) json() ([]byte, error) {
	switch {
	case r.err != nil:
		return nil, r.err
	case r.body == nil:
		return nil, errors.New("empty Request: make one with Sliding, Sweep, Fill or RawRequest")
	case r.customID == "":
		return r.body, nil
	}
	id, err := json.Marshal(r.customID)
	if err != nil {
		return nil, err
	}
	// {"custom_id":...,<the rest of the object>}; a body that is not an
	// object is left for the server to refuse.
	rest := bytes.TrimLeft(r.body, " \t\r\n")
	if len(rest) == 0 || rest[0] != '{' {
		return r.body, nil
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	b := make([]byte, 0, len(r.body)+len(id)+14)
	b = append(b, `{"custom_id":`...)
	b = append(b, id...)
	if len(rest) > 0 && rest[0] != '}' {
		b = append(b, ',')
	}
	return append(b, rest...), nil
}

// MarshalJSON encodes the request as the server takes it.
func (r Request) MarshalJSON() ([]byte, error) { return r.json() }

// BatchInput is the body of a batch: its items as Requests (BatchOf), as
// an NDJSON stream (NDJSONBatch) or as a judge's text input (JudgeBatch).
type BatchInput struct {
	body        Body
	contentType string
	format      string
	err         error
}

// BatchOf is a batch of reqs, sent as {"tasks": [...]}.
func BatchOf(reqs ...Request) BatchInput {
	b := []byte(`{"tasks":[`)
	for i, r := range reqs {
		j, err := r.json()
		if err != nil {
			return BatchInput{err: fmt.Errorf("tasks[%d]: %w", i, err)}
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, j...)
	}
	b = append(b, "]}"...)
	return BatchInput{body: BytesBody(b)}
}

// NDJSONContentType is the media type of an NDJSON batch body.
const NDJSONContentType = "application/x-ndjson"

// NDJSONBatch is a batch of one request per line of body, {"custom_id"?,
// "kind", "puzzle", "options"?}, up to the server's MAX_BATCH_ITEMS items
// and MAX_BATCH_BODY_BYTES bytes (1,000,000 and 256 MiB by default). A bad
// line rejects the whole batch with a 400 *Error whose message names the
// line ("line 73412: ...").
//
// The body is streamed, not buffered: pass a ReaderAtBody of a file or a
// FuncBody that writes the lines as they are read, and each attempt reads
// it again from its start.
func NDJSONBatch(body Body) BatchInput {
	if body.open == nil {
		body = BytesBody(nil)
	}
	return BatchInput{body: body, contentType: NDJSONContentType}
}

// JudgeBatch is a batch of a judge's text input in format (boj1525,
// boj9944 or p84021): one item per case. BatchOutput then prints the
// judge's answer.
func JudgeBatch(format string, text Body) BatchInput {
	if text.open == nil {
		text = BytesBody(nil)
	}
	return BatchInput{body: text, contentType: "text/plain; charset=utf-8", format: format}
}

// SubmitOption configures one submission (Submit, Solve, SubmitBatch),
// unlike an Option, which configures the Client. An option a submission
// cannot use is an error of that submission.
type SubmitOption func(*submitOptions)

type submitOptions struct {
	webhook, idempotencyKey string
	wait                    time.Duration
	waitSet                 bool
}

// WithWait holds a Submit until the task ends or d passes (at most the
// server's MAX_WAIT, 60s by default): the task comes back ended, or
// pending or active when the wait ran out first. For Solve it is the
// length of each long poll (30s by default). A batch takes no wait.
func WithWait(d time.Duration) SubmitOption {
	return func(o *submitOptions) { o.wait, o.waitSet = max(d, 0), true }
}

// WithIdempotencyKey makes a batch submission safe to repeat: a retry, by
// this client or a later run, with the same key and the same body
// (webhook included) answers the batch the first request created
// (BatchSubmission.Replayed) instead of creating another; the same key
// with a different body is a 422 *Error. With a key, the request is
// retried on every transient failure. Single tasks take no key. An empty
// key names none.
func WithIdempotencyKey(key string) SubmitOption {
	return func(o *submitOptions) { o.idempotencyKey = key }
}

// WithWebhook names a completion webhook for the submission: the server
// POSTs a signed apitype.WebhookEvent to url once the task or batch has
// ended, which the receiver checks with Verify of package
// github.com/puzzleq/puzzleq/webhook (README, "Webhooks"). It is sent as ?webhook=, the one place every kind of body
// allows, so a JSON body must not name one too (a 400). A URL the
// server's policy refuses, or a server without WEBHOOK_SECRET, is a 400
// *Error with Field "webhook". An empty url names none.
func WithWebhook(url string) SubmitOption { return func(o *submitOptions) { o.webhook = url } }

func submitOpts(opts []SubmitOption) submitOptions {
	var o submitOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// query returns q (made when nil) with the webhook the options name.
func (o submitOptions) query(q url.Values) url.Values {
	if o.webhook == "" {
		return q
	}
	if q == nil {
		q = url.Values{}
	}
	q.Set("webhook", o.webhook)
	return q
}

// taskCall is the POST /v1/tasks of req under o.
func taskCall(req Request, o submitOptions) (call, error) {
	if o.idempotencyKey != "" {
		return call{}, errors.New("WithIdempotencyKey applies to batches; a single task takes no key")
	}
	b, err := req.json()
	if err != nil {
		return call{}, err
	}
	cl := call{method: http.MethodPost, path: "/v1/tasks", body: BytesBody(b), retry: retryIfNotAccepted}
	if o.wait > 0 {
		cl.query, cl.wait = url.Values{"wait": {o.wait.String()}}, o.wait
	}
	cl.query = o.query(cl.query)
	return cl, nil
}
