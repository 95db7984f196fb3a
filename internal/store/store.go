// Package store keeps puzzleq's own records in Redis: task records that can
// be looked up by ID alone, batches with exact per-state counts, the result
// cache, idempotency keys, and the pub/sub wake-ups behind long polls and
// cancellation. Asynq keeps the queues; this package keeps everything a
// client can ask about.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/asynqdata"
	"github.com/puzzleq/puzzleq/internal/worker"
)

// ErrNotFound is returned for a task or batch that does not exist (or has
// expired).
var ErrNotFound = errors.New("not found")

// ErrBatchEnded is CancelBatch's answer for a batch whose items all ended
// without a cancel: there is nothing to cancel, and no earlier cancel to
// confirm.
var ErrBatchEnded = errors.New("store: batch has already ended")

// Task is a task record.
type Task struct {
	ID    string
	Kind  string
	Owner string
	// BatchID is a batch item's batch (GetItem); "" for a single task.
	BatchID string
	// CustomID is a batch item's custom_id; nil when it has none.
	CustomID    *string
	State       apitype.TaskState
	Result      json.RawMessage
	ErrCode     string
	ErrMsg      string
	Cached      bool
	CreatedAt   time.Time
	StartedAt   time.Time
	CompletedAt time.Time
	Attempts    int
	// Progress is the latest progress a long search reported; nil when
	// none.
	Progress *apitype.Progress
	// Webhook is the task's completion webhook and its delivery; nil
	// when it has none (and for batch items, whose batch has it).
	Webhook *apitype.Webhook
}

// NewTask describes a task record to create.
type NewTask struct {
	ID       string
	Kind     string
	Owner    string
	CacheKey string
	// Enqueue is the task SubmitTask puts on asynq's queue with a new
	// pending record (single tasks only).
	Enqueue asynqdata.Enqueued
}

// Batch is a batch record with its counts per state.
type Batch struct {
	ID     string
	Owner  string
	Format string
	Total  int
	// Stride is how many items each chunk holds (docs/batches.md).
	Stride    int
	Counts    map[apitype.TaskState]int
	CreatedAt time.Time
	DoneAt    time.Time
	// ExpiresAt is when every key of the batch expires; zero for a batch
	// of the old layout.
	ExpiresAt time.Time
	// CanceledAt is when the batch was canceled; zero when it was not.
	CanceledAt time.Time
	// Webhook is the batch's completion webhook and its delivery; nil
	// when it has none.
	Webhook *apitype.Webhook
	// Kinds are the kinds of its items, sorted; nil for a batch
	// committed before the record kept them.
	Kinds []string
}

// Ended returns how many items of the batch have ended.
func (b *Batch) Ended() int {
	n := 0
	for st, c := range b.Counts {
		if st.Terminal() {
			n += c
		}
	}
	return n
}

// Chunks is how many chunks the batch's items are cut into.
func (b *Batch) Chunks() int {
	if b.Stride <= 0 {
		return 0
	}
	return (b.Total + b.Stride - 1) / b.Stride
}

// Done reports whether every item of the batch has ended.
func (b *Batch) Done() bool { return b.Ended() >= b.Total }

// Options configures a Store. The values come from the binary's Config
// (KEY_PREFIX, TASK_TTL, RESULT_TTL in internal/app), where their
// defaults are stated; the store adds none.
type Options struct {
	// Prefix is put before every key.
	Prefix string
	// TaskTTL is how long task and batch records live.
	TaskTTL time.Duration
	// ResultTTL is how long cached results live.
	ResultTTL time.Duration
	// AckReplicas is how many replicas must confirm a write that a 2xx
	// or a task's ack promises (REDIS_ACK_REPLICAS); 0 confirms none.
	AckReplicas int
	// AckTimeout bounds the wait for those confirmations
	// (REDIS_ACK_TIMEOUT).
	AckTimeout time.Duration
}

