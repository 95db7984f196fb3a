package store

import (
	"context"
	"testing"
	"time"

	"github.com/puzzleq/puzzleq/internal/redistest"
)

// BenchmarkGetWithWebhook measures what reading a task's webhook with it
// (one pipeline of two HGETALLs, the second on a key that does not exist)
// costs over the record alone, in one run:
//
//	go test ./internal/store/ -run '^$' -bench GetWithWebhook -count 3
func BenchmarkGetWithWebhook(b *testing.B) {
	rdb := redistest.Start(b).Client(b)
	s := New(rdb, Options{Prefix: "bw:", TaskTTL: time.Hour, ResultTTL: time.Hour})
	ctx := context.Background()
	id := "0123456789abcdef0123456789abcdef"
	if _, _, err := s.SubmitTask(ctx, NewTask{ID: id, Kind: "sliding"}, 0); err != nil {
		b.Fatal(err)
	}
	b.Run("record_only", func(b *testing.B) {
		for b.Loop() {
			if err := rdb.HGetAll(ctx, s.k.task(id)).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("with_webhook", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Get(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	})
}
