package store

// Batches are stored as a whole (docs/batches.md): a batch record, its
// items' requests cut into chunks, one result hash per chunk, and a fair
// feed of the units that run them. This file is that layout's API; the
// scripts it runs are documented beside it.

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/tasks"
)

// errNotYet marks the parts of the batch layout still being written.
var errNotYet = errors.New("store: batch layout: not implemented yet")

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

// BatchWriter stages a batch's items as they are decoded, a chunk at a
// time, so that an upload of a million items never holds more than a
// chunk (or a few, in flight to Redis) in memory. Nothing it writes is
// visible, or lasts, until CommitBatch. It is not safe for concurrent use.
type BatchWriter struct {
	s      *Store
	id     string
	stride int
}

// NewBatchWriter starts staging batch id, stride items to a chunk.
func (s *Store) NewBatchWriter(id string, stride int) *BatchWriter {
	return &BatchWriter{s: s, id: id, stride: stride}
}

// Add stages the next item. It writes to Redis when a chunk fills.
func (w *BatchWriter) Add(ctx context.Context, it StagedItem) error { return errNotYet }

// Total is the number of items added so far.
func (w *BatchWriter) Total() int { return 0 }

// Buffered is how many bytes of items the writer holds that are not yet
// written, for the API's admission by bytes.
func (w *BatchWriter) Buffered() int64 { return 0 }

// CustomIDAt returns the custom_id of an item already added, reading it
// back from Redis when its chunk was written; the API uses it to confirm
// a duplicate custom_id that its hashes suggest.
func (w *BatchWriter) CustomIDAt(ctx context.Context, index int) (string, error) {
	return "", errNotYet
}

// Close writes what is buffered. After it, CommitBatch makes the batch.
func (w *BatchWriter) Close(ctx context.Context) error { return errNotYet }

// Discard deletes what was staged, for an upload that failed. The staged
// keys also expire on their own, for a process that died.
func (w *BatchWriter) Discard(ctx context.Context) error { return errNotYet }

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

// CommitBatch makes the batch staged by w in one script: it checks the
// claim (ErrClaimLost), admits the items against the quota (ErrQuota),
// writes the batch record, gives the staged keys the batch's TTL and puts
// every unit in the feed. On any error nothing is committed, except when
// the reply was lost: see AbandonCommit.
func (s *Store) CommitBatch(ctx context.Context, w *BatchWriter, cb CommitBatch) error {
	return errNotYet
}

// AbandonCommit undoes a CommitBatch whose outcome is unknown (its reply
// was lost), unless a unit of the batch has been fed: then it runs, and
// AbandonCommit answers BatchKept. It returns BatchNotWritten,
// BatchAbandoned or BatchKept.
func (s *Store) AbandonCommit(ctx context.Context, w *BatchWriter, cb CommitBatch) (int, error) {
	return 0, errNotYet
}

// Feed takes up to max units from the feed, in fair order (see
// docs/batches.md), while queue's asynq pending list holds fewer than
// depth tasks, moving them to the feeding set. Units of batches that are
// gone or canceled are dropped, not returned. The caller enqueues them
// and then calls AckFed.
func (s *Store) Feed(ctx context.Context, queue string, depth, max int) ([]tasks.UnitRef, error) {
	return nil, errNotYet
}

// AckFed removes enqueued units from the feeding set.
func (s *Store) AckFed(ctx context.Context, refs []tasks.UnitRef) error { return errNotYet }

// StaleFed returns up to limit units that were taken from the feed before
// before and never acknowledged: their feeder died. The reconciler
// enqueues them again.
func (s *Store) StaleFed(ctx context.Context, before time.Time, limit int) ([]tasks.UnitRef, error) {
	return nil, errNotYet
}

// StartUnit marks a unit active (its items' counts move from pending to
// active once, however often it is delivered), counts an attempt, and
// returns the unit's items that have not ended.
func (s *Store) StartUnit(ctx context.Context, ref tasks.UnitRef) (*tasks.UnitWork, error) {
	return nil, errNotYet
}

// FinishUnit writes the outcomes of a unit's items. Only an item without
// an ended entry gets one (so a redelivered unit, or one whose item was
// canceled meanwhile, changes and counts nothing twice); it moves the
// batch's counts, gives back the owner's quota, publishes the chunk's
// event and, when it ended the batch's last item, sets done_at and
// publishes the batch's. It returns how many items it ended.
func (s *Store) FinishUnit(ctx context.Context, ref tasks.UnitRef, outs []tasks.ItemOutcome) (int, error) {
	return 0, errNotYet
}

// Cached returns the cached result for key, nil on a miss.
func (s *Store) Cached(ctx context.Context, key string) (json.RawMessage, error) {
	return nil, errNotYet
}

// GetItem returns batch item index as a task record (BatchID and
// CustomID set), or ErrNotFound.
func (s *Store) GetItem(ctx context.Context, batchID string, index int) (*Task, error) {
	return nil, errNotYet
}

// ItemsPage returns items [start, start+limit) of b as task records,
// results included, for GET /v1/batches/{id}.
func (s *Store) ItemsPage(ctx context.Context, b *Batch, start, limit int) ([]*Task, error) {
	return nil, errNotYet
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
}

// ChunkInfos returns the items of chunk j of b, in order.
func (s *Store) ChunkInfos(ctx context.Context, b *Batch, j int) ([]ChunkInfo, error) {
	return nil, errNotYet
}

// ChunkResults returns the results of the completed items at indexes idx
// (all in chunk j of b), in order; ok[i] is false for one whose result is
// gone (expired).
func (s *Store) ChunkResults(ctx context.Context, b *Batch, j int, idx []int) (results []string, ok []bool, err error) {
	return nil, nil, errNotYet
}

// CancelItem cancels batch item index of b unless it has ended, and
// returns its state before.
func (s *Store) CancelItem(ctx context.Context, b *Batch, index int) (apitype.TaskState, error) {
	return "", errNotYet
}

// ChunkEventKey is the Hub key woken when items of chunk j of a batch end.
func ChunkEventKey(batchID string, j int) string { return "c:" + batchID + ":" + strconv.Itoa(j) }