// Store reads and writes puzzleq's records.
type Store struct {
	rdb       redis.UniversalClient
	k         keys
	taskTTL   time.Duration
	resultTTL time.Duration
	// ackReplicas and ackTimeout are Options.AckReplicas and AckTimeout.
	ackReplicas int
	ackTimeout  time.Duration
	now         func() time.Time
	// queuesAdded holds the queues SubmitTask has added to asynq's set
	// of queues, which it then adds no more.
	queuesAdded sync.Map
	// listenHealth is listen's health interval; 0 means listenHealth,
	// and tests shorten it.
	listenHealth time.Duration
	// fair holds the keys with expensive work that the slot-sharing
	// scripts last found (runFair).
	fair fairOwners
}

// New returns a Store on rdb. It panics when a TTL is not positive: Redis
// would expire every record at once, so that is a wiring bug, never a
// state to run in.
func New(rdb redis.UniversalClient, o Options) *Store {
	if o.TaskTTL <= 0 || o.ResultTTL <= 0 {
		panic(fmt.Sprintf("store: TaskTTL and ResultTTL must be positive, got %s and %s", o.TaskTTL, o.ResultTTL))
	}
	return &Store{rdb: rdb, k: keys{o.Prefix}, taskTTL: o.TaskTTL, resultTTL: o.ResultTTL,
		ackReplicas: o.AckReplicas, ackTimeout: o.AckTimeout, now: time.Now}
}

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

// ErrRefusesWrites is what CheckWrites returns, wrapped with Redis's own
// error, when Redis answers but refuses writes: at maxmemory under the
// noeviction policy (OOM), a read-only replica, or a persistence failure
// that stops writes (MISCONF).
var ErrRefusesWrites = errors.New("redis refuses writes")

// readinessTTL is how long the readiness probe's key lives: it is
// rewritten at every probe, and gone soon after the last.
const readinessTTL = 10 * time.Second

// CheckWrites writes the readiness key, so a Redis that answers reads
// and refuses writes is told apart from one that accepts both: the
// readiness probes of both binaries call it.
func (s *Store) CheckWrites(ctx context.Context) error {
	err := s.rdb.Set(ctx, s.k.readiness(), "1", readinessTTL).Err()
	if err == nil {
		return nil
	}
	if RefusesWrites(err) {
		return fmt.Errorf("%w: %w", ErrRefusesWrites, err)
	}
	return fmt.Errorf("store: readiness write: %w", err)
}

// RefusesWrites reports whether err is Redis refusing a write while it
// answers: OOM (at maxmemory under noeviction), READONLY (a replica, as
// during a failover) or MISCONF (a failed snapshot stops writes). Each
// ends by itself or by an operator's hand, not by backing off for long.
func RefusesWrites(err error) bool {
	if errors.Is(err, ErrRefusesWrites) {
		return true
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, p := range []string{"OOM ", "READONLY ", "MISCONF "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// DeleteTasks removes records, best effort; the API uses it to undo a
// submission whose enqueue failed, so no orphan stays pending for a day.
func (s *Store) DeleteTasks(ctx context.Context, ids []string) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			p.Del(ctx, s.k.task(id))
		}
		return nil
	})
	return err
}

// Get returns one task record, with its webhook: both in one round
// trip.
func (s *Store) Get(ctx context.Context, id string) (*Task, error) {
	m, wh, err := s.getWithWebhook(ctx, s.k.task(id), WebhookRef(false, id))
	if err != nil {
		return nil, fmt.Errorf("store: get task: %w", err)
	}
	if len(m) == 0 {
		return nil, ErrNotFound
	}
	t := decodeTask(id, m)
	t.Webhook = webhookOf(wh)
	return t, nil
}

// getWithWebhook reads a record's hash and its webhook's in one round
// trip; the webhook's is empty for the many records without one.
func (s *Store) getWithWebhook(ctx context.Context, key, ref string) (rec, wh map[string]string, err error) {
	var rc, wc *redis.MapStringStringCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		rc = p.HGetAll(ctx, key)
		wc = p.HGetAll(ctx, s.k.webhook(ref))
		return nil
	}); err != nil {
		return nil, nil, err
	}
	return rc.Val(), wc.Val(), nil
}

