package client

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"
)

// resultLineSeeds are lines as the API writes them, and near misses that
// must take json.Unmarshal's path.
var resultLineSeeds = []string{
	`{"index":0,"id":"0123456789abcdef0123456789abcdef-0","custom_id":null,"state":"completed","result":{"moves":["up","left"],"steps":2}}`,
	`{"index":17,"id":"b-17","custom_id":"job-17","state":"failed","error":{"code":"budget_exceeded","message":"search exceeded max_nodes"}}`,
	`{"index":3,"id":"b-3","custom_id":null,"state":"pending"}`,
	`{"index":3,"id":"b-3","custom_id":null,"state":"completed","result":null}`,
	`{"index":3,"id":"b-3","custom_id":"caf\u00e9","state":"completed","result":1}`,
	`{"index":3,"id":"b-3","custom_id":"café","state":"completed","result":1}`,
	`{"index":03,"id":"b-3","custom_id":null,"state":"completed","result":1}`,
	`{"index":3,"id":"b-3","custom_id":null,"state":"completed","result":{"a":1}`,
	`{"index":3,"id":"b-3","custom_id":null,"state":"completed","result":{"a":{"b":1}}`,
	`{"index":3,"id":"b-3","custom_id":null,"state":"completed","result": {"a":1} }`,
	`{"index":3,"id":"b-3","custom_id":null,"state":"completed","result":{"a":1,"a":2}}`,
	`{"index":3,"id":"b-3","custom_id":null,"state":"completed","result":"\xff"}`,
	`{"index":3,"id":"b-3","custom_id":null,"state":"completed","result":1}x`,
	`{"index":99999999999999999999,"id":"b","custom_id":null,"state":"completed"}`,
	`{"Index":3,"id":"b-3","custom_id":null,"state":"completed","result":1}`,
}

// FuzzDecodeResultLine holds the fast path to json.Unmarshal: the same
// lines fail, and the others decode to the same ResultLine.
func FuzzDecodeResultLine(f *testing.F) {
	for _, s := range resultLineSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want, got ResultLine
		werr := json.Unmarshal(b, &want)
		gerr := decodeResultLine(b, &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%q: json.Unmarshal: %v, decodeResultLine: %v", b, werr, gerr)
		}
		if werr == nil && !reflect.DeepEqual(want, got) {
			t.Fatalf("%q: json.Unmarshal gives %+v, decodeResultLine %+v", b, want, got)
		}
	})
}

// TestFastResultLineTakesTheAPIsLines: the lines the API writes are read
// by the fast path, not only by the fallback.
func TestFastResultLineTakesTheAPIsLines(t *testing.T) {
	for _, s := range resultLineSeeds[:4] {
		var l ResultLine
		if fast := fastResultLine([]byte(s), &l); fast != (s != resultLineSeeds[1]) {
			t.Errorf("%s: fast path %v", s, fast)
		}
	}
}

// BenchmarkDecodeResultLine compares the fast path with json.Unmarshal on
// an API's line, in one run.
func BenchmarkDecodeResultLine(b *testing.B) {
	line := []byte(resultLineSeeds[0])
	for _, bc := range []struct {
		name string
		dec  func([]byte, *ResultLine) error
	}{
		{"unmarshal", func(b []byte, l *ResultLine) error { return json.Unmarshal(b, l) }},
		{"decodeResultLine", decodeResultLine},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(line)))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				l := new(ResultLine)
				if err := bc.dec(line, l); err != nil {
					b.Fatal(strconv.Itoa(i), err)
				}
			}
		})
	}
}
