package store

// Batches are stored as a whole (docs/batches.md): a batch record, its
// items' requests cut into chunks, one result hash per chunk, and a fair
// feed of the units that run them. This file is that layout's API; the
// scripts it runs are documented beside it.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// StagedItem is one decoded item of a batch being uploaded.
type StagedItem struct {
	// CustomID is the caller's name for the item; "" when none.
	CustomID string
	// Kind is the item's puzzle kind.
	Kind puzzle.Kind
	// Request is the item's canonical request (puzzle.Parsed.Payload).
	Request []byte
	// Own is true for an item that runs in its own unit: an expensive
	// one (a search), or one whose request is large.
	Own bool
	// Timeout is what the item adds to its unit's asynq timeout.
	Timeout time.Duration
}

// StagingTTL is how long staged keys live until CommitBatch gives them
// the batch's TTL: longer than any upload may take (the API cuts a body
// off well before), short enough that an upload whose process died
// leaves nothing for long.
const StagingTTL = 15 * time.Minute

// unitMargin is added to a unit's items' timeouts for asynq's own timeout,
// like tasks' timeoutMargin: the handler's deadlines must fire first.
const unitMargin = 30 * time.Second

// feedWindow is how many of a batch's units move into the feed at a time
// (see feedLua): a commit or a feed call moves at most a few windows, so
// neither blocks Redis for long however large the batch.
const feedWindow = 1000

// backlogUnits is how many waiting units one member of the backlog
// (keys.backlog) stands for: the KEDA trigger on it asks for one worker
// per member, the same 50 units per worker as its trigger on the bulk
// queue. A 1,000,000-item batch of own units has 20,000 members, which
// its commit adds in a few milliseconds.
const backlogUnits = 50

// maxRefills bounds how many windows one Feed call moves.
const maxRefills = 2

// maxFeedDrops bounds how many members of gone or canceled batches one
// Feed call pops and drops, so one call stays short; the next call drops
// more.
const maxFeedDrops = 10000

// cancelChunksPerTrip is how many chunk-cancel scripts CancelBatch sends
// in one pipeline.
const cancelChunksPerTrip = 64

// ErrStagedGone is returned by CommitBatch when the staged items are gone
// or incomplete (the staging TTL passed, or a write was lost): nothing
// was committed, and the upload must be made again.
var ErrStagedGone = errors.New("store: staged batch items are gone")

// kindByte is the kind map's byte for kind k of a shared unit; own-unit
// items use its uppercase.
func kindByte(k puzzle.Kind) (byte, bool) {
	switch k {
	case puzzle.KindSliding:
		return 's', true
	case puzzle.KindSweep:
		return 'w', true
	case puzzle.KindFill:
		return 'f', true
	}
	return 0, false
}

// kindOf reads a kind map byte.
func kindOf(b byte) puzzle.Kind {
	switch b | 0x20 {
	case 's':
		return puzzle.KindSliding
	case 'w':
		return puzzle.KindSweep
	case 'f':
		return puzzle.KindFill
	}
	return ""
}

// BatchWriter stages a batch's items as they are decoded, a chunk at a
// time, so that an upload of a million items never holds more than a
// chunk (or a few, in flight to Redis) in memory. Nothing it writes is
// visible, or lasts, until CommitBatch. It is not safe for concurrent use.
type BatchWriter struct {
	s      *Store
	id     string
	stride int

	total int // items added
	units int // units staged or buffered
	// kindSet holds the kinds of the items added, for the batch record.
	kindSet map[puzzle.Kind]bool

	// The chunk being filled.
	lines    []byte   // request lines, '\n'-separated
	kinds    []byte   // kind map
	ids      []string // custom IDs, JSON strings
	anyID    bool
	own      []any // field, request pairs of own items
	members  []any // the chunk's units
	cheap    time.Duration
	anyCheap bool
	buffered int64

	// One chunk at most is in flight; its result arrives on inflight.
	inflight      chan error
	inflightBytes int64
	err           error
	closed        bool
}

// maxStride bounds a chunk's items: the scripts pass a chunk's fields to
// one command (Lua's unpack takes fewer than 8000 values: a chunk's
// entries are twice its items).
const maxStride = 2048

// maxOutcomesPerCall bounds the outcomes one finishUnitScript call takes,
// for the same reason; FinishUnit splits a longer list.
const maxOutcomesPerCall = 1000

// NewBatchWriter starts staging batch id, stride items to a chunk. A
// stride outside [1, maxStride] is clamped into it (the batch records the
// stride it was written with).
func (s *Store) NewBatchWriter(id string, stride int) *BatchWriter {
	stride = max(1, min(stride, maxStride))
	return &BatchWriter{s: s, id: id, stride: stride}
}

