package store

import (
	"reflect"
	"testing"
)

// TestDecodeEventFields holds the event decoder to the fields
// finishManyScript writes, and to nil for anything else, so a garbled
// event falls back to reading the record instead of answering wrong.
func TestDecodeEventFields(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		in   string
		want map[string]string
	}{
		{"fields", "5:state9:completed6:result2:{}", map[string]string{"state": "completed", "result": "{}"}},
		{"empty value and colons", "7:err_msg0:3:a:b4:1:2:", map[string]string{"err_msg": "", "a:b": "1:2:"}},
		{"empty", "", map[string]string{}},
		{"no length", ":abc", nil},
		{"no colon", "5state", nil},
		{"too long", "9:abc", nil},
		{"name without value", "5:state", nil},
		{"huge length", "99999999999999999999:x", nil},
		{"sign", "-1:a1:b", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Helper()
			got := decodeEventFields([]byte(tc.in))
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decodeEventFields(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

// TestDecodeEventTaskLegacyJSON reads the JSON object a worker of the
// previous release publishes, so long polls keep answering from events
// during a rolling upgrade.
func TestDecodeEventTaskLegacyJSON(t *testing.T) {
	t.Parallel()
	got := DecodeEventTask("a", []byte(`{"state":"completed","result":"{\"moves\":1}","attempts":"1"}`))
	if got == nil || got.State != "completed" || string(got.Result) != `{"moves":1}` || got.Attempts != 1 {
		t.Fatalf("legacy event decoded to %+v", got)
	}
	if DecodeEventTask("a", []byte(`{"state":`)) != nil {
		t.Fatal("a broken legacy event decoded")
	}
}
