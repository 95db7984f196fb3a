// Package webhook signs and verifies puzzleq's completion webhooks as the
// Standard Webhooks specification states: an HMAC-SHA256 over
// "<webhook-id>.<webhook-timestamp>.<body>" with the WEBHOOK_SECRET key.
// A Go receiver calls Verify; the server signs with a Signer. It imports
// nothing of puzzleq's, so any module can use it.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Signer signs webhook bodies with the WEBHOOK_SECRET key.
type Signer struct{ key []byte }

// ParseSecret reads a secret in its Standard Webhooks form,
// "whsec_<base64 of 24 to 64 random bytes>".
func ParseSecret(s string) (*Signer, error) {
	b64, ok := strings.CutPrefix(s, "whsec_")
	if !ok {
		return nil, errors.New(`must be "whsec_" and the key in base64`)
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("the key is not base64: %v", err)
	}
	if len(key) < 24 || len(key) > 64 {
		return nil, fmt.Errorf("the key must be 24 to 64 bytes, got %d", len(key))
	}
	return &Signer{key: key}, nil
}

// Sign returns the webhook-signature header of a message:
// "v1,<base64 HMAC-SHA256 of id.timestamp.body>".
func (s *Signer) Sign(id string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(id + "." + strconv.FormatInt(ts, 10) + "."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Tolerance is how far a webhook-timestamp may be from the receiver's
// clock for Verify, against replays.
const Tolerance = 5 * time.Minute

// Verify checks a received webhook as a receiver should: the timestamp
// within Tolerance of now, and one of the space-separated signatures of
// the webhook-signature header the body's. It is what a Go receiver
// needs, and what the tests use.
func Verify(secret string, h http.Header, body []byte, now time.Time) error {
	s, err := ParseSecret(secret)
	if err != nil {
		return err
	}
	id, tsv, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || tsv == "" || sigs == "" {
		return errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature")
	}
	ts, err := strconv.ParseInt(tsv, 10, 64)
	if err != nil {
		return errors.New("webhook: bad webhook-timestamp")
	}
	if d := now.Sub(time.Unix(ts, 0)); d > Tolerance || d < -Tolerance {
		return errors.New("webhook: timestamp out of tolerance")
	}
	want := s.Sign(id, ts, body)
	for _, sig := range strings.Fields(sigs) {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return nil
		}
	}
	return errors.New("webhook: no signature matches")
}
