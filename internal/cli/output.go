package cli

import (
	"bytes"
	"encoding/json"
	"io"

	"sigs.k8s.io/yaml"
)

// The values of -o. json and yaml print one document, as kubectl and gh
// do, so that jq and yq read the whole output; ndjson prints one compact
// object per line, so that a stream can be read while it is written.
const (
	formatTable  = "table"
	formatJSON   = "json"
	formatYAML   = "yaml"
	formatNDJSON = "ndjson"
)

// outputFormats are the values -o accepts, in the order help lists them.
var outputFormats = []string{formatTable, formatJSON, formatYAML, formatNDJSON}

// writeDoc writes v as one document in format (json, yaml or ndjson).
func writeDoc(w io.Writer, format string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeRawDoc(w, format, b)
}

// writeRawDoc writes the JSON b as one document in format.
func writeRawDoc(w io.Writer, format string, b []byte) error {
	switch format {
	case formatYAML:
		y, err := yaml.JSONToYAML(b)
		if err != nil {
			return err
		}
		_, err = w.Write(y)
		return err
	case formatJSON:
		var buf bytes.Buffer
		if err := json.Indent(&buf, b, "", "  "); err != nil {
			return err
		}
		buf.WriteByte('\n')
		_, err := buf.WriteTo(w)
		return err
	default:
		_, err := w.Write(append(b, '\n'))
		return err
	}
}

// listWriter writes a list as one document, item by item, so that a list
// of a million results is never held in memory: a JSON array, a YAML
// sequence, or (ndjson) one line per item. close ends the document; an
// empty list is "[]" in json and yaml, and nothing in ndjson.
type listWriter struct {
	w      io.Writer
	format string
	n      int
	buf    bytes.Buffer
}

func newListWriter(w io.Writer, format string) *listWriter {
	return &listWriter{w: w, format: format}
}

// add writes v as the list's next item.
func (l *listWriter) add(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return l.addRaw(b)
}

// addRaw writes the JSON object b as the list's next item.
func (l *listWriter) addRaw(b []byte) error {
	b = bytes.TrimRight(b, "\n")
	l.buf.Reset()
	switch l.format {
	case formatJSON:
		if l.n == 0 {
			l.buf.WriteString("[\n  ")
		} else {
			l.buf.WriteString(",\n  ")
		}
		if err := json.Indent(&l.buf, b, "  ", "  "); err != nil {
			return err
		}
	case formatYAML:
		// A one-item sequence is the item as a sequence entry: "- a: 1\n  b: 2\n".
		y, err := yaml.JSONToYAML(append(append([]byte{'['}, b...), ']'))
		if err != nil {
			return err
		}
		l.buf.Write(y)
	default:
		l.buf.Write(b)
		l.buf.WriteByte('\n')
	}
	l.n++
	_, err := l.buf.WriteTo(l.w)
	return err
}

// close ends the document.
func (l *listWriter) close() error {
	var err error
	switch {
	case l.format == formatJSON && l.n > 0:
		_, err = io.WriteString(l.w, "\n]\n")
	case (l.format == formatJSON || l.format == formatYAML) && l.n == 0:
		_, err = io.WriteString(l.w, "[]\n")
	}
	return err
}
