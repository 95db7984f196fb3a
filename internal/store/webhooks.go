package store

// Completion webhooks (README, "Webhooks"): a task or batch submitted
// with a webhook gets a webhook hash (keys.webhook) and a member of the
// watch set (keys.webhookWatch) before its record is made. The
// reconciler looks at the watched refs (DueWebhooks), enqueues a
// delivery task for each whose record has ended and only then unwatches
// it (AckWebhook), so no crash between the end and the enqueue drops a
// delivery: it is made by whichever replica looks next. The worker's
// delivery records every attempt in the hash (RecordWebhookAttempt),
// which GET shows.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/worker"
	"github.com/puzzleq/puzzleq/tasks"
)

// WebhookRef names the record a webhook belongs to: "b:<id>" for a batch,
// "t:<id>" for a single task.
func WebhookRef(batch bool, id string) string {
	if batch {
		return "b:" + id
	}
	return "t:" + id
}

// parseRef splits a WebhookRef.
func parseRef(ref string) (batch bool, id string, ok bool) {
	kind, id, found := strings.Cut(ref, ":")
	if !found || id == "" || (kind != "b" && kind != "t") {
		return false, "", false
	}
	return kind == "b", id, true
}

// webhookOrphanAge is how long a watched ref may have no record before it
// is dropped: its record is made right after the ref (the commit follows
// the watch within one request), so an older ref without one belongs to
// a submission that failed or whose process died before its commit.
const webhookOrphanAge = time.Minute

// WatchWebhook records the webhook url of ref and watches it. Call it
// before the record is made, so the webhook is there when it ends.
func (s *Store) WatchWebhook(ctx context.Context, ref, url string) error {
	now := s.now()
	wk := s.k.webhook(ref)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, wk, "url", url, "created_at", ms(now), "attempts", 0)
		// The record lives TaskTTL from a moment later; the hash a
		// little longer, so the record never shows a webhook gone.
		p.PExpire(ctx, wk, s.taskTTL+time.Minute)
		p.ZAdd(ctx, s.k.webhookWatch(), redis.Z{Score: float64(ms(now)), Member: ref})
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: watch webhook %s: %w", ref, err)
	}
	return nil
}

// UnwatchWebhook forgets the webhook of a submission that was not made.
func (s *Store) UnwatchWebhook(ctx context.Context, ref string) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, s.k.webhookWatch(), ref)
		p.Del(ctx, s.k.webhook(ref))
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: unwatch webhook %s: %w", ref, err)
	}
	return nil
}

// DueWebhooks looks at up to limit watched refs from offset (in the order
// they were watched) and returns those whose record has ended, with the
// record's owner, for the caller to enqueue and then AckWebhook. Refs whose record is gone (it
// expired, or was never made) are dropped. next is the offset to look
// from next time: 0 once the end of the set was reached.
func (s *Store) DueWebhooks(ctx context.Context, offset, limit int) (due []tasks.WebhookPayload, next int, err error) {
	zs, err := s.rdb.ZRangeWithScores(ctx, s.k.webhookWatch(), int64(offset), int64(offset+limit-1)).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("store: due webhooks: %w", err)
	}
	if len(zs) == 0 {
		return nil, 0, nil
	}
	cmds := make([]*redis.SliceCmd, len(zs))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, z := range zs {
			ref, _ := z.Member.(string)
			batch, id, ok := parseRef(ref)
			switch {
			case !ok:
				cmds[i] = nil
			case batch:
				cmds[i] = p.HMGet(ctx, s.k.batch(id), "total", "ended", "owner")
			default:
				cmds[i] = p.HMGet(ctx, s.k.task(id), "state", "owner")
			}
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("store: due webhooks: %w", err)
	}
	now := ms(s.now())
	var drop []any
	for i, z := range zs {
		ref, _ := z.Member.(string)
		if cmds[i] == nil {
			drop = append(drop, ref)
			continue
		}
		v := cmds[i].Val()
		if len(v) == 0 || v[0] == nil {
			if now-int64(z.Score) > webhookOrphanAge.Milliseconds() {
				drop = append(drop, ref)
			}
			continue
		}
		owner, _ := v[len(v)-1].(string)
		if len(v) == 3 {
			total, _ := strconv.Atoi(fmt.Sprint(v[0]))
			ended, _ := strconv.Atoi(fmt.Sprint(v[1]))
			if ended >= total {
				due = append(due, tasks.WebhookPayload{Ref: ref, Owner: owner})
			}
		} else if apitype.TaskState(fmt.Sprint(v[0])).Terminal() {
			due = append(due, tasks.WebhookPayload{Ref: ref, Owner: owner})
		}
	}
	if len(drop) > 0 {
		if err := s.rdb.ZRem(ctx, s.k.webhookWatch(), drop...).Err(); err != nil {
			return due, 0, fmt.Errorf("store: drop gone webhooks: %w", err)
		}
	}
	next = offset + len(zs) - len(drop) - len(due)
	if len(zs) < limit {
		next = 0
	}
	return due, next, nil
}