// Add stages the next item. It writes to Redis when a chunk fills.
func (w *BatchWriter) Add(ctx context.Context, it StagedItem) error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return errors.New("store: batch writer: add after close")
	}
	kb, ok := kindByte(it.Kind)
	if !ok {
		return fmt.Errorf("store: batch writer: unknown kind %q", it.Kind)
	}
	if len(it.CustomID) > apitype.MaxCustomIDBytes {
		return fmt.Errorf("store: batch writer: custom_id of %d bytes", len(it.CustomID))
	}
	if !it.Own && (len(it.Request) == 0 || bytes.IndexByte(it.Request, '\n') >= 0 || string(it.Request) == "-") {
		// Canonical requests are compact JSON: no newline, never "-".
		return fmt.Errorf("store: batch writer: item %d: request is not one line of JSON", w.total)
	}
	if w.kindSet == nil {
		w.kindSet = map[puzzle.Kind]bool{}
	}
	w.kindSet[it.Kind] = true
	i := w.total
	k := len(w.kinds)
	if k > 0 {
		w.lines = append(w.lines, '\n')
	}
	if it.Own {
		w.lines = append(w.lines, '-')
		w.kinds = append(w.kinds, kb-'a'+'A')
		// A copy: the caller may reuse its buffer for the next item.
		w.own = append(w.own, "x"+strconv.Itoa(i), bytes.Clone(it.Request))
		w.members = append(w.members, tasks.UnitRef{BatchID: w.id, Unit: tasks.OwnUnit(i), Timeout: it.Timeout + unitMargin}.Member())
		w.units++
	} else {
		w.lines = append(w.lines, it.Request...)
		w.kinds = append(w.kinds, kb)
		w.cheap += it.Timeout
		w.anyCheap = true
	}
	id, _ := json.Marshal(it.CustomID)
	w.ids = append(w.ids, string(id))
	if it.CustomID != "" {
		w.anyID = true
	}
	w.buffered += int64(len(it.Request) + len(id) + 2)
	w.total++
	if len(w.kinds) == w.stride {
		return w.flush(ctx)
	}
	return nil
}

// flush sends the chunk being filled to Redis, after the previous one has
// landed, and starts a new chunk.
func (w *BatchWriter) flush(ctx context.Context) error {
	if len(w.kinds) == 0 {
		return w.err
	}
	if err := w.wait(); err != nil {
		return err
	}
	j := (w.total - 1) / w.stride
	members := w.members
	if w.anyCheap {
		// The chunk's shared unit goes first: its items are the cheap
		// ones, which run faster than a chunk's own items.
		c := tasks.UnitRef{BatchID: w.id, Unit: tasks.ChunkUnit(j), Timeout: w.cheap + unitMargin}.Member()
		members = append([]any{c}, members...)
		w.units++
	}
	fields := make([]any, 0, 6+len(w.own))
	fields = append(fields, strconv.Itoa(j), w.lines, "m"+strconv.Itoa(j), w.kinds)
	if w.anyID {
		fields = append(fields, "i"+strconv.Itoa(j), strings.Join(w.ids, "\n"))
	}
	fields = append(fields, w.own...)
	req, units := w.s.k.batchReq(w.id), w.s.k.batchUnits(w.id)
	done := make(chan error, 1)
	w.inflight, w.inflightBytes = done, w.buffered
	go func() {
		_, err := w.s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, req, fields...)
			p.RPush(ctx, units, members...)
			p.Expire(ctx, req, StagingTTL)
			p.Expire(ctx, units, StagingTTL)
			return nil
		})
		if err != nil {
			err = fmt.Errorf("store: stage chunk %d of batch %s: %w", j, w.id, err)
		}
		done <- err
	}()
	w.lines, w.kinds, w.ids, w.own, w.members = nil, nil, nil, nil, nil
	w.anyID, w.anyCheap, w.cheap, w.buffered = false, false, 0, 0
	return nil
}

// wait waits for the chunk in flight and returns the writer's first error.
func (w *BatchWriter) wait() error {
	if w.inflight != nil {
		if err := <-w.inflight; err != nil && w.err == nil {
			w.err = err
		}
		w.inflight, w.inflightBytes = nil, 0
	}
	return w.err
}

// Kinds returns the kinds of the items added, sorted.
func (w *BatchWriter) Kinds() []string {
	out := make([]string, 0, len(w.kindSet))
	for k := range w.kindSet {
		out = append(out, string(k))
	}
	slices.Sort(out)
	return out
}

// Total is the number of items added so far.
func (w *BatchWriter) Total() int { return w.total }