// GetMany returns records in the order of ids; a missing one is nil.
func (s *Store) GetMany(ctx context.Context, ids []string) ([]*Task, error) {
	cmds := make([]*redis.MapStringStringCmd, len(ids))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HGetAll(ctx, s.k.task(id))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: get tasks: %w", err)
	}
	out := make([]*Task, len(ids))
	for i, c := range cmds {
		if m := c.Val(); len(m) > 0 {
			out[i] = decodeTask(ids[i], m)
		}
	}
	return out, nil
}

func decodeTask(id string, m map[string]string) *Task {
	t := &Task{
		ID: id, Kind: m["kind"], Owner: m["owner"],
		State: apitype.TaskState(m["state"]), ErrCode: m["err_code"], ErrMsg: m["err_msg"],
		Cached: m["cached"] == "1",
	}
	if r, ok := m["result"]; ok {
		t.Result = json.RawMessage(r)
	}
	if p, ok := m["progress"]; ok {
		var pr apitype.Progress
		if json.Unmarshal([]byte(p), &pr) == nil {
			t.Progress = &pr
		}
	}
	t.Attempts, _ = strconv.Atoi(m["attempts"])
	t.CreatedAt = msTime(m["created_at"])
	t.StartedAt = msTime(m["started_at"])
	t.CompletedAt = msTime(m["completed_at"])
	return t
}

func msTime(s string) time.Time {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n == 0 {
		return time.Time{}
	}
	return time.UnixMilli(n).UTC()
}

// GetBatch returns a batch record.
func (s *Store) GetBatch(ctx context.Context, id string) (*Batch, error) {
	m, wh, err := s.getWithWebhook(ctx, s.k.batch(id), WebhookRef(true, id))
	if err != nil {
		return nil, fmt.Errorf("store: get batch: %w", err)
	}
	if len(m) == 0 {
		return nil, ErrNotFound
	}
	b := decodeBatch(id, m)
	b.Webhook = webhookOf(wh)
	return b, nil
}

// decodeBatch reads a batch hash's fields.
func decodeBatch(id string, m map[string]string) *Batch {
	b := &Batch{ID: id, Owner: m["owner"], Format: m["format"], Counts: map[apitype.TaskState]int{}}
	b.Total, _ = strconv.Atoi(m["total"])
	b.Stride, _ = strconv.Atoi(m["stride"])
	for _, st := range apitype.TaskStates() {
		b.Counts[st], _ = strconv.Atoi(m[string(st)])
	}
	b.CreatedAt = msTime(m["created_at"])
	b.DoneAt = msTime(m["done_at"])
	b.ExpiresAt = msTime(m["expires_at"])
	b.CanceledAt = msTime(m["canceled_at"])
	if k := m["kinds"]; k != "" {
		b.Kinds = strings.Split(k, ",")
	}
	return b
}

// The store is what the worker's handler needs.
var _ worker.Store = (*Store)(nil)

// maxPerScript bounds how many tasks one startManyScript or
// finishManyScript call moves, so one call never blocks Redis for long.
const maxPerScript = 500

// scriptGroups splits ts into runs for the many-scripts: tasks of one
// owner, at most maxPerScript of them. Each group lists indexes into ts
// in their original order.
func scriptGroups(ts []worker.Transition) [][]int {
	var (
		order []string
		byKey = map[string][]int{}
	)
	for i, t := range ts {
		k := t.Owner
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], i)
	}
	var out [][]int
	for _, k := range order {
		idx := byKey[k]
		for len(idx) > maxPerScript {
			out = append(out, idx[:maxPerScript])
			idx = idx[maxPerScript:]
		}
		out = append(out, idx)
	}
	return out
}

