package api

import (
	"math/rand"
	"testing"
)

// TestSentWindowBounded: tasks ending in any order are each sent once;
// one that ends past the window is held back until the watermark comes
// within the window of it, never dropped; the window's memory is fixed
// at its start whatever is marked (a slow first task holds the
// watermark at 0 while the rest end).
func TestSentWindowBounded(t *testing.T) {
	for _, tc := range []struct {
		name          string
		total, window int
		slowFirst     bool
	}{
		{"whole batch in the window", 1000, 4096, false},
		{"window smaller than the batch", 5000, 256, false},
		{"slow first task", 5000, 256, true},
		{"window not a multiple of 64", 777, 100, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewSource(int64(tc.total + tc.window)))
			s := newSentWindow(0, tc.total, tc.window)
			words := len(s.bits)
			if words*8 > (tc.window+63)/64*8 {
				t.Fatalf("%d words for a window of %d", words, tc.window)
			}
			// ended is the order the tasks end in: shuffled, with task 0
			// last when the first is slow.
			ended := rng.Perm(tc.total)
			if tc.slowFirst {
				for i, v := range ended {
					if v == 0 {
						ended = append(append(ended[:i:i], ended[i+1:]...), 0)
						break
					}
				}
			}
			done := make([]bool, tc.total)
			sentAt := make([]int, tc.total) // how many times each was sent
			sent := 0
			// Each round one more task ends, and the stream scans the
			// window as sendChunk does: every ended task it covers and
			// has not sent.
			for _, v := range ended {
				done[v] = true
				for i := s.w; i < min(s.end(), tc.total); i++ {
					if done[i] && s.covers(i) && !s.has(i) {
						s.mark(i)
						sentAt[i]++
						sent++
					}
				}
				if len(s.bits) != words {
					t.Fatalf("the window grew from %d to %d words", words, len(s.bits))
				}
				if s.count() != sent {
					t.Fatalf("count %d, sent %d", s.count(), sent)
				}
				if tc.slowFirst && !done[0] && (s.w != 0 || sent > 64*words) {
					t.Fatalf("with task 0 not ended: watermark %d, %d sent, window %d bits", s.w, sent, 64*words)
				}
			}
			if s.w != tc.total || sent != tc.total {
				t.Fatalf("all ended: watermark %d, sent %d, want %d", s.w, sent, tc.total)
			}
			for i, n := range sentAt {
				if n != 1 {
					t.Fatalf("task %d sent %d times", i, n)
				}
			}
		})
	}
}
