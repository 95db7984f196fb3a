package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// customIDGroup is how many chunks' custom_id lists one HMGET of
// FindCustomID reads: at most CHUNK_SIZE 2048 times 66 bytes (a 64-byte
// custom_id as JSON, and its newline) each, about 2.2 MB a command, so a
// search holds one group at a time whatever the batch's size.
const customIDGroup = 16

// FindCustomID looks for b's item whose custom_id is id from index from
// on, reading the custom_id lists of at most maxChunks chunks (rounded up
// to whole groups of customIDGroup). It returns the item's index, or -1
// and the index the search stopped at: b.Total when it read to the end,
// less when maxChunks ran out first, so that the caller answers a page
// with a cursor rather than reading a million items' lists in one
// request. The upload refuses a custom_id twice in a batch, so there is
// one at most. It reads only the chunks' custom_id lists (the batch's
// request hash, fields "i<chunk>"), customIDGroup chunks a command: each
// list once at most, never a request or a result. A chunk whose items
// have no custom_id has no list and costs nothing but its field's name.
func (s *Store) FindCustomID(ctx context.Context, b *Batch, id string, from, maxChunks int) (found, next int, err error) {
	from = max(from, 0)
	if b.Stride <= 0 || from >= b.Total || id == "" {
		return -1, b.Total, nil
	}
	// The lists hold each custom_id as json.Marshal wrote it when the
	// batch was staged (BatchWriter.Add): one spelling per string.
	want, err := json.Marshal(id)
	if err != nil {
		return -1, 0, fmt.Errorf("store: find custom_id: %w", err)
	}
	chunks := b.Chunks()
	for j0, read := from/b.Stride, 0; j0 < chunks; j0 += customIDGroup {
		if read >= max(maxChunks, 1) {
			return -1, j0 * b.Stride, nil
		}
		n := min(customIDGroup, chunks-j0)
		read += n
		fields := make([]string, n)
		for g := range n {
			fields[g] = "i" + strconv.Itoa(j0+g)
		}
		lists, err := s.rdb.HMGet(ctx, s.k.batchReq(b.ID), fields...).Result()
		if err != nil {
			return -1, 0, fmt.Errorf("store: find custom_id: %w", err)
		}
		for g, v := range lists {
			list, ok := v.(string)
			if !ok || !strings.Contains(list, string(want)) {
				continue
			}
			first := (j0 + g) * b.Stride
			for k, line := range strings.Split(list, "\n") {
				if i := first + k; i >= from && i < b.Total && line == string(want) {
					return i, b.Total, nil
				}
			}
		}
	}
	return -1, b.Total, nil
}
