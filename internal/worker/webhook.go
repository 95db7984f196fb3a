package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/egress"
	"github.com/puzzleq/puzzleq/tasks"
	"github.com/puzzleq/puzzleq/webhook"
)

// ErrWebhookGone is returned by a WebhookStore when the webhook or the
// record it reports on is gone: nothing is left to deliver.
var ErrWebhookGone = errors.New("tasks: webhook or its record is gone")

// WebhookAttempt is the outcome of one delivery attempt.
type WebhookAttempt struct {
	// Status is the HTTP status of the answer; 0 when none came.
	Status int
	// Err says why the attempt failed; "" when it was delivered.
	Err string
	// Delivered is true for a 2xx.
	Delivered bool
}

// WebhookStore is what a delivery needs of the record store.
type WebhookStore interface {
	// WebhookDelivery returns the URL of ref's webhook, the event to
	// POST and whether an attempt was delivered already;
	// ErrWebhookGone when there is nothing to deliver.
	WebhookDelivery(ctx context.Context, ref string) (url string, ev *apitype.WebhookEvent, delivered bool, err error)
	// RecordWebhookAttempt counts an attempt and its outcome.
	RecordWebhookAttempt(ctx context.Context, ref string, a WebhookAttempt) error
	// EndWebhook takes ref out of owner's delivery backlog: it was
	// delivered, given up, or has nothing left to deliver.
	EndWebhook(ctx context.Context, owner, ref string) error
}

// WebhookHandler delivers completion webhooks.
type WebhookHandler struct {
	store  WebhookStore
	client *http.Client
	signer *webhook.Signer
	m      *Metrics // nil: none
	log    *slog.Logger
	now    func() time.Time
	pool   *DeliveryPool // nil: every delivery runs as it comes
}

// SetPool shares the deliveries' slots between keys through p (see
// DeliveryPool). Call it before the handler serves tasks.
func (h *WebhookHandler) SetPool(p *DeliveryPool) { h.pool = p }

// NewWebhookHandler returns the delivery handler. signer is nil when
// WEBHOOK_SECRET is not set: deliveries then fail (and are retried), as
// the API accepts no webhook without it. m, when set, counts attempts.
func NewWebhookHandler(st WebhookStore, p *egress.Policy, signer *webhook.Signer, o tasks.WebhookOptions, m *Metrics, log *slog.Logger) *WebhookHandler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &WebhookHandler{store: st, client: p.Client(o.Timeout), signer: signer, m: m, log: log, now: time.Now}
}

// The messages of a delivery's waits, which asynq keeps with the task.
const (
	webhookWaitMessage      = "tasks: the worker's delivery slots are taken and the key holds its share; delivers again in "
	webhookPreemptedMessage = "tasks: a key holding fewer delivery slots took this one's; delivers again in "
)

// ProcessTask makes one delivery attempt. A 2xx delivers; anything else
// is recorded and returned as an error, for asynq to retry with the
// webhook backoff.
func (h *WebhookHandler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	var p tasks.WebhookPayload
	if err := tasks.DecodePayload(t.Payload(), &p); err != nil || p.Ref == "" {
		return fmt.Errorf("tasks: bad webhook payload: %v: %w", err, asynq.SkipRetry)
	}
	if h.pool != nil {
		l, wait := h.pool.Acquire(ctx, p.Owner, lastDelivery(ctx))
		if l == nil {
			if h.m != nil {
				h.m.WebhookWaits.Inc()
			}
			return &WaitError{In: wait, Why: webhookWaitMessage}
		}
		defer l.Release()
		ctx = l.Context()
	}
	url, ev, delivered, err := h.store.WebhookDelivery(ctx, p.Ref)
	if errors.Is(err, ErrWebhookGone) {
		h.log.Info("webhook: nothing to deliver, the record is gone", "ref", p.Ref)
		h.end(ctx, p)
		return nil
	}
	if err != nil {
		return err
	}
	if delivered {
		h.end(ctx, p)
		return nil
	}
	if h.signer == nil {
		return errors.New("tasks: WEBHOOK_SECRET is not set: webhooks cannot be signed")
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("tasks: encode webhook event: %w", err)
	}
	id := "msg_" + strings.ReplaceAll(p.Ref, ":", "_")
	status, derr := deliver(ctx, h.client, h.signer, url, id, body, h.now())
	if errors.Is(context.Cause(ctx), ErrPreempted) {
		// Another key's delivery took the slot: this attempt is not the
		// receiver's failure, and is neither recorded nor counted as a
		// retry. The receiver may have had the request; the next
		// attempt carries the same webhook-id.
		if h.m != nil {
			h.m.WebhookPreemptions.Inc()
		}
		h.log.Info("webhook attempt preempted by another key's delivery", "ref", p.Ref, "key", p.Owner)
		return &WaitError{In: time.Second + rand.N(time.Second), Why: webhookPreemptedMessage}
	}
	a := WebhookAttempt{Status: status, Delivered: derr == nil && status/100 == 2}
	switch {
	case derr != nil:
		a.Err = derr.Error()
		if len(a.Err) > 300 {
			a.Err = a.Err[:300]
		}
	case !a.Delivered:
		a.Err = fmt.Sprintf("the receiver answered %d", status)
	}
	if h.m != nil {
		outcome := "failed"
		if a.Delivered {
			outcome = "delivered"
		}
		h.m.WebhookAttempts.WithLabelValues(outcome).Inc()
	}
	if err := h.store.RecordWebhookAttempt(context.WithoutCancel(ctx), p.Ref, a); err != nil {
		h.log.Warn("webhook: record attempt", "ref", p.Ref, "err", err)
	}
	if a.Delivered || lastDelivery(ctx) {
		h.end(ctx, p)
	}
	if !a.Delivered {
		h.log.Info("webhook attempt failed", "ref", p.Ref, "status", status, "err", a.Err)
		return fmt.Errorf("webhook %s: %s", p.Ref, a.Err)
	}
	return nil
}

// end takes p out of its key's delivery backlog. A failure is only
// logged: the ref leaves the count when its backlog entry ages out.
func (h *WebhookHandler) end(ctx context.Context, p tasks.WebhookPayload) {
	if err := h.store.EndWebhook(context.WithoutCancel(ctx), p.Owner, p.Ref); err != nil {
		h.log.Warn("webhook: end backlog entry", "ref", p.Ref, "err", err)
	}
}

// deliver POSTs body to url with the Standard Webhooks headers, reads at
// most egress.MaxResponseBytes of the answer, and returns its status.
func deliver(ctx context.Context, c *http.Client, s *webhook.Signer, url, id string, body []byte, now time.Time) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		return 0, err
	}
	ts := now.Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "puzzleq-webhooks/1")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", s.Sign(id, ts, body))
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, egress.MaxResponseBytes))
	resp.Body.Close()
	return resp.StatusCode, nil
}
