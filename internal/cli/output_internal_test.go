package cli

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestListWriterIsOneDocument writes the same items in each format and
// reads them back: json and yaml as one document that parses to the
// items (an empty list too), ndjson as one object per line.
func TestListWriterIsOneDocument(t *testing.T) {
	items := []map[string]any{
		{"id": "a", "n": 1.0, "nested": map[string]any{"list": []any{"x", "y"}}},
		{"id": "b\n\"quoted\"", "n": 2.0, "empty": map[string]any{}},
		{"id": "c", "result": nil},
	}
	for _, n := range []int{0, 1, 3} {
		for _, format := range []string{formatJSON, formatYAML, formatNDJSON} {
			var buf bytes.Buffer
			lw := newListWriter(&buf, format)
			for _, it := range items[:n] {
				if err := lw.add(it); err != nil {
					t.Fatal(err)
				}
			}
			if err := lw.close(); err != nil {
				t.Fatal(err)
			}
			var got []map[string]any
			switch format {
			case formatJSON:
				if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
					t.Fatalf("%d items as json: %v\n%s", n, err, buf.String())
				}
			case formatYAML:
				if err := yaml.Unmarshal(buf.Bytes(), &got); err != nil {
					t.Fatalf("%d items as yaml: %v\n%s", n, err, buf.String())
				}
			case formatNDJSON:
				if lines := bytes.Count(buf.Bytes(), []byte("\n")); lines != n {
					t.Fatalf("%d items as ndjson: %d lines\n%s", n, lines, buf.String())
				}
				dec := json.NewDecoder(&buf)
				for dec.More() {
					var m map[string]any
					if err := dec.Decode(&m); err != nil {
						t.Fatal(err)
					}
					got = append(got, m)
				}
			}
			want := items[:n]
			if n == 0 {
				want = []map[string]any{}
				if format == formatNDJSON {
					want = nil
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%d items as %s read back as %v; want %v\n%s", n, format, got, want, buf.String())
			}
		}
	}
}
