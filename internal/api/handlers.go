package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// resource renders a task record as the wire resource.
func resource(t *store.Task) apitype.Task {
	r := apitype.Task{
		ID: t.ID, CustomID: t.CustomID, Kind: t.Kind, State: t.State, Result: t.Result, Cached: t.Cached,
		CreatedAt: timePtr(t.CreatedAt), StartedAt: timePtr(t.StartedAt), CompletedAt: timePtr(t.CompletedAt),
		Attempts: t.Attempts, Progress: t.Progress, Webhook: t.Webhook,
	}
	if t.BatchID != "" {
		b := t.BatchID
		r.BatchID = &b
	}
	if t.ErrCode != "" {
		r.Error = &apitype.TaskError{Code: t.ErrCode, Message: t.ErrMsg}
	}
	return r
}

// batchBodyRoutes read a batch's body (openBody, MaxBatchBodyBytes); the
// others' bodies are at most MaxBodyBytes.
var batchBodyRoutes = map[string]bool{"/v1/batches": true}

// timeout bounds a request. Long polls extend it by their wait, and
// requests with a body by the time the body may take to arrive. Streamed
// answers (streamedRoutes) bound their progress instead.
func (s *Server) timeout() gin.HandlerFunc {
	return func(c *gin.Context) {
		// Every long poll ends at EndWaits (waitFor, waitTask), whatever
		// its route; only a request with a wait can hold, so only it
		// pays for the copy of the request that carries the channel.
		if c.Query("wait") != "" {
			c.Request = c.Request.WithContext(s.withEnding(c.Request.Context()))
		}
		if streamedRoutes[c.FullPath()] {
			// Bounded by progress instead (see streamContext).
			c.Next()
			return
		}
		d := s.opts.RequestTimeout
		if w, err := s.parseWait(c); err == nil {
			d += w
		}
		if c.Request.Body != nil && c.Request.Body != http.NoBody {
			// The body's own deadline comes on top: the request's work
			// starts once it is in. It is the longest the route's
			// largest body may take: the body clock (meterBody) cuts a
			// slower one.
			limit := s.opts.MaxBodyBytes
			if batchBodyRoutes[c.FullPath()] {
				limit = s.opts.MaxBatchBodyBytes
			}
			d += bodyTime(s.opts.BodyReadTimeout, s.opts.BodyMinRate, limit)
		}
		ctx, cancel := context.WithTimeout(c.Request.Context(), d)
		defer cancel()
		c.Request = c.Request.WithContext(ctx)
		c.Next()
	}
}