// Start marks tasks active and looks their answers up in the cache, in one
// round trip: one startManyScript call per owner and at most maxPerScript
// tasks. cacheKeys[i] is task i's cache key ("" when unknown). It returns
// each task's state before the call ("" for a record that is
// gone) and its cached result (nil on a miss). Only the tasks whose
// previous state was pending or active should run.
func (s *Store) Start(ctx context.Context, ts []worker.Transition, cacheKeys []string) ([]apitype.TaskState, []json.RawMessage, error) {
	now := ms(s.now())
	groups := scriptGroups(ts)
	cmds := make([]*redis.Cmd, len(groups))
	err := s.pipelineScripts(ctx, func(p redis.Pipeliner) {
		for g, idx := range groups {
			keys := make([]string, 0, 2*len(idx))
			args := make([]any, 0, 1+len(idx))
			args = append(args, now)
			for _, i := range idx {
				tk := s.k.task(ts[i].ID)
				ck, hasKey := tk, "0"
				if i < len(cacheKeys) && cacheKeys[i] != "" {
					ck, hasKey = s.k.cache(cacheKeys[i]), "1"
				}
				keys = append(keys, tk, ck)
				args = append(args, hasKey)
			}
			cmds[g] = startManyScript.EvalSha(ctx, p, keys, args...)
		}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("store: start: %w", err)
	}
	states := make([]apitype.TaskState, len(ts))
	hits := make([]json.RawMessage, len(ts))
	for g, c := range cmds {
		v, err := c.StringSlice()
		if err != nil || len(v) != 2*len(groups[g]) {
			return nil, nil, fmt.Errorf("store: start script: %v (%d values for %d tasks)", err, len(v), len(groups[g]))
		}
		for j, i := range groups[g] {
			states[i] = apitype.TaskState(v[2*j])
			if v[2*j+1] != "" {
				hits[i] = json.RawMessage(v[2*j+1])
			}
		}
	}
	return states, hits, nil
}

// ErrTaskIDConflict is returned by SubmitTask when asynq already holds a
// task of the new task's ID.
var ErrTaskIDConflict = errors.New("a queued task has this ID already")

// SubmitTask records a single task in one round trip: a cache hit creates
// it completed and returns the result; a miss admits it against owner's
// quota (ErrQuota when full), creates it pending and enqueues t.Enqueue
// on asynq's queue in the same script (one without a message enqueues
// nothing, for tests of the record alone). It returns the creation time written
// to the record.
func (s *Store) SubmitTask(ctx context.Context, t NewTask, quota int) (json.RawMessage, time.Time, error) {
	now, q := s.now(), t.Enqueue
	tk := s.k.task(t.ID)
	keys := []string{tk, s.k.cache(t.CacheKey), tk, tk, tk, s.k.ownerTasks(t.Owner), tk, tk, tk}
	if t.Owner != "" {
		copy(keys[2:], s.k.owner(t.Owner))
	}
	if len(q.Msg) > 0 {
		copy(keys[6:], []string{asynqdata.TaskKey(q.Queue, q.ID), asynqdata.PendingKey(q.Queue), asynqdata.QueuesKey})
	}
	publish := q.Queue
	if _, ok := s.queuesAdded.Load(q.Queue); ok {
		publish = ""
	}
	// One command, not a pipeline of one: Script.Run falls back to EVAL
	// on NOSCRIPT by itself, and go-redis's pipeline path (its command
	// slice, error stamping, pipeline hooks) costs more per call than a
	// command's, on every submission and cache hit. With acks on, the
	// confirmation goes in the same round trip (runConfirmed).
	res, err := s.runConfirmed(ctx, submitScript, keys,
		ms(now), int64(s.taskTTL/time.Second), t.Kind, t.Owner, t.CacheKey, quota, t.ID,
		q.Msg, now.UnixNano(), publish).Slice()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("store: submit task %s: %w", t.ID, err)
	}
	if len(res) != 2 {
		return nil, time.Time{}, fmt.Errorf("store: submit task %s: unexpected reply %v", t.ID, res)
	}
	created := time.UnixMilli(ms(now)).UTC()
	switch code, _ := res[0].(int64); code {
	case -1:
		return nil, time.Time{}, ErrQuota
	case -2:
		return nil, time.Time{}, ErrTaskIDConflict
	case 1:
		str, _ := res[1].(string)
		return json.RawMessage(str), created, nil
	}
	if publish != "" && len(q.Msg) > 0 {
		s.queuesAdded.Store(q.Queue, true) // the script added it
	}
	return nil, created, nil
}