// AckWebhook unwatches webhooks whose delivery is enqueued and adds each
// to its key's delivery backlog (keys.webhookBacklog), in one
// transaction; acking one twice changes nothing.
func (s *Store) AckWebhook(ctx context.Context, due ...tasks.WebhookPayload) error {
	if len(due) == 0 {
		return nil
	}
	now := float64(ms(s.now()))
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, d := range due {
			p.ZAddNX(ctx, s.k.webhookBacklog(d.Owner), redis.Z{Score: now, Member: d.Ref})
			p.PExpire(ctx, s.k.webhookBacklog(d.Owner), s.webhookBacklogAge())
			p.SAdd(ctx, s.k.webhookBacklogKeys(), d.Owner)
			p.ZRem(ctx, s.k.webhookWatch(), d.Ref)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: ack webhooks: %w", err)
	}
	return nil
}

// webhookBacklogAge is how long a ref stays in its key's backlog at most:
// as long as its webhook hash, after which a delivery finds nothing to
// deliver. A ref whose delivery ended without EndWebhook (its task was
// deleted from asynq) leaves the count then.
func (s *Store) webhookBacklogAge() time.Duration { return s.taskTTL + time.Minute }

// EndWebhook takes ref out of owner's delivery backlog: it was delivered,
// or is given up, or has nothing left to deliver.
func (s *Store) EndWebhook(ctx context.Context, owner, ref string) error {
	if err := s.rdb.ZRem(ctx, s.k.webhookBacklog(owner), ref).Err(); err != nil {
		return fmt.Errorf("store: end webhook %s: %w", ref, err)
	}
	return nil
}

