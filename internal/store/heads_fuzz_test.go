package store

import (
	"encoding/json"
	"reflect"
	"testing"
)

// plainHeadSeeds are heads as finishUnitScript and cancelItemsScript
// write them, and near misses that parsePlainHead must leave to
// encoding/json.
var plainHeadSeeds = []string{
	`{"state":"completed","started_at":1764633600000,"completed_at":1764633600012,"attempts":1,"size":62}`,
	`{"state":"failed","started_at":1,"completed_at":2,"attempts":3,"error":{"code":"unsolvable","message":"no"}}`,
	`{"state":"canceled","completed_at":1764633600012,"attempts":0}`,
	`{"state":"completed","completed_at":5,"attempts":1,"ref":"abc","size":9}`,
	`{"state":"completed","completed_at":5,"attempts":1,"cached":true,"size":9}`,
	`{"state":"completed","attempts":01}`,
	`{"state":"completed","attempts":-1}`,
	`{"state":"completed","Attempts":2}`,
	`{"state":"completed","attempts":2,"attempts":3}`,
	`{"state":"compl\u0065ted"}`,
	`{"state":"completed" ,"size":1}`,
	`{"state":"completed","size":1}x`,
	`{"state":""}`,
	`{"state":"completed","size":99999999999999999999}`,
}

// FuzzParsePlainHead: wherever the reflection-free decoder answers, its
// answer is encoding/json's (the slow path it stands in for).
func FuzzParsePlainHead(f *testing.F) {
	for _, s := range plainHeadSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		got, ok := parsePlainHead(h)
		if !ok {
			return
		}
		var want itemEntry
		if err := json.Unmarshal([]byte(h), &want); err != nil {
			t.Fatalf("parsePlainHead(%q) = %+v, but encoding/json fails: %v", h, got, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("parsePlainHead(%q) = %+v, encoding/json %+v", h, got, want)
		}
	})
}

// TestParsePlainHeadTakesTheCommonHeads: the fast path is taken for what
// the scripts write for a completed or canceled 8-puzzle (else it saves
// nothing), and refuses what it does not decode.
func TestParsePlainHeadTakesTheCommonHeads(t *testing.T) {
	for _, tc := range []struct {
		head string
		ok   bool
	}{
		{plainHeadSeeds[0], true},
		{plainHeadSeeds[2], true},
		{plainHeadSeeds[1], false}, // an error member
		{plainHeadSeeds[3], false}, // a ref
		{plainHeadSeeds[5], false}, // a leading zero
		{plainHeadSeeds[7], false}, // another case
		{plainHeadSeeds[8], true},  // a repeated member: the last wins, as in encoding/json
		{plainHeadSeeds[11], false},
	} {
		e, ok := parsePlainHead(tc.head)
		if ok != tc.ok {
			t.Errorf("parsePlainHead(%q): ok %v, want %v", tc.head, ok, tc.ok)
		}
		if ok {
			var want itemEntry
			if err := json.Unmarshal([]byte(tc.head), &want); err != nil || !reflect.DeepEqual(e, want) {
				t.Errorf("parsePlainHead(%q) = %+v, encoding/json %+v (%v)", tc.head, e, want, err)
			}
		}
	}
}
