package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/webhook"
)

// TypeWebhook is the task that delivers one completion webhook.
const TypeWebhook = "webhook:deliver"

// QueueWebhooks holds webhook deliveries, apart from the solves: a slow
// receiver never holds a puzzle's place, nor a batch a receiver's. Every
// worker serves it from an asynq server of its own, on
// WEBHOOK_CONCURRENCY slots: a delivery waits on a receiver for up to
// WEBHOOK_TIMEOUT, and a pile of deliveries to a receiver that never
// answers held every solver slot while the deliveries shared them.
const QueueWebhooks = "webhooks"

// SolvesOn reports whether an asynq server that serves queues runs
// solves: a worker's webhook server does not, and its slots are no
// solver's (the per-key cap of expensive work and GET /v1/status count
// solver slots only).
func SolvesOn(queues map[string]int) bool {
	for _, q := range Queues {
		if queues[q] > 0 {
			return true
		}
	}
	return false
}

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
}

// WebhookPayload names the webhook to deliver: "b:<batch ID>" or
// "t:<task ID>".
type WebhookPayload struct {
	Ref string `json:"ref"`
}

// WebhookOptions are the delivery settings (WEBHOOK_* in internal/app,
// where their defaults are stated).
type WebhookOptions struct {
	// Timeout bounds one attempt.
	Timeout time.Duration
	// MaxRetry is how many times a failed attempt is retried.
	MaxRetry int
	// RetryBase and RetryMax shape the backoff: RetryBase doubled per
	// retry, at most RetryMax (see WebhookRetryDelay).
	RetryBase, RetryMax time.Duration
}

// webhookRetention keeps a finished delivery task in asynq for a day, so
// that enqueueing it again (a reconciler whose acknowledgement was lost)
// is a task ID conflict and not a second delivery.
const webhookRetention = 24 * time.Hour

// WebhookTaskID is the asynq task ID of ref's delivery: one per webhook.
func WebhookTaskID(ref string) string { return "webhook:" + ref }

// NewWebhookTask builds the delivery task of ref's webhook.
func NewWebhookTask(ref string, o WebhookOptions) (*asynq.Task, error) {
	b, err := json.Marshal(WebhookPayload{Ref: ref})
	if err != nil {
		return nil, fmt.Errorf("tasks: encode webhook payload: %w", err)
	}
	return asynq.NewTask(TypeWebhook, b, asynq.TaskID(WebhookTaskID(ref)), asynq.Queue(QueueWebhooks),
		asynq.MaxRetry(o.MaxRetry), asynq.Timeout(o.Timeout+10*time.Second), asynq.Retention(webhookRetention)), nil
}

// WebhookRetryDelay is the wait before retry n (0-based) of a delivery:
// base doubled n times, at most max, less up to a tenth at random so that
// receivers that were down are not hit all at once when they return.
func WebhookRetryDelay(n int, base, max time.Duration, jitter func(time.Duration) time.Duration) time.Duration {
	d := base
	for i := 0; i < n && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	if jitter != nil && d >= 10 {
		d -= jitter(d / 10)
	}
	return d
}

// WebhookHandler delivers completion webhooks.
type WebhookHandler struct {
	store  WebhookStore
	client *http.Client
	signer *webhook.Signer
	m      *Metrics // nil: none
	log    *slog.Logger
	now    func() time.Time
}

// NewWebhookHandler returns the delivery handler. signer is nil when
// WEBHOOK_SECRET is not set: deliveries then fail (and are retried), as
// the API accepts no webhook without it. m, when set, counts attempts.
func NewWebhookHandler(st WebhookStore, p *webhook.Policy, signer *webhook.Signer, o WebhookOptions, m *Metrics, log *slog.Logger) *WebhookHandler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &WebhookHandler{store: st, client: p.Client(o.Timeout), signer: signer, m: m, log: log, now: time.Now}
}

// ProcessTask makes one delivery attempt. A 2xx delivers; anything else
// is recorded and returned as an error, for asynq to retry with the
// webhook backoff.
func (h *WebhookHandler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	var p WebhookPayload
	if err := decodePayload(t.Payload(), &p); err != nil || p.Ref == "" {
		return fmt.Errorf("tasks: bad webhook payload: %v: %w", err, asynq.SkipRetry)
	}
	url, ev, delivered, err := h.store.WebhookDelivery(ctx, p.Ref)
	if errors.Is(err, ErrWebhookGone) {
		h.log.Info("webhook: nothing to deliver, the record is gone", "ref", p.Ref)
		return nil
	}
	if err != nil {
		return err
	}
	if delivered {
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
	status, derr := webhook.Deliver(ctx, h.client, h.signer, url, id, body, h.now())
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
	if !a.Delivered {
		h.log.Info("webhook attempt failed", "ref", p.Ref, "status", status, "err", a.Err)
		return fmt.Errorf("webhook %s: %s", p.Ref, a.Err)
	}
	return nil
}