func (s *Server) createTask(c *gin.Context) {
	wait, err := s.parseWait(c)
	if err != nil {
		fail(c, err)
		return
	}
	hook, err := s.queryWebhook(c)
	if err != nil {
		fail(c, err)
		return
	}
	body, err := s.readBody(c, s.opts.MaxBodyBytes)
	if err != nil {
		fail(c, err)
		return
	}
	inBody, found, body, err := splitWebhook(body)
	if err != nil {
		fail(c, err)
		return
	}
	p, err := puzzle.Decode(body)
	if err != nil {
		fail(c, err)
		return
	}
	ctx := c.Request.Context()
	if found {
		if hook != "" {
			fail(c, errTwoWebhooks)
			return
		}
		if err := s.checkWebhook(ctx, inBody); err != nil {
			fail(c, err)
			return
		}
		hook = inBody
	}
	owner := ownerOf(c)
	id := newID()
	key := p.Key()
	if hook == "" && s.hits.has(key) {
		// Seen cached here before: the short hit path, which on a miss
		// writes nothing and leaves the submission to the full one.
		hit, created, err := s.store.SubmitCached(ctx, store.NewTask{ID: id, Kind: string(p.Kind()), Owner: owner, CacheKey: key})
		if err != nil {
			fail(c, err)
			return
		}
		if hit != nil {
			s.answerHit(c, id, p.Kind(), hit, created, nil)
			return
		}
		s.hits.forget(key)
	}
	q, err := tasks.NewSolveEnqueued(id, owner, p, tasks.QueueInteractive, s.opts.Limits)
	if err != nil {
		fail(c, err)
		return
	}
	unwatch, err := s.watchWebhook(ctx, store.WebhookRef(false, id), hook)
	if err != nil {
		fail(c, err)
		return
	}
	var (
		wake    *store.Wake
		release func()
	)
	if wait > 0 {
		// Subscribed before the task is queued, so it cannot end unseen;
		// the record is the one about to be written, so it need not be
		// read.
		wake, release = s.waiter.Subscribe(store.TaskEventKey(id))
	}
	// One round trip answers from the cache, or admits the task against
	// the owner's quota, records it and queues it, all or nothing: a
	// failure leaves nothing to undo.
	hit, created, err := s.store.SubmitTask(ctx, store.NewTask{ID: id, Kind: string(p.Kind()), Owner: owner, CacheKey: key, Enqueue: q}, s.quotaFor(c))
	if (err != nil || hit != nil) && release != nil {
		release()
	}
	if errors.Is(err, store.ErrQuota) {
		err = s.quotaError(c)
	}
	if err != nil {
		s.undo(ctx, unwatch)
		fail(c, err)
		return
	}
	var wh *apitype.Webhook
	if hook != "" {
		wh = &apitype.Webhook{URL: hook}
	}
	if hit != nil {
		s.hits.add(key)
		s.answerHit(c, id, p.Kind(), hit, created, wh)
		return
	}
	s.metrics.submitted.WithLabelValues(string(p.Kind())).Inc()
	tr := apitype.Task{ID: id, Kind: string(p.Kind()), State: apitype.TaskStatePending, CreatedAt: &created, Webhook: wh}
	c.Header("Location", "/v1/tasks/"+id)
	if wait > 0 {
		// Submit and wait in one request: 200 with the ended task, or 202
		// with its state when the wait runs out first.
		cur := &store.Task{ID: id, Kind: tr.Kind, Owner: owner, State: apitype.TaskStatePending, CreatedAt: created, Webhook: tr.Webhook}
		rec, err := s.waitTask(ctx, cur, wait, wake, release)
		if err != nil {
			fail(c, err)
			return
		}
		status := http.StatusAccepted
		if rec.State.Terminal() {
			status = http.StatusOK
		}
		r := resource(rec)
		renderTask(c, status, &r)
		return
	}
	renderTask(c, http.StatusAccepted, &tr)
}

// answerHit answers a submission recorded completed from the cache.
func (s *Server) answerHit(c *gin.Context, id string, kind puzzle.Kind, hit json.RawMessage, created time.Time, wh *apitype.Webhook) {
	s.metrics.submitted.WithLabelValues(string(kind)).Inc()
	s.metrics.cacheHits.Inc()
	renderTask(c, http.StatusOK, &apitype.Task{ID: id, Kind: string(kind), State: apitype.TaskStateCompleted,
		Result: hit, Cached: true, CreatedAt: &created, CompletedAt: &created, Webhook: wh})
}

func (s *Server) respondTask(c *gin.Context, status int, id string) {
	t, err := s.store.Get(c.Request.Context(), id)
	if err != nil {
		fail(c, err)
		return
	}
	r := resource(t)
	renderTask(c, status, &r)
}

// ownerOf returns the API key name of the caller; "" while auth is off.
func ownerOf(c *gin.Context) string { return c.GetString(ctxOwner) }

const ctxOwner = "puzzleq.owner"

// loadTask reads a task the caller may see.
func (s *Server) loadTask(c *gin.Context) (*store.Task, error) {
	return loadOwned(c, s.store.Get, func(t *store.Task) string { return t.Owner })
}