// SubmitCached records a single submission answered from the cache, in
// one round trip and without the asynq message, quota keys or
// admission that SubmitTask carries: the API's path for a puzzle whose
// answer it saw cached. On a hit the record is the one
// SubmitTask writes for a hit; on a miss (the entry expired since) it
// writes nothing and returns a nil result, and the caller submits with
// SubmitTask. t.Enqueue is not used.
func (s *Store) SubmitCached(ctx context.Context, t NewTask) (json.RawMessage, time.Time, error) {
	now := s.now()
	res, err := s.runConfirmed(ctx, submitHitScript, []string{s.k.task(t.ID), s.k.cache(t.CacheKey), s.k.ownerTasks(t.Owner)},
		ms(now), int64(s.taskTTL/time.Second), t.Kind, t.Owner, t.CacheKey, t.ID).Slice()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("store: submit cached task %s: %w", t.ID, err)
	}
	if len(res) != 2 {
		return nil, time.Time{}, fmt.Errorf("store: submit cached task %s: unexpected reply %v", t.ID, res)
	}
	if code, _ := res[0].(int64); code != 1 {
		return nil, time.Time{}, nil
	}
	str, _ := res[1].(string)
	return json.RawMessage(str), time.UnixMilli(ms(now)).UTC(), nil
}

// maxEventRecord is the largest result (with error message), in bytes,
// whose ended record a single task's event carries. Every API replica
// receives every event, waiting on the task or not, so a large result is
// read by the one request that wants it instead.
const maxEventRecord = 16 << 10

// Finish moves tasks to terminal states in one round trip (one
// finishManyScript call per owner and at most maxPerScript
// tasks, and with acks on the confirmation: the states with
// ErrNotReplicated when it fails), caching the results of completed tasks under cacheKeys[i] when
// it is non-empty. It returns each task's state before the call: pending
// or active means this call ended it; anything else means it had already
// ended (a duplicate delivery or a cancel that won) and nothing was
// counted.
func (s *Store) Finish(ctx context.Context, ts []worker.Transition, cacheKeys []string) ([]apitype.TaskState, error) {
	now := ms(s.now())
	groups := scriptGroups(ts)
	call := func(idx []int) ([]string, []any) {
		first := ts[idx[0]]
		fk := s.k.task(first.ID)
		ok, owned := []string{fk, fk, fk}, "0"
		if first.Owner != "" {
			ok, owned = s.k.owner(first.Owner), "1"
		}
		keys := make([]string, 0, 3+2*len(idx))
		args := make([]any, 0, 6+8*len(idx))
		keys = append(keys, ok...)
		args = append(args, now, owned, s.k.events(), maxEventRecord, s.resultTTL.Milliseconds(), TaskEventKey(""))
		for _, i := range idx {
			t := ts[i]
			tk, ck := s.k.task(t.ID), ""
			// Never shorten an entry's life (finishManyScript).
			cache := t.State == apitype.TaskStateCompleted && i < len(cacheKeys) && cacheKeys[i] != "" && !t.Cached
			if cache {
				ck = s.k.cache(cacheKeys[i])
			} else {
				ck = tk
			}
			keys = append(keys, tk, ck)
			args = append(args, string(t.State), t.ID, string(t.Result), t.Code, t.Msg, flag(t.Cached), flag(t.Unstarted), flag(cache))
		}
		return keys, args
	}
	cmds := make([]*redis.Cmd, len(groups))
	var err, unconfirmed error
	if len(groups) == 1 {
		// One call, the common case (a single task's end): one command,
		// not a pipeline of one, as in SubmitTask. Script.Run falls back
		// to EVAL on NOSCRIPT by itself.
		keys, args := call(groups[0])
		cmds[0], unconfirmed = s.runThenConfirm(ctx, finishManyScript, keys, args...)
		err = cmds[0].Err()
	} else {
		var w *redis.IntCmd
		err = s.pipelineScripts(ctx, func(p redis.Pipeliner) {
			for g, idx := range groups {
				keys, args := call(idx)
				cmds[g] = finishManyScript.EvalSha(ctx, p, keys, args...)
			}
			w = s.queueConfirm(ctx, p)
		})
		if err == nil {
			unconfirmed = s.confirmed(w)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("store: finish: %w", err)
	}
	states := make([]apitype.TaskState, len(ts))
	for g, c := range cmds {
		v, err := c.StringSlice()
		if err != nil || len(v) != len(groups[g]) {
			return nil, fmt.Errorf("store: finish script: %v (%d values for %d tasks)", err, len(v), len(groups[g]))
		}
		for j, i := range groups[g] {
			states[i] = apitype.TaskState(v[j])
		}
	}
	if unconfirmed != nil {
		// The scripts ran: the states say what they did, for the
		// caller to count, beside the error.
		return states, fmt.Errorf("store: finish: %w", unconfirmed)
	}
	return states, nil
}

// flag is a boolean as the scripts take it.
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// pipelineScripts runs a pipeline of EVALSHA calls. Script.Run cannot
// fall back to EVAL inside a pipeline, and a restarted Redis has forgotten
// every script, so on NOSCRIPT it loads the scripts and runs the pipeline
// again. Rerunning is safe: a script that did run is not rerun, because
// NOSCRIPT means no call of it ran.
//
// scripts are the scripts fill may run; none means the task scripts
// (startManyScript, finishManyScript, submitScript). Only those are
// loaded, so a pipeline never depends on a script it does not run.
func (s *Store) pipelineScripts(ctx context.Context, fill func(p redis.Pipeliner), scripts ...*redis.Script) error {
	if len(scripts) == 0 {
		scripts = []*redis.Script{startManyScript, finishManyScript, submitScript}
	}
	for attempt := 0; ; attempt++ {
		cmds, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error { fill(p); return nil })
		noscript := false
		for _, c := range cmds {
			if c.Err() != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				noscript = true
			}
		}
		if !noscript || attempt > 0 {
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			return nil
		}
		for _, sc := range scripts {
			if err := sc.Load(ctx, s.rdb).Err(); err != nil {
				return fmt.Errorf("load script: %w", err)
			}
		}
	}
}