// webhookBacklogScript counts one key's delivery backlog, first dropping
// refs older than the backlog's age, and forgets the key when none is
// left, atomically with AckWebhook's additions.
//
// KEYS[1] the key's backlog (keys.webhookBacklog)
// KEYS[2] the set of keys with a backlog (keys.webhookBacklogKeys)
// ARGV[1] the key's name (its member of KEYS[2])
// ARGV[2] the oldest score kept, Unix ms
//
// Returns the count.
var webhookBacklogScript = redis.NewScript(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2])
local n = redis.call('ZCARD', KEYS[1])
if n == 0 then redis.call('SREM', KEYS[2], ARGV[1]) end
return n
`)

// maxBacklogKeys bounds how many keys WebhookBacklog reports: the keys
// are the operator's API keys, so the bound is never met in practice.
const maxBacklogKeys = 1000

// WebhookBacklog returns each API key's delivery backlog: the webhooks
// enqueued and neither delivered nor given up (keys with none are left
// out).
func (s *Store) WebhookBacklog(ctx context.Context) (map[string]int64, error) {
	owners, err := s.rdb.SRandMemberN(ctx, s.k.webhookBacklogKeys(), maxBacklogKeys).Result()
	if err != nil {
		return nil, fmt.Errorf("store: webhook backlog: %w", err)
	}
	oldest := strconv.FormatInt(ms(s.now().Add(-s.webhookBacklogAge())), 10)
	// One call per key, not a pipeline: Run loads the script again after
	// a Redis restart, and the keys are few.
	m := make(map[string]int64, len(owners))
	for _, o := range owners {
		n, err := webhookBacklogScript.Run(ctx, s.rdb, []string{s.k.webhookBacklog(o), s.k.webhookBacklogKeys()}, o, oldest).Int64()
		if err != nil {
			return nil, fmt.Errorf("store: webhook backlog of %q: %w", o, err)
		}
		if n > 0 {
			m[o] = n
		}
	}
	return m, nil
}

// Watched reports how many webhooks wait for their record to end, for
// tests and metrics.
func (s *Store) Watched(ctx context.Context) (int64, error) {
	return s.rdb.ZCard(ctx, s.k.webhookWatch()).Result()
}

// webhookOf decodes a webhook hash; nil when there is none.
func webhookOf(m map[string]string) *apitype.Webhook {
	if m["url"] == "" {
		return nil
	}
	w := &apitype.Webhook{URL: m["url"]}
	w.Attempts, _ = strconv.Atoi(m["attempts"])
	if v, err := strconv.Atoi(m["last_status"]); err == nil && v > 0 {
		w.LastStatus = &v
	}
	if v := m["last_error"]; v != "" {
		w.LastError = &v
	}
	if t := msTime(m["last_attempt_at"]); !t.IsZero() {
		w.LastAttemptAt = &t
	}
	if t := msTime(m["delivered_at"]); !t.IsZero() {
		w.DeliveredAt = &t
	}
	return w
}

// WebhookDelivery returns what to POST for ref: its URL, the event, and
// whether an attempt was delivered already. worker.ErrWebhookGone when the
// webhook or its record is gone.
func (s *Store) WebhookDelivery(ctx context.Context, ref string) (string, *apitype.WebhookEvent, bool, error) {
	batch, id, ok := parseRef(ref)
	if !ok {
		return "", nil, false, worker.ErrWebhookGone
	}
	ev := &apitype.WebhookEvent{Timestamp: s.now().UTC()}
	var (
		data any
		w    *apitype.Webhook
		err  error
	)
	if batch {
		var b *Batch
		if b, err = s.GetBatch(ctx, id); err == nil {
			w, ev.Type, data = b.Webhook, apitype.WebhookBatchDone, batchSummary(b, b.Webhook)
		}
	} else {
		var t *Task
		if t, err = s.Get(ctx, id); err == nil {
			w, ev.Type, data = t.Webhook, apitype.WebhookTaskDone, taskResource(t, t.Webhook)
		}
	}
	if errors.Is(err, ErrNotFound) || (err == nil && w == nil) {
		return "", nil, false, worker.ErrWebhookGone
	}
	if err != nil {
		return "", nil, false, err
	}
	if ev.Data, err = json.Marshal(data); err != nil {
		return "", nil, false, fmt.Errorf("store: encode webhook event: %w", err)
	}
	return w.URL, ev, w.DeliveredAt != nil, nil
}

// RecordWebhookAttempt counts a delivery attempt of ref's webhook with
// its outcome: the HTTP status (0 when none came) and an error message
// ("" when it was delivered).
func (s *Store) RecordWebhookAttempt(ctx context.Context, ref string, a worker.WebhookAttempt) error {
	wk := s.k.webhook(ref)
	now := ms(s.now())
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HIncrBy(ctx, wk, "attempts", 1)
		p.HSet(ctx, wk, "last_status", a.Status, "last_error", a.Err, "last_attempt_at", now)
		if a.Delivered {
			p.HSetNX(ctx, wk, "delivered_at", now)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: record webhook attempt %s: %w", ref, err)
	}
	return nil
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// batchSummary renders a batch as the data of a batch.done event: the
// Batch resource without its tasks.
func batchSummary(b *Batch, w *apitype.Webhook) apitype.Batch {
	r := apitype.Batch{ID: b.ID, Total: b.Total, Done: b.Done(),
		Counts: apitype.Counts{Pending: b.Counts[apitype.TaskStatePending], Active: b.Counts[apitype.TaskStateActive],
			Completed: b.Counts[apitype.TaskStateCompleted], Failed: b.Counts[apitype.TaskStateFailed],
			Canceled: b.Counts[apitype.TaskStateCanceled]},
		CreatedAt: optTime(b.CreatedAt), DoneAt: optTime(b.DoneAt), Tasks: []apitype.Task{}, Webhook: w}
	if b.Format != "" {
		f := b.Format
		r.Format = &f
	}
	return r
}

// taskResource renders a single task as the data of a task.done event.
func taskResource(t *Task, w *apitype.Webhook) apitype.Task {
	r := apitype.Task{ID: t.ID, CustomID: t.CustomID, Kind: t.Kind, State: t.State, Result: t.Result, Cached: t.Cached,
		CreatedAt: optTime(t.CreatedAt), StartedAt: optTime(t.StartedAt), CompletedAt: optTime(t.CompletedAt),
		Attempts: t.Attempts, Progress: t.Progress, Webhook: w}
	if t.ErrCode != "" {
		r.Error = &apitype.TaskError{Code: t.ErrCode, Message: t.ErrMsg}
	}
	return r
}