// Buffered is how many bytes of items the writer holds that are not yet
// written, for the API's admission by bytes.
func (w *BatchWriter) Buffered() int64 { return w.buffered + w.inflightBytes }

// CustomIDAt returns the custom_id of an item already added, reading it
// back from Redis when its chunk was written; the API uses it to confirm
// a duplicate custom_id that its hashes suggest.
func (w *BatchWriter) CustomIDAt(ctx context.Context, index int) (string, error) {
	if index < 0 || index >= w.total {
		return "", fmt.Errorf("store: batch writer: no item %d of %d", index, w.total)
	}
	j, k := index/w.stride, index%w.stride
	var line string
	if first := w.total - len(w.kinds); index >= first {
		line = w.ids[index-first]
	} else {
		if err := w.wait(); err != nil {
			return "", err
		}
		v, err := w.s.rdb.HGet(ctx, w.s.k.batchReq(w.id), "i"+strconv.Itoa(j)).Result()
		if errors.Is(err, redis.Nil) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("store: read back custom_id: %w", err)
		}
		lines := strings.Split(v, "\n")
		if k >= len(lines) {
			return "", fmt.Errorf("store: read back custom_id: chunk %d has %d lines", j, len(lines))
		}
		line = lines[k]
	}
	var id string
	if err := json.Unmarshal([]byte(line), &id); err != nil {
		return "", fmt.Errorf("store: read back custom_id: %w", err)
	}
	return id, nil
}

// Close writes what is buffered. After it, CommitBatch makes the batch.
func (w *BatchWriter) Close(ctx context.Context) error {
	if w.closed {
		return w.err
	}
	w.closed = true
	if err := w.flush(ctx); err != nil {
		return err
	}
	return w.wait()
}

// Discard deletes what was staged, for an upload that failed. The staged
// keys also expire on their own, for a process that died.
func (w *BatchWriter) Discard(ctx context.Context) error {
	w.wait()
	w.closed = true
	if err := w.s.rdb.Del(ctx, w.s.k.batchReq(w.id), w.s.k.batchUnits(w.id)).Err(); err != nil {
		return fmt.Errorf("store: discard staged batch %s: %w", w.id, err)
	}
	return nil
}

// CommitBatch describes the batch record CommitBatch creates.
type CommitBatch struct {
	ID    string
	Owner string
	// Format is the judge format the batch was submitted in ("" for JSON),
	// so its output can be rendered in the same format.
	Format string
	// IdempotencyKey, when set, is the caller's Idempotency-Key, claimed
	// by ClaimIdempotency for this batch ID and BodyHash. The batch is
	// committed only while that claim is still this batch's, and the
	// claim then lives as long as the batch.
	IdempotencyKey, BodyHash string
	// Quota is the owner's quota of items that have not ended; 0:
	// unlimited.
	Quota int
}

// claimOf returns the idempotency key and claim value of cb; the batch
// key and "" when it has none.
func (s *Store) claimOf(cb CommitBatch) (string, string) {
	if cb.IdempotencyKey == "" {
		return s.k.batch(cb.ID), ""
	}
	return s.k.idempotency(cb.Owner, cb.IdempotencyKey), cb.ID + " " + cb.BodyHash
}

// commitKeys are the first seven keys of the commit and abandon scripts.
func (s *Store) commitKeys(cb CommitBatch) []string {
	bk := s.k.batch(cb.ID)
	idem, _ := s.claimOf(cb)
	keys := []string{bk, s.k.batchReq(cb.ID), s.k.batchUnits(cb.ID), idem}
	if cb.Owner != "" {
		return append(keys, s.k.owner(cb.Owner)...)
	}
	return append(keys, bk, bk, bk)
}

// CommitBatch makes the batch staged by w in one script: it checks the
// claim (ErrClaimLost), admits the items against the quota (ErrQuota),
// writes the batch record, gives the staged keys the batch's TTL and puts
// every unit in the feed. On any error nothing is committed, except when
// the reply was lost: see AbandonCommit. It closes w first.
func (s *Store) CommitBatch(ctx context.Context, w *BatchWriter, cb CommitBatch) error {
	if err := w.Close(ctx); err != nil {
		return err
	}
	_, claim := s.claimOf(cb)
	keys := append(s.commitKeys(cb), s.k.feed(), s.k.ownerVT(cb.Owner), s.k.feedVT(), s.k.backlog(), s.k.ownerBatches(cb.Owner))
	chunks := (w.total + w.stride - 1) / w.stride
	v, err := commitBatchScript.Run(ctx, s.rdb, keys,
		ms(s.now()), s.taskTTL.Milliseconds(), cb.ID, cb.Owner, cb.Format, claim, cb.Quota,
		w.total, w.stride, chunks, w.units, feedWindow, backlogUnits, strings.Join(w.Kinds(), ",")).Int()
	if err != nil {
		return fmt.Errorf("store: commit batch %s: %w", cb.ID, err)
	}
	switch v {
	case -1:
		return ErrQuota
	case -2:
		return ErrClaimLost
	case -3:
		return ErrStagedGone
	}
	return nil
}

