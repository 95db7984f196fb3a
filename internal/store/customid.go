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

// FindCustomID returns the index of b's item, from index from on, whose
// custom_id is id, or -1 when none has it. The upload refuses a custom_id
// twice in a batch, so there is one at most. It reads only the chunks'
// custom_id lists (the batch's request hash, fields "i<chunk>"),
// customIDGroup chunks a command, up to the match: each list once at
// most, never a request or a result. A chunk whose items have no
// custom_id has no list and costs nothing but its field's name.
func (s *Store) FindCustomID(ctx context.Context, b *Batch, id string, from int) (int, error) {
	from = max(from, 0)
	if b.Stride <= 0 || from >= b.Total || id == "" {
		return -1, nil
	}
	// The lists hold each custom_id as json.Marshal wrote it when the
	// batch was staged (BatchWriter.Add): one spelling per string.
	want, err := json.Marshal(id)
	if err != nil {
		return -1, fmt.Errorf("store: find custom_id: %w", err)
	}
	chunks := b.Chunks()
	for j0 := from / b.Stride; j0 < chunks; j0 += customIDGroup {
		n := min(customIDGroup, chunks-j0)
		fields := make([]string, n)
		for g := range n {
			fields[g] = "i" + strconv.Itoa(j0+g)
		}
		lists, err := s.rdb.HMGet(ctx, s.k.batchReq(b.ID), fields...).Result()
		if err != nil {
			return -1, fmt.Errorf("store: find custom_id: %w", err)
		}
		for g, v := range lists {
			list, ok := v.(string)
			if !ok || !strings.Contains(list, string(want)) {
				continue
			}
			first := (j0 + g) * b.Stride
			for k, line := range strings.Split(list, "\n") {
				if i := first + k; i >= from && i < b.Total && line == string(want) {
					return i, nil
				}
			}
		}
	}
	return -1, nil
}
