package puzzle

import (
	"bytes"
	"fmt"
	"strconv"
)

// duplicateKey reports the path of the first object key that appears twice
// in the same object of data, which must be valid JSON. encoding/json silently keeps
// the last value; a request whose meaning depends on which parser reads it
// is rejected instead. The scan is linear and allocates only for keys, so
// it costs little next to decoding even a 1000×1000 board.
func duplicateKey(data []byte) (string, bool) {
	type frame struct {
		object    bool
		expectKey bool
		keys      map[string]struct{}
		key       string // the current member's key (objects)
		index     int    // the current element's index (arrays)
	}
	path := func(stack []frame, last string) string {
		var b bytes.Buffer
		for _, f := range stack[:len(stack)-1] {
			if f.object {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(f.key)
			} else {
				fmt.Fprintf(&b, "[%d]", f.index)
			}
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(last)
		return b.String()
	}
	var stack []frame
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '{':
			stack = append(stack, frame{object: true, expectKey: true})
		case '[':
			stack = append(stack, frame{})
		case '}', ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		case ',':
			if n := len(stack); n > 0 {
				if stack[n-1].object {
					stack[n-1].expectKey = true
				} else {
					stack[n-1].index++
				}
			}
		case '"':
			start := i + 1
			escaped := false
			for i++; i < len(data); i++ {
				if data[i] == '\\' {
					escaped = true
					i++
					continue
				}
				if data[i] == '"' {
					break
				}
			}
			n := len(stack)
			if n == 0 || !stack[n-1].object || !stack[n-1].expectKey || i > len(data) {
				continue
			}
			top := &stack[n-1]
			top.expectKey = false
			raw := data[start:min(i, len(data))]
			key := string(raw)
			if escaped {
				if k, err := strconv.Unquote(`"` + string(raw) + `"`); err == nil {
					key = k
				}
			}
			if top.keys == nil {
				top.keys = map[string]struct{}{}
			}
			if _, dup := top.keys[key]; dup {
				return path(stack, key), true
			}
			top.keys[key] = struct{}{}
			top.key = key
		}
	}
	return "", false
}

// checkDuplicateKeys turns a duplicate key into an InputError.
func checkDuplicateKeys(data []byte) error {
	if !bytes.Contains(data, []byte(`"`)) {
		return nil
	}
	if k, ok := duplicateKey(data); ok {
		return inputErr(CodeInvalidRequest, k, fmt.Sprintf("key %q appears twice in one object", truncate(k, 40)))
	}
	return nil
}