// AbandonCommit undoes a CommitBatch whose outcome is unknown (its reply
// was lost), unless a unit of the batch has been fed: then it runs, and
// AbandonCommit answers BatchKept. It returns BatchNotWritten,
// BatchAbandoned or BatchKept. A batch that was not written has its
// staged keys deleted.
func (s *Store) AbandonCommit(ctx context.Context, w *BatchWriter, cb CommitBatch) (int, error) {
	if w != nil {
		w.wait() // a chunk landing after the script would outlive it
	}
	_, claim := s.claimOf(cb)
	owned := "0"
	if cb.Owner != "" {
		owned = "1"
	}
	keys := append(s.commitKeys(cb), s.k.feed(), s.k.backlog(), s.k.ownerBatches(cb.Owner))
	v, err := abandonCommitScript.Run(ctx, s.rdb, keys, cb.ID, claim, owned, s.k.batchResBase(cb.ID), backlogUnits).Int()
	if err != nil {
		return 0, fmt.Errorf("store: abandon batch %s: %w", cb.ID, err)
	}
	return v, nil
}

// Feed takes up to max units from the feed, in fair order (see
// docs/batches.md), while queue's asynq pending list holds fewer than
// depth tasks, moving them to the feeding set. Units of batches that are
// gone or canceled are dropped, not returned. The caller enqueues and
// acknowledges them with EnqueueFed.
func (s *Store) Feed(ctx context.Context, queue string, depth, max int) ([]tasks.UnitRef, error) {
	return s.FeedBelow(ctx, queue, depth, depth, max)
}

// FeedBelow is Feed that takes nothing unless queue's pending list holds
// fewer than low tasks (low <= depth): a worker that feeds after every
// unit then makes one feed of several units every few units, not a feed,
// an enqueue and an acknowledgement per unit.
func (s *Store) FeedBelow(ctx context.Context, queue string, low, depth, max int) ([]tasks.UnitRef, error) {
	if max <= 0 || depth <= 0 || low <= 0 {
		return nil, nil
	}
	ua := s.k.batchUnitsAffixes()
	members, err := feedScript.Run(ctx, s.rdb,
		[]string{s.k.feed(), s.k.feeding(), s.k.feedVT(), tasks.PendingListKey(queue), s.k.backlog()},
		depth, max, ms(s.now()), ua[0], maxFeedDrops, feedWindow, maxRefills, ua[1], backlogUnits, min(low, depth)).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("store: feed: %w", err)
	}
	return s.parseMembers(ctx, members), nil
}

// parseMembers reads feed members; one that cannot be read (never written
// by this code) is removed from the feeding set rather than returned
// forever.
func (s *Store) parseMembers(ctx context.Context, ms []string) []tasks.UnitRef {
	refs := make([]tasks.UnitRef, 0, len(ms))
	var bad []any
	for _, m := range ms {
		r, err := tasks.ParseMember(m)
		if err != nil {
			bad = append(bad, m)
			continue
		}
		refs = append(refs, r)
	}
	if len(bad) > 0 {
		s.rdb.ZRem(ctx, s.k.feeding(), bad...)
	}
	return refs
}

// enqueueFedPage is the most units one enqueueFedScript call takes: about
// a millisecond of Redis's time, so that a feeder that took thousands
// does not hold Redis for long at once.
const enqueueFedPage = 256