// loadOwned reads the record named by the path's id for the caller. A
// malformed ID never reaches Redis, and another owner's record is "not
// found", never "forbidden", so IDs reveal nothing.
func loadOwned[T any](c *gin.Context, get func(context.Context, string) (T, error), owner func(T) string) (T, error) {
	var zero T
	id := c.Param("id")
	if !validID(id) {
		return zero, store.ErrNotFound
	}
	v, err := get(c.Request.Context(), id)
	if err != nil {
		return zero, err
	}
	if owner(v) != ownerOf(c) {
		return zero, store.ErrNotFound
	}
	return v, nil
}

func (s *Server) getTask(c *gin.Context) {
	wait, err := s.parseWait(c)
	if err != nil {
		fail(c, err)
		return
	}
	id := c.Param("id")
	if batchID, index, ok := apitype.ParseItemID(id); ok {
		s.getItem(c, batchID, index, wait)
		return
	}
	var (
		wake    *store.Wake
		release func()
	)
	if wait > 0 && validID(id) {
		// Subscribed before the read, so an end between the two cannot
		// be missed, and the record is read once.
		wake, release = s.waiter.Subscribe(store.TaskEventKey(id))
	}
	t, err := s.loadTask(c)
	if err == nil && wake != nil && !t.State.Terminal() {
		t, err = s.waitTask(c.Request.Context(), t, wait, wake, release)
	} else if release != nil {
		release()
	}
	if err != nil {
		fail(c, err)
		return
	}
	r := resource(t)
	renderTask(c, s.polledStatus(wait, t.State.Terminal()), &r)
}

// recheckEvery bounds how long a long poll trusts pub/sub alone. Events
// sent while the subscription was reconnecting are lost; a rare re-read
// makes such a loss cost seconds, not the whole wait.
const recheckEvery = 5 * time.Second

// waitTask holds until the task ends, the wait runs out or the client
// leaves (or the server's EndWaits), and returns the latest record. cur
// is the record as last known,
// and wake (released with release) a subscription to its event taken
// before cur was read or written, so no end after cur is missed. The
// event carries the ended record, so the usual wait reads nothing; only a
// recheck, the end of the wait, an event without the record, or a task
// with a webhook (whose delivery the event does not carry) reads it.
func (s *Server) waitTask(ctx context.Context, cur *store.Task, wait time.Duration, wake *store.Wake, release func()) (*store.Task, error) {
	id, key := cur.ID, store.TaskEventKey(cur.ID)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	ending := endingOf(ctx)
	for {
		recheck := time.NewTimer(recheckEvery)
		select {
		case <-wake.C:
			release()
			recheck.Stop()
			// The event's record lacks the webhook's delivery, which
			// lives beside the record: a task with one is read.
			if t := store.DecodeEventTask(id, wake.Data()); t != nil && t.State.Terminal() && cur.Webhook == nil {
				return t, nil
			}
		case <-recheck.C:
			release()
		case <-deadline.C:
			release()
			recheck.Stop()
			return s.store.Get(ctx, id)
		case <-ending: // the server's EndWaits: like the wait running out
			release()
			recheck.Stop()
			return s.store.Get(ctx, id)
		case <-ctx.Done():
			release()
			recheck.Stop()
			return cur, nil
		}
		// No record came with the event, or pub/sub was quiet too long:
		// subscribe again, then read.
		wake, release = s.waiter.Subscribe(key)
		t, err := s.store.Get(ctx, id)
		if err != nil || t.State.Terminal() {
			release()
			return t, err
		}
		cur = t
	}
}

// waitFor is the long-poll loop of batches and batch items: subscribe
// first, then read, so an event between the two cannot be missed. The
// server's EndWaits (its channel in ctx: endingOf) ends it like the
// wait running out, with a fresh read.
func waitFor[T any](ctx context.Context, w Waiter, key string, wait time.Duration, read func() (T, error), done func(T) bool) (T, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	ending := endingOf(ctx)
	for {
		fired, release := w.Wait(key)
		v, err := read()
		if err != nil || done(v) {
			release()
			return v, err
		}
		recheck := time.NewTimer(recheckEvery)
		select {
		case <-fired:
		case <-recheck.C:
		case <-deadline.C:
			release()
			recheck.Stop()
			return read()
		case <-ending:
			release()
			recheck.Stop()
			return read()
		case <-ctx.Done():
			release()
			recheck.Stop()
			return v, nil
		}
		release()
		recheck.Stop()
	}
}

