package recovery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/puzzleq/puzzleq/internal/redistest"
	"github.com/puzzleq/puzzleq/internal/store"
	"github.com/puzzleq/puzzleq/internal/testgen"
	"github.com/puzzleq/puzzleq/puzzle"
)

// feedStack is the store on a real Redis with asynq's client and
// inspector on the same server, for the reconciler's tests.
type feedStack struct {
	st   *store.Store
	enq  *asynq.Client
	insp *asynq.Inspector
	rdb  *redis.Client
}

func newFeedStack(t testing.TB) *feedStack {
	t.Helper()
	rdb := redistest.Start(t).Client(t)
	st := store.New(rdb, store.Options{Prefix: "rd:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	return &feedStack{st: st, enq: asynq.NewClientFromRedisClient(rdb), insp: asynq.NewInspectorFromRedisClient(rdb), rdb: rdb}
}

// sliding8 is the canonical request of an 8-puzzle, distinct per i.
func sliding8(t testing.TB, i int) []byte {
	t.Helper()
	body := testgen.EightPuzzle(i)
	pz, err := puzzle.Decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return pz.Payload()
}

// stage stages and commits a batch of n 8-puzzles for alice in chunks of
// stride items, as the API does, and returns its ID; nothing is fed.
func (s *feedStack) stage(t *testing.T, n, stride int) string {
	t.Helper()
	ctx := context.Background()
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	w := s.st.NewBatchWriter(id, stride)
	for i := range n {
		if err := w.Add(ctx, store.StagedItem{Kind: puzzle.KindSliding, Request: sliding8(t, i), Timeout: time.Minute}); err != nil {
			t.Fatalf("stage item %d: %v", i, err)
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.st.CommitBatch(ctx, w, store.CommitBatch{ID: id, Owner: "alice"}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return id
}