// EnqueueFed puts units that Feed took on queue's pending list, as
// asynq.Client would enqueue them with their fixed task IDs, and
// acknowledges them in the same script (tasks.Feeder): a page of up
// to enqueueFedPage units a round trip. A unit whose task asynq holds
// already is acknowledged as queued, queued afresh when asynq had
// archived or kept it completed, and left unacknowledged while it runs
// (enqueueFedScript). It returns how many units it acknowledged; the
// others (running ones, and those of the pages after a failure) stay in
// the feeding set for the reconciler.
func (s *Store) EnqueueFed(ctx context.Context, queue string, refs []tasks.UnitRef) (int, error) {
	acked := 0
	for len(refs) > 0 {
		page := refs[:min(len(refs), enqueueFedPage)]
		refs = refs[len(page):]
		keys := make([]string, 5, 5+len(page))
		keys[0], keys[1], keys[2] = s.k.feeding(), s.k.asynqPending(queue), s.k.asynqQueues()
		keys[3], keys[4] = s.k.asynqArchived(queue), s.k.asynqCompleted(queue)
		publish := queue
		if _, ok := s.queuesAdded.Load(queue); ok {
			publish = ""
		}
		args := make([]any, 2, 2+3*len(page))
		args[0], args[1] = s.now().UnixNano(), publish
		for _, r := range page {
			e, err := tasks.NewUnitEnqueued(r, queue)
			if err != nil {
				return acked, err
			}
			keys = append(keys, s.k.asynqTask(queue, e.ID))
			args = append(args, e.ID, e.Msg, r.Member())
		}
		n, err := enqueueFedScript.Run(ctx, s.rdb, keys, args...).Int()
		if err != nil {
			return acked, fmt.Errorf("store: enqueue %d fed units: %w", len(page), err)
		}
		if publish != "" {
			s.queuesAdded.Store(queue, true)
		}
		acked += n
	}
	return acked, nil
}

// StaleFed returns up to limit units that were taken from the feed before
// before and never acknowledged: their feeder died. The reconciler
// enqueues them again.
func (s *Store) StaleFed(ctx context.Context, before time.Time, limit int) ([]tasks.UnitRef, error) {
	members, err := s.rdb.ZRangeByScore(ctx, s.k.feeding(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(ms(before), 10), Count: int64(limit)}).Result()
	if err != nil {
		return nil, fmt.Errorf("store: stale fed: %w", err)
	}
	return s.parseMembers(ctx, members), nil
}

// StartUnit marks a unit active (its items' counts move from pending to
// active once, however often it is delivered), counts an attempt, and
// returns the unit's items that have not ended.
func (s *Store) StartUnit(ctx context.Context, ref tasks.UnitRef) (*tasks.UnitWork, error) {
	_, n, err := tasks.ParseUnit(ref.Unit)
	if err != nil {
		return nil, err
	}
	now := ms(s.now())
	v, err := startUnitScript.Run(ctx, s.rdb, []string{s.k.batch(ref.BatchID), s.k.batchReq(ref.BatchID)},
		now, ref.Unit[:1], n, s.k.batchResBase(ref.BatchID)).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("store: start unit %s: %w", ref.TaskID(), err)
	}
	w := &tasks.UnitWork{}
	if len(v) == 0 {
		return w, nil
	}
	w.Owner = v[0]
	if len(v) == 5 && v[1] == "*" {
		// This start wrote the chunk's marker "1 <now>" (one attempt):
		// FinishUnit's cheaper path builds the entries from it.
		w.Mark = v[2] + " " + strconv.FormatInt(now, 10)
		return w, startWhole(w, ref, v[2], v[3], v[4])
	}
	for i := 1; i+1 < len(v); i += 2 {
		idx, err := strconv.Atoi(v[i])
		if err != nil {
			return nil, fmt.Errorf("store: start unit %s: bad index %q", ref.TaskID(), v[i])
		}
		w.Items = append(w.Items, tasks.UnitItem{Index: idx, Request: []byte(v[i+1])})
	}
	return w, nil
}

// startWhole fills w from startUnitScript's answer for a whole chunk:
// the item at offset k runs when its kind byte m[k] is a cheap kind's
// (lowercase), with the k-th of the newline-separated request lines.
func startWhole(w *tasks.UnitWork, ref tasks.UnitRef, first, m, lines string) error {
	base, err := strconv.Atoi(first)
	if err != nil {
		return fmt.Errorf("store: start unit %s: bad first index %q", ref.TaskID(), first)
	}
	w.Items = make([]tasks.UnitItem, 0, len(m))
	for k := 0; k < len(m); k++ {
		line, rest, _ := strings.Cut(lines, "\n")
		lines = rest
		if c := m[k]; c >= 'A' && c <= 'Z' {
			continue
		}
		w.Items = append(w.Items, tasks.UnitItem{Index: base + k, Request: []byte(line)})
	}
	return nil
}

// YieldUnit takes back StartUnit's start of own unit ref, whose item
// waits for its owner's expensive slots (yieldUnitScript).
func (s *Store) YieldUnit(ctx context.Context, ref tasks.UnitRef) error {
	chunk, n, err := tasks.ParseUnit(ref.Unit)
	if err != nil {
		return err
	}
	if chunk {
		return fmt.Errorf("store: yield unit %s: not an own unit", ref.TaskID())
	}
	err = yieldUnitScript.Run(ctx, s.rdb, []string{s.k.batch(ref.BatchID), s.k.batchReq(ref.BatchID)},
		n, s.k.batchResBase(ref.BatchID)).Err()
	if err != nil {
		return fmt.Errorf("store: yield unit %s: %w", ref.TaskID(), err)
	}
	return nil
}

