package puzzle

import (
	"bytes"
	"reflect"
	"testing"
)

// fastSeeds are requests and items in and around the fast path's
// spelling: taken ones, and near misses that must go the general way.
var fastSeeds = []string{
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"max_nodes":0}}`,
	`{"kind":"sliding","puzzle":{"board":[[15,14,8,12],[10,11,9,13],[2,6,5,1],[3,7,4,0]]},"options":{"max_nodes":5000000}}`,
	`{"custom_id":"a-1","kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}`,
	`{"custom_id":"","kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}`,
	`{"custom_id":"a\u0041","kind":"sliding","puzzle":{"board":[[1,0],[3,2]]}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,8]]}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8]]}}`,
	`{"kind":"sliding","puzzle":{"board":[[01,0],[3,2]]}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]},"options":{"max_nodes":-1}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]},"options":{"max_nodes":1}} `,
	`{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]},"kind":"sliding"}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]],"board":[[1,0],[3,2]]}}`,
	`{"kind":"sliding","puzzle":{"board":[[1]]}}`,
	`{"kind":"sweep","puzzle":{"board":["."]}}`,
}

// FuzzFastSliding holds the fast path to the general one: whatever the
// fast path takes, the general path takes too and decodes to the same
// request (payload bytes, key, custom_id); what it leaves is the general
// path's to accept or refuse.
func FuzzFastSliding(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, withID := range []bool{true, false} {
			fp, fid, ok := fastSliding(data, withID)
			if !ok {
				continue
			}
			var (
				gp  *Parsed
				gid string
				err error
			)
			if withID {
				gp, gid, err = decodeItem(data)
			} else {
				gp, err = decode(data)
			}
			if err != nil {
				t.Fatalf("fast path took %q (custom_id allowed: %v), the general path refuses it: %v", data, withID, err)
			}
			if fid != gid || !bytes.Equal(fp.Payload(), gp.Payload()) || fp.Key() != gp.Key() || !reflect.DeepEqual(fp, gp) {
				t.Fatalf("%q: fast path %q %s %+v, general path %q %s %+v", data, fid, fp.Payload(), fp, gid, gp.Payload(), gp)
			}
		}
	})
}

// The fast path takes what it is for: the lines of a bulk upload and the
// payloads the API stores. (Were it to take nothing, FuzzFastSliding
// would pass and save nothing.)
func TestFastSlidingTakesItsSpelling(t *testing.T) {
	for i, s := range fastSeeds[:5] {
		if _, _, ok := fastSliding([]byte(s), true); !ok {
			t.Errorf("seed %d %s: not taken", i, s)
		}
	}
	p, _, _ := fastSliding([]byte(fastSeeds[0]), false)
	if q, _, ok := fastSliding(p.Payload(), false); !ok || q.Key() != p.Key() {
		t.Errorf("its own payload %s: not taken", p.Payload())
	}
	for i, s := range fastSeeds[5:] {
		if _, _, ok := fastSliding([]byte(s), true); ok {
			t.Errorf("near miss %d %s: taken", i, s)
		}
	}
}
