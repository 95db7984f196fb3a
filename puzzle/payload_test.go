package puzzle_test

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/puzzleq/puzzleq/puzzle"
)

// payloadSeeds are canonical payloads and near misses of them: every one
// must mean to DecodePayload what it means to Decode.
var payloadSeeds = []string{
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"max_nodes":5}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,2,3,4],[5,6,7,8],[9,10,11,12],[13,14,0,15]]},"options":{}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0],[3,2]]},"options":{}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]}}`,                           // not canonical: no options
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"max_nodes":0}}`, // 0 is omitted
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,06]]},"options":{}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,8]]},"options":{}}`, // duplicate tile
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8]]},"options":{}}`,   // ragged
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{}} `,
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"max_nodes":-1}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"max_nodes":99999999999999999999}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{"max_nodes":5,"max_nodes":6}}`,
	`{"kind":"sliding","puzzle":{"board":[[100,0,3],[4,2,5],[7,8,6]]},"options":{}}`,
	`{"kind":"sliding","puzzle":{"board":[[]]},"options":{}}`,
	`{"kind":"sliding","puzzle":{"board":[]},"options":{}}`,
	`{"kind":"sliding","puzzle":{"board":[[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]]},"options":{}}`,
	`{"kind":"fill","puzzle":{"game_board":[[0,0,0],[1,1,0],[1,1,1]],"table":[[1,1,1],[1,0,0],[0,0,0]]},"options":{"allow_flip":true}}`,
	`{"kind":"sliding","puzzle":{"board":[[1,0,3],[4,2,5],[7,8,6]]},"options":{}`,
	``,
}

// TestDecodePayloadIsDecode holds the fast path to Decode on the seeds.
func TestDecodePayloadIsDecode(t *testing.T) {
	for _, s := range payloadSeeds {
		samePayloadDecode(t, []byte(s))
	}
}

// FuzzDecodePayload holds DecodePayload to Decode on any bytes: the same
// request (kind, board, options, payload, key) or the same error. A
// worker reads batch items with it, so bytes that changed in Redis must
// fail or solve exactly as Decode would have them.
func FuzzDecodePayload(f *testing.F) {
	for _, s := range payloadSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(samePayloadDecode)
}

func samePayloadDecode(t *testing.T, data []byte) {
	t.Helper()
	in := bytes.Clone(data)
	want, werr := puzzle.Decode(data)
	got, gerr := puzzle.DecodePayload(data)
	if !bytes.Equal(in, data) {
		t.Fatalf("DecodePayload changed its input %q", in)
	}
	if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
		t.Fatalf("%q: Decode says %v, DecodePayload %v", data, werr, gerr)
	}
	if werr != nil {
		return
	}
	if got.Kind() != want.Kind() || got.Key() != want.Key() || !bytes.Equal(got.Payload(), want.Payload()) ||
		got.Cells() != want.Cells() || got.MaxNodes() != want.MaxNodes() || got.Cheap() != want.Cheap() {
		t.Fatalf("%q: DecodePayload read %s (key %s), Decode %s (key %s)", data, got.Payload(), got.Key(), want.Payload(), want.Key())
	}
	if want.Kind() == puzzle.KindSliding && !reflect.DeepEqual(got.SlidingPuzzle(), want.SlidingPuzzle()) {
		t.Fatalf("%q: boards differ: %v and %v", data, got.SlidingPuzzle(), want.SlidingPuzzle())
	}
	if len(data) > 0 {
		data[0] ^= 0xff // the Parsed must not alias its input
		if got.Payload()[0] == data[0] {
			t.Fatalf("%q: the payload aliases the input", in)
		}
		data[0] ^= 0xff
	}
}

// TestDecodePayloadFastPath checks that a canonical 8-puzzle takes the
// fast path, not Decode: the reason DecodePayload exists.
func TestDecodePayloadFastPath(t *testing.T) {
	data := []byte(payloadSeeds[0])
	fast := testing.AllocsPerRun(100, func() { puzzle.DecodePayload(data) })
	slow := testing.AllocsPerRun(100, func() { puzzle.Decode(data) })
	if fast > 8 || fast*3 > slow {
		t.Fatalf("DecodePayload allocates %.0f times a canonical payload, Decode %.0f", fast, slow)
	}
}