// FinishUnit writes the outcomes of a unit's items. Only an item without
// an ended entry gets one (so a redelivered unit, or one whose item was
// canceled meanwhile, changes and counts nothing twice); it moves the
// batch's counts, gives back the owner's quota, publishes the chunk's
// event and, when it ended the batch's last item, sets done_at and
// publishes the batch's. It returns how many items it ended.
//
// mark is the UnitWork.Mark of the StartUnit that began this delivery.
// For a chunk's first delivery it names the chunk's first item and the
// marker the start wrote, and the outcomes go first to
// finishChunkScript, which writes them at a third of the general
// script's cost when nothing else has touched the chunk since the start.
func (s *Store) FinishUnit(ctx context.Context, ref tasks.UnitRef, mark string, outs []tasks.ItemOutcome) (int, error) {
	if len(outs) > maxOutcomesPerCall {
		// Each call is exact on its own (an ended item is never counted
		// twice), so splitting keeps the counts exact. Only the first
		// part may take the cheaper path: it leaves entries behind.
		n, err := s.FinishUnit(ctx, ref, mark, outs[:maxOutcomesPerCall])
		if err != nil {
			return n, err
		}
		m, err := s.FinishUnit(ctx, ref, "", outs[maxOutcomesPerCall:])
		return n + m, err
	}
	if len(outs) == 0 {
		return 0, nil
	}
	chunk, n, err := tasks.ParseUnit(ref.Unit)
	if err != nil {
		return 0, err
	}
	rests := make([][]byte, len(outs))
	caches := make([]string, len(outs))
	fast := chunk && mark != ""
	for i, o := range outs {
		if rests[i], caches[i], err = entryRest(o); err != nil {
			return 0, fmt.Errorf("store: finish unit %s: %w", ref.TaskID(), err)
		}
		fast = fast && caches[i] == ""
	}
	now := ms(s.now())
	if fast {
		if v, ok, err := s.finishChunk(ctx, ref, n, mark, now, outs, rests); err != nil || ok {
			return v, err
		}
	}
	bk := s.k.batch(ref.BatchID)
	keys := make([]string, 0, 2+len(outs))
	keys = append(keys, bk, s.k.batchReq(ref.BatchID))
	args := make([]any, 0, 11+4*len(outs))
	args = append(args, s.k.ownerAffixes()...)
	args = append(args, now, s.k.events(), ref.BatchID, ref.Unit[:1], n,
		s.k.batchResBase(ref.BatchID), s.resultTTL.Milliseconds())
	for i, o := range outs {
		ck := bk
		if caches[i] != "" {
			ck = s.k.cache(o.CacheKey)
		}
		keys = append(keys, ck)
		args = append(args, o.Index, string(o.State), rests[i], caches[i])
	}
	v, err := finishUnitScript.Run(ctx, s.rdb, keys, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("store: finish unit %s: %w", ref.TaskID(), err)
	}
	return v, nil
}

// entryRest builds what follows an outcome's entry start (its state,
// times and attempts): its other members and the closing brace. cached
// is the result to store once in the cache entry the item refers to, ""
// when the result is inline or there is none.
func entryRest(o tasks.ItemOutcome) (rest []byte, cached string, err error) {
	switch o.State {
	case apitype.TaskStateCompleted:
		inline := o.Result
		if o.CacheKey != "" && len(o.Result) > 0 {
			ref, _ := json.Marshal(o.CacheKey)
			rest = append(append(rest, `,"ref":`...), ref...)
			cached, inline = string(o.Result), nil
		}
		if o.Cached {
			rest = append(rest, `,"cached":true`...)
		}
		if len(inline) > 0 {
			rest = strconv.AppendInt(append(rest, `,"size":`...), int64(len(inline)), 10)
			rest = append(append(rest, `,"result":`...), inline...)
		}
	case apitype.TaskStateFailed:
		e, _ := json.Marshal(apitype.TaskError{Code: o.Code, Message: truncateMessage(o.Msg)})
		rest = append(append(rest, `,"error":`...), e...)
	default:
		return nil, "", fmt.Errorf("item %d: state %q is not an outcome", o.Index, o.State)
	}
	return append(rest, '}'), cached, nil
}

