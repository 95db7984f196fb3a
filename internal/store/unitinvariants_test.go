package store

// What the unit scripts' tests hold a store to, whichever scripts they
// compare: the keys of a prefix, whole (dumpKeys), and a batch's counts
// and quota against its entries and markers (checkUnitInvariants).

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// dumpKeys returns every key of s's prefix with its type, whether it has
// a TTL and its whole value, as sorted lines, with the prefix cut from
// the key names and the batch's expiry (Redis's clock at the commit, the
// one value the two stores cannot share) replaced by EXP.
func dumpKeys(t *testing.T, ctx context.Context, s *Store, exp string) []string {
	t.Helper()
	rdb := s.rdb
	keys, err := rdb.Keys(ctx, s.k.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range keys {
		typ := rdb.Type(ctx, k).Val()
		var val string
		switch typ {
		case "string":
			val = rdb.Get(ctx, k).Val()
		case "hash":
			h := rdb.HGetAll(ctx, k).Val()
			fs := make([]string, 0, len(h))
			for f, v := range h {
				fs = append(fs, strconv.Quote(f)+"="+strconv.Quote(v))
			}
			slices.Sort(fs)
			val = strings.Join(fs, " ")
		case "zset":
			for _, z := range rdb.ZRangeWithScores(ctx, k, 0, -1).Val() {
				val += fmt.Sprintf("%v@%s ", z.Member, strconv.FormatFloat(z.Score, 'f', -1, 64))
			}
		case "list":
			val = strings.Join(rdb.LRange(ctx, k, 0, -1).Val(), " ")
		default:
			val = "?"
		}
		ttl := "persist"
		if rdb.PTTL(ctx, k).Val() > 0 {
			ttl = "ttl"
		}
		if exp != "" {
			val = strings.ReplaceAll(val, exp, "EXP")
		}
		out = append(out, fmt.Sprintf("%s %s %s %s", strings.TrimPrefix(k, s.k.prefix), typ, ttl, val))
	}
	slices.Sort(out)
	return out
}

// checkUnitInvariants holds a batch's counts and its owner's quota to
// its entries and markers (units.go's invariants): an item with an
// entry has ended in the entry's state; one without, active while its
// unit's marker exists, else pending.
func checkUnitInvariants(t *testing.T, ctx context.Context, s *Store, id, owner string) {
	t.Helper()
	rdb := s.rdb
	bh := rdb.HGetAll(ctx, s.k.batch(id)).Val()
	if len(bh) == 0 {
		return
	}
	total, _ := strconv.Atoi(bh["total"])
	stride, _ := strconv.Atoi(bh["stride"])
	want := map[string]int{}
	for j := 0; j*stride < total; j++ {
		m := rdb.HGet(ctx, s.k.batchReq(id), "m"+strconv.Itoa(j)).Val()
		res := rdb.HGetAll(ctx, s.k.batchRes(id, j)).Val()
		for k := range len(m) {
			e, ended := res[strconv.Itoa(k)]
			switch {
			case ended:
				var h itemEntry
				if err := json.Unmarshal([]byte(e), &h); err != nil {
					t.Fatalf("item %d: entry %q: %v", j*stride+k, e, err)
				}
				want[string(h.State)]++
				want["ended"]++
			case res[markerField(m[k], k)] != "":
				want["active"]++
			default:
				want["pending"]++
			}
		}
	}
	for _, f := range []string{"pending", "active", "completed", "failed", "canceled", "ended"} {
		if got, _ := strconv.Atoi(bh[f]); got != want[f] {
			t.Errorf("%s: %s counts %d, its entries and markers %d (%v)", id, f, got, want[f], bh)
		}
	}
	open := total - want["ended"]
	if got, _ := rdb.HGet(ctx, s.k.ownerOpen(owner), id).Int(); got != open {
		t.Errorf("%s: the quota counts %d of its items open, %d have not ended", id, got, open)
	}
	if got, _ := rdb.Get(ctx, s.k.ownerPending(owner)).Int(); got != open {
		t.Errorf("%s: the owner's pending counter is %d, %d items have not ended", id, got, open)
	}
}