func (s *Server) cancelTask(c *gin.Context) {
	if batchID, index, ok := apitype.ParseItemID(c.Param("id")); ok {
		s.cancelItem(c, batchID, index)
		return
	}
	t, err := s.loadTask(c)
	if err != nil {
		fail(c, err)
		return
	}
	if t.State.Terminal() {
		s.respondCanceled(c, t.ID, t.State)
		return
	}
	prev, err := s.store.Cancel(c.Request.Context(), t.ID, t.Owner)
	if err != nil {
		fail(c, err)
		return
	}
	if prev.Terminal() {
		s.respondCanceled(c, t.ID, prev)
		return
	}
	s.respondTask(c, http.StatusOK, t.ID)
}

// decodeFactor is the memory a batch decode takes for a moment beyond its
// body, per body byte: measured for 1000x1000 fills (the worst case:
// each cell's two bytes of JSON become an 8-byte int while it is
// validated), the raw items and the payloads being encoded.
const decodeFactor = 4

// decodeBatchSlot decodes a batch body in one of the decode slots, with
// the memory the decode takes taken from the pool for its duration: a
// large body decodes only when there is room for it (or when it is the
// oldest request), so two 12 MB fill bodies are not blown up at once.
//
// The memory is taken before the slot, never while holding one: a request
// waiting for room with a slot in hand would keep the oldest request,
// whose room is certain, from decoding, and with it the pool from ever
// emptying.
func (s *Server) decodeBatchSlot(c *gin.Context, body []byte) ([]*puzzle.Parsed, string, error) {
	ctx := c.Request.Context()
	if t, ok := c.Get(ctxTicket); ok {
		n := decodeFactor * int64(len(body))
		if err := t.(*ticket).take(ctx, n); err != nil {
			return nil, "", err
		}
		defer t.(*ticket).put(n)
	}
	select {
	case s.decodes <- struct{}{}:
		defer func() { <-s.decodes }()
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
	return s.decodeBatch(c.Query("format"), body)
}

// decodeBatch decodes a batch body in the format named by the query
// (puzzle owns the formats) and returns the format as the batch stores it:
// "" for JSON.
func (s *Server) decodeBatch(name string, body []byte) ([]*puzzle.Parsed, string, error) {
	f, err := puzzle.ParseFormat(name)
	if err != nil {
		return nil, "", err
	}
	if f == puzzle.FormatJSON {
		reqs, err := puzzle.DecodeBatch(body, s.opts.MaxBatchItems)
		return reqs, "", err
	}
	reqs, err := puzzle.ReadRequests(bytes.NewReader(body), f)
	if err != nil {
		return nil, "", puzzle.PrefixField(err, "body")
	}
	return reqs, string(f), nil
}

// loadBatchWaiting reads a batch the caller may see and, with a wait,
// holds until it is done or the wait runs out, returning its latest
// record.
func (s *Server) loadBatchWaiting(c *gin.Context, wait time.Duration) (*store.Batch, error) {
	b, err := s.loadBatch(c)
	if err != nil || wait <= 0 || b.Done() {
		return b, err
	}
	ctx := c.Request.Context()
	return waitFor(ctx, s.waiter, store.BatchEventKey(b.ID), wait,
		func() (*store.Batch, error) { return s.store.GetBatch(ctx, b.ID) },
		func(b *store.Batch) bool { return b.Done() })
}

// loadBatch reads a batch the caller may see.
func (s *Server) loadBatch(c *gin.Context) (*store.Batch, error) {
	return loadOwned(c, s.store.GetBatch, func(b *store.Batch) string { return b.Owner })
}

const (
	defaultPageLimit = 100
	maxPageLimit     = 1000
)

func (s *Server) getBatch(c *gin.Context) {
	wait, err := s.parseWait(c)
	if err != nil {
		fail(c, err)
		return
	}
	cursor, limit, err := pageParams(c)
	if err != nil {
		fail(c, err)
		return
	}
	b, err := s.loadBatchWaiting(c, wait)
	if err != nil {
		fail(c, err)
		return
	}
	var recs []*store.Task
	next := b.Total
	if cursor < b.Total {
		// Bounded by its results' size too (itemsPage), and taken from
		// the admission pool while it is held.
		var idx []int
		var size int64
		idx, next, size, err = s.itemsPage(c.Request.Context(), b, cursor, limit, "")
		if err != nil {
			fail(c, err)
			return
		}
		var done func()
		recs, done, err = s.readPage(c.Request.Context(), b, idx, size)
		if err != nil {
			fail(c, err)
			return
		}
		defer done()
	}
	res := apitype.Batch{ID: b.ID, Total: b.Total, Done: b.Done(),
		Counts: apitype.Counts{Pending: b.Counts[apitype.TaskStatePending], Active: b.Counts[apitype.TaskStateActive],
			Completed: b.Counts[apitype.TaskStateCompleted], Failed: b.Counts[apitype.TaskStateFailed],
			Canceled: b.Counts[apitype.TaskStateCanceled]},
		CreatedAt: timePtr(b.CreatedAt), DoneAt: timePtr(b.DoneAt), Tasks: make([]apitype.Task, 0, len(recs))}
	if b.Format != "" {
		f := b.Format
		res.Format = &f
	}
	res.Webhook = b.Webhook
	for i, r := range recs {
		if r == nil { // expired a moment before its batch (they share a TTL)
			r = &store.Task{ID: apitype.ItemID(b.ID, cursor+i), BatchID: b.ID, State: apitype.TaskStateFailed, ErrCode: apitype.CodeExpired, ErrMsg: "the item has expired"}
		}
		res.Tasks = append(res.Tasks, resource(r))
	}
	if next < b.Total {
		n := strconv.Itoa(next)
		res.NextCursor = &n
	}
	c.JSON(s.polledStatus(wait, b.Done()), res)
}

func pageParams(c *gin.Context) (cursor, limit int, err error) {
	limit = defaultPageLimit
	if v := c.Query("cursor"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 0 {
			return 0, 0, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "cursor", "cursor must be a value returned as next_cursor")
		}
		cursor = n
	}
	if v := c.Query("limit"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 1 || n > maxPageLimit {
			return 0, 0, newError(http.StatusBadRequest, apitype.CodeInvalidRequest, "limit", "limit must be between 1 and %d", maxPageLimit)
		}
		limit = n
	}
	return cursor, limit, nil
}

// cancelBatch answers DELETE /v1/batches/{id}. It is safe to retry, as
// the client does on a timeout or a lost answer: a repeat finishes a
// cancel that was cut off, and once a cancel has ended the batch, a repeat
// answers 200 with nothing more canceled. Only a batch that ended without
// a cancel is a 409. The store's mark script tells these apart, in the
// same step that marks the batch, so the handler does not guess from the
// record it read.
func (s *Server) cancelBatch(c *gin.Context) {
	b, err := s.loadBatch(c)
	if err != nil {
		fail(c, err)
		return
	}
	n, err := s.store.CancelBatch(c.Request.Context(), b.ID, b.Owner)
	if errors.Is(err, store.ErrBatchEnded) {
		err = errBatchEnded
	}
	if err != nil {
		fail(c, err)
		return
	}
	c.JSON(http.StatusOK, apitype.BatchCanceled{ID: b.ID, Canceled: n})
}

// errBatchEnded is the 409 of a batch cancel that came after every item
// had ended on its own.
var errBatchEnded = newError(http.StatusConflict, apitype.CodeConflict, "", "batch has already ended")