// finishChunk tries finishChunkScript for chunk j's outcomes, whose
// entries' rests are rests. mark is "<first index> <started_at>" from
// StartUnit. ok is false when the script declined (the chunk is not as
// the start left it) or mark does not parse: the caller then takes the
// general path, to which the script left everything as it was.
func (s *Store) finishChunk(ctx context.Context, ref tasks.UnitRef, j int, mark string, now int64,
	outs []tasks.ItemOutcome, rests [][]byte) (ended int, ok bool, err error) {
	first, started, found := strings.Cut(mark, " ")
	base, perr := strconv.Atoi(first)
	if !found || perr != nil {
		return 0, false, nil
	}
	// Every entry starts as the general script's entry() builds it from
	// the marker "1 <started>": one attempt.
	nowS := strconv.FormatInt(now, 10)
	starts := map[apitype.TaskState]string{}
	done := 0
	args := make([]any, 0, 12+2*len(outs))
	args = append(args, s.k.ownerAffixes()...)
	args = append(args, now, s.k.events(), ref.BatchID, j, s.k.batchResBase(ref.BatchID), "1 "+started, 0, base)
	for i, o := range outs {
		st, have := starts[o.State]
		if !have {
			st = `{"state":"` + string(o.State) + `","started_at":` + started + `,"completed_at":` + nowS + `,"attempts":1`
			starts[o.State] = st
		}
		if o.State == apitype.TaskStateCompleted {
			done++
		}
		e := make([]byte, 0, len(st)+len(rests[i]))
		args = append(args, o.Index-base, append(append(e, st...), rests[i]...))
	}
	args[10] = done
	v, err := finishChunkScript.Run(ctx, s.rdb, []string{s.k.batch(ref.BatchID), s.k.batchReq(ref.BatchID)}, args...).Int()
	if err != nil {
		return 0, false, fmt.Errorf("store: finish unit %s: %w", ref.TaskID(), err)
	}
	if v < 0 {
		return 0, false, nil
	}
	return v, true, nil
}

// maxErrorMessage bounds a failed item's message as its entry keeps it,
// so that an entry holds a head of a few hundred bytes unless its result
// is inline (tasks keeps only results up to 64 KiB inline). Messages are
// the solvers' and ours, a line each; this only guards the bound.
const maxErrorMessage = 1 << 10