// Cancel cancels a single task that has not ended and announces it to
// workers, which stop a running solve. It returns the state before the
// call. (A batch item is canceled by CancelItem.)
func (s *Store) Cancel(ctx context.Context, id, owner string) (apitype.TaskState, error) {
	prev, err := s.Finish(ctx, []worker.Transition{{ID: id, Owner: owner, State: apitype.TaskStateCanceled,
		Code: apitype.CodeCanceled, Msg: "canceled by request"}}, nil)
	if err != nil {
		return "", err
	}
	if prev[0] == apitype.TaskStatePending || prev[0] == apitype.TaskStateActive {
		// A single task may wait on an expensive solve that others wait
		// on too: announceCancel stops it only when none is left.
		if err := s.announceCancel(ctx, id, prev[0]); err != nil {
			return prev[0], err
		}
	}
	return prev[0], nil
}

// CachedResults looks up results by cache key; a miss is nil.
func (s *Store) CachedResults(ctx context.Context, cacheKeys []string) ([]json.RawMessage, error) {
	out := make([]json.RawMessage, len(cacheKeys))
	if len(cacheKeys) == 0 {
		return out, nil
	}
	ks := make([]string, len(cacheKeys))
	for i, c := range cacheKeys {
		ks[i] = s.k.cache(c)
	}
	for start := 0; start < len(ks); start += 1000 {
		end := min(start+1000, len(ks))
		vals, err := s.rdb.MGet(ctx, ks[start:end]...).Result()
		if err != nil {
			return nil, fmt.Errorf("store: cache lookup: %w", err)
		}
		for i, v := range vals {
			if str, ok := v.(string); ok {
				out[start+i] = json.RawMessage(str)
			}
		}
	}
	return out, nil
}
