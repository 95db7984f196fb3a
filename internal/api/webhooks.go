package api

import (
	"bytes"
	"context"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/puzzleq/puzzleq/apitype"
)

// WebhookStore is what the API needs of the store for completion
// webhooks (store/webhooks.go).
type WebhookStore interface {
	// WatchWebhook records ref's webhook before its record is made.
	WatchWebhook(ctx context.Context, ref, url string) error
	// UnwatchWebhook forgets the webhook of a submission that failed.
	UnwatchWebhook(ctx context.Context, ref string) error
}

// webhookParam is the query parameter naming a webhook: for NDJSON and
// judge uploads, whose bodies have no place for it (a JSON body may name
// it in its "webhook" field instead).
const webhookParam = "webhook"

// checkWebhook checks a webhook URL against the policy (SECURITY.md):
// a 400 naming the field "webhook" when it is refused.
func (s *Server) checkWebhook(ctx context.Context, url string) error {
	if !s.opts.WebhooksEnabled {
		return newError(http.StatusBadRequest, apitype.CodeInvalidRequest, webhookParam,
			"webhooks are not enabled on this server (WEBHOOK_SECRET is not set)")
	}
	if err := s.opts.WebhookPolicy.CheckURL(ctx, s.opts.Resolver, url); err != nil {
		return newError(http.StatusBadRequest, apitype.CodeInvalidRequest, webhookParam, "%s", err.Error())
	}
	return nil
}

// queryWebhook returns the ?webhook= of the request, checked; "" when
// there is none.
func (s *Server) queryWebhook(c *gin.Context) (string, error) {
	v, ok := c.GetQuery(webhookParam)
	if !ok {
		return "", nil
	}
	if v == "" {
		return "", newError(http.StatusBadRequest, apitype.CodeInvalidRequest, webhookParam, "webhook must be a URL")
	}
	return v, s.checkWebhook(c.Request.Context(), v)
}

// errTwoWebhooks answers a request that names a webhook twice.
var errTwoWebhooks = newError(http.StatusBadRequest, apitype.CodeInvalidRequest, webhookParam,
	"the webhook is named both in the query and in the body; name it once")

// splitWebhook takes the "webhook" member out of a single task's JSON
// body, returning its value and the body without it, for puzzle.Decode
// (which knows requests, not webhooks). Only a body that mentions
// "webhook" is re-read, so others cost nothing more. A body that is not
// an object is returned as it is, for Decode to refuse.
func splitWebhook(body []byte) (url string, found bool, rest []byte, err error) {
	if !bytes.Contains(body, []byte(`"webhook"`)) {
		return "", false, body, nil
	}
	dec := jsontext.NewDecoder(bytes.NewReader(body))
	tok, terr := dec.ReadToken()
	if terr != nil || tok.Kind() != '{' {
		return "", false, body, nil
	}
	var out bytes.Buffer
	out.WriteByte('{')
	n := 0
	for dec.PeekKind() != '}' {
		tok, nerr := dec.ReadToken()
		if nerr != nil || tok.Kind() != '"' {
			return "", false, body, nil
		}
		name := tok.String() // read before the decoder moves on, which voids tok
		v, verr := dec.ReadValue()
		if verr != nil {
			return "", false, body, nil
		}
		if name == "webhook" {
			if found {
				return "", false, nil, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, webhookParam, `duplicate field "webhook"`)
			}
			if v.Kind() != '"' {
				return "", false, nil, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, webhookParam, "webhook: expected a string")
			}
			var s string
			if uerr := jsontextString(v, &s); uerr != nil {
				return "", false, nil, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, webhookParam, "webhook: %v", uerr)
			}
			url, found = s, true
			continue
		}
		if n > 0 {
			out.WriteByte(',')
		}
		n++
		nb, _ := jsontext.AppendQuote(nil, name)
		out.Write(nb)
		out.WriteByte(':')
		out.Write(v)
	}
	if _, err := dec.ReadToken(); err != nil {
		return "", false, body, nil
	}
	out.WriteByte('}')
	if _, err := dec.ReadToken(); err == nil {
		// Data after the object: Decode says what is wrong with it.
		return "", false, body, nil
	}
	return url, found, out.Bytes(), nil
}

// jsontextString unquotes a JSON string value.
func jsontextString(v jsontext.Value, s *string) error {
	b, err := jsontext.AppendUnquote(nil, v)
	if err != nil {
		return err
	}
	*s = string(b)
	return nil
}

// watchWebhook records ref's webhook, when there is one, before its
// record is made; the returned func forgets it again, for a submission
// that failed (run it under s.undo, which bounds it).
func (s *Server) watchWebhook(ctx context.Context, ref, url string) (undo func(context.Context), err error) {
	if url == "" {
		return func(context.Context) {}, nil
	}
	if err := s.store.WatchWebhook(ctx, ref, url); err != nil {
		return nil, err
	}
	return func(ctx context.Context) {
		if err := s.store.UnwatchWebhook(ctx, ref); err != nil {
			s.log.Warn("forget the webhook of a failed submission", "ref", ref, "err", err)
		}
	}, nil
}