// truncateMessage cuts msg to maxErrorMessage bytes on a rune boundary.
func truncateMessage(msg string) string {
	if len(msg) <= maxErrorMessage {
		return msg
	}
	cut := maxErrorMessage - len("…")
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

// Cached returns the cached result for key, nil on a miss.
func (s *Store) Cached(ctx context.Context, key string) (json.RawMessage, error) {
	v, err := s.rdb.Get(ctx, s.k.cache(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: cache lookup: %w", err)
	}
	return json.RawMessage(v), nil
}

// itemEntry is an ended item's entry (docs/batches.md, Results).
type itemEntry struct {
	State       apitype.TaskState  `json:"state"`
	Ref         string             `json:"ref"`
	Cached      bool               `json:"cached"`
	Error       *apitype.TaskError `json:"error"`
	StartedAt   int64              `json:"started_at"`
	CompletedAt int64              `json:"completed_at"`
	Attempts    int                `json:"attempts"`
	Size        int64              `json:"size"`
	Result      json.RawMessage    `json:"result"`
}

// readHead is what readItemsScript says of the batch.
type readHead struct {
	owner     string
	createdAt time.Time
	total     int
}

// rawItem is one item as readItemsScript returns it.
type rawItem struct {
	kind, customID, entry, marker, progress, extra string
}

// readItems runs readItemsScript for items [first, first+count) on p (a
// pipeline) or s.rdb; decode with decodeRead.
func (s *Store) readItems(ctx context.Context, c redis.Scripter, batchID string, first, count int) *redis.Cmd {
	return readItemsScript.RunRO(ctx, c, []string{s.k.batch(batchID), s.k.batchReq(batchID)},
		s.k.batchResBase(batchID), s.k.cache(""), first, count)
}

// decodeRead splits readItemsScript's reply; ok is false when the batch
// is gone.
func decodeRead(cmd *redis.Cmd) (readHead, []rawItem, bool, error) {
	v, err := cmd.StringSlice()
	if err != nil {
		return readHead{}, nil, false, err
	}
	if len(v) < 4 {
		return readHead{}, nil, false, nil
	}
	h := readHead{owner: v[0], createdAt: msTime(v[1])}
	h.total, _ = strconv.Atoi(v[2])
	items := make([]rawItem, 0, (len(v)-4)/6)
	for i := 4; i+5 < len(v); i += 6 {
		items = append(items, rawItem{v[i], v[i+1], v[i+2], v[i+3], v[i+4], v[i+5]})
	}
	return h, items, true, nil
}

// customID decodes a custom ID line: nil for none.
func customID(line string) *string {
	if line == "" || line == `""` {
		return nil
	}
	var id string
	if json.Unmarshal([]byte(line), &id) != nil || id == "" {
		return nil
	}
	return &id
}

// parseMarker reads an active marker "<attempts> <started_at ms>".
func parseMarker(v string) (int, time.Time) {
	a, st, ok := strings.Cut(v, " ")
	if !ok {
		return 0, time.Time{}
	}
	n, _ := strconv.Atoi(a)
	return n, msTime(st)
}

// toTask makes item index of batchID into a task record.
func toTask(batchID string, index int, h readHead, r rawItem) *Task {
	t := &Task{ID: apitype.ItemID(batchID, index), Owner: h.owner, BatchID: batchID,
		CustomID: customID(r.customID), CreatedAt: h.createdAt, State: apitype.TaskStatePending}
	if r.kind != "" {
		t.Kind = string(kindOf(r.kind[0]))
	}
	if r.marker != "" {
		t.State = apitype.TaskStateActive
		t.Attempts, t.StartedAt = parseMarker(r.marker)
	}
	if r.progress != "" {
		var p apitype.Progress
		if json.Unmarshal([]byte(r.progress), &p) == nil {
			t.Progress = &p
		}
	}
	if r.entry != "" {
		var e itemEntry
		if err := json.Unmarshal([]byte(r.entry), &e); err == nil {
			t.State, t.Cached, t.Attempts = e.State, e.Cached, e.Attempts
			t.StartedAt, t.CompletedAt = msTime(strconv.FormatInt(e.StartedAt, 10)), msTime(strconv.FormatInt(e.CompletedAt, 10))
			if e.Error != nil {
				t.ErrCode, t.ErrMsg = e.Error.Code, e.Error.Message
			}
			t.Result = e.Result
			if e.Ref != "" && r.extra != "" {
				t.Result = json.RawMessage(r.extra)
			}
		}
	}
	return t
}

// GetItem returns batch item index as a task record (BatchID and
// CustomID set), or ErrNotFound. It is one round trip.
func (s *Store) GetItem(ctx context.Context, batchID string, index int) (*Task, error) {
	if index < 0 {
		return nil, ErrNotFound
	}
	h, items, ok, err := decodeRead(s.readItems(ctx, s.rdb, batchID, index, 1))
	if err != nil {
		return nil, fmt.Errorf("store: get item: %w", err)
	}
	if !ok || index >= h.total || len(items) != 1 {
		return nil, ErrNotFound
	}
	return toTask(batchID, index, h, items[0]), nil
}

// ChunkInfo is one item of a chunk as a results stream first reads it:
// everything but its result, and the result's size, so the reader can
// bound the memory of reading the results before it does.
type ChunkInfo struct {
	Index    int
	CustomID *string
	Kind     puzzle.Kind
	State    apitype.TaskState
	// Error is set for a failed or canceled item.
	Error *apitype.TaskError
	// ResultBytes is the size of a completed item's result.
	ResultBytes int64
	// Result is a completed item's result when ChunkInfos read it with
	// the states (a small one: see entryIsSmall); "" when it is to be
	// read with ChunkResults, in a piece whose bytes the reader holds.
	Result string

	ref string // the cache entry holding the result, when stored once
	own bool   // the item runs in its own unit
}

// cancelArgs are the arguments of cancelItemsScript up to the offsets.
func (s *Store) cancelArgs(batchID string, j int, msg string) []any {
	e, _ := json.Marshal(apitype.TaskError{Code: apitype.CodeCanceled, Message: msg})
	args := append([]any{}, s.k.ownerAffixes()...)
	return append(args, ms(s.now()), s.k.events(), batchID, j, s.k.cancels(), `"error":`+string(e))
}

// CancelItem cancels batch item index of b unless it has ended, and
// returns its state before ("" when it is gone). An item that was active
// is announced to the workers, which abort it.
func (s *Store) CancelItem(ctx context.Context, b *Batch, index int) (apitype.TaskState, error) {
	if b.Stride <= 0 || index < 0 || index >= b.Total {
		return "", nil
	}
	j, k := index/b.Stride, index%b.Stride
	args := append(s.cancelArgs(b.ID, j, "canceled by request"), k)
	v, err := cancelItemsScript.Run(ctx, s.rdb,
		[]string{s.k.batch(b.ID), s.k.batchReq(b.ID), s.k.batchRes(b.ID, j)}, args...).StringSlice()
	if err != nil {
		return "", fmt.Errorf("store: cancel item: %w", err)
	}
	if len(v) < 2 {
		return "", nil
	}
	return apitype.TaskState(v[1]), nil
}

// ChunkEventKey is the Hub key woken when items of chunk j of a batch end.
func ChunkEventKey(batchID string, j int) string { return "c:" + batchID + ":" + strconv.Itoa(j) }
