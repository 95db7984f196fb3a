package tasks

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
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

// SolvesOn reports whether an asynq server that serves queues has
// solver slots: a worker's webhook server and its cheap lane's server
// (CheapQueues) do not, and their slots are no solver's. It is for a
// reader of asynq's server list (asynq.Inspector.Servers, asynqmon's
// data) that counts solver slots; puzzleq's own status reads the
// workers' heartbeats instead.
func SolvesOn(queues map[string]int) bool {
	for _, q := range Queues {
		if queues[q] > 0 {
			return true
		}
	}
	return false
}

// WebhookPayload names the webhook to deliver: "b:<batch ID>" or
// "t:<task ID>", and the API key whose record it reports on, whose share
// of the delivery slots it takes ("" with auth off).
type WebhookPayload struct {
	Ref   string `json:"ref"`
	Owner string `json:"owner,omitempty"`
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

// NewWebhookTask builds the delivery task of p's webhook.
func NewWebhookTask(p WebhookPayload, o WebhookOptions) (*asynq.Task, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("tasks: encode webhook payload: %w", err)
	}
	return asynq.NewTask(TypeWebhook, b, asynq.TaskID(WebhookTaskID(p.Ref)), asynq.Queue(QueueWebhooks),
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
