package cli

import (
	"bytes"
	"errors"
	"io"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
)

// decodeItem validates one line of an NDJSON batch as the API does: the
// request, held to puzzle.Decode's rules, and an optional top-level
// "custom_id", a string of at most apitype.MaxCustomIDBytes bytes. has
// reports whether the line had a custom_id.
//
// It stands in for puzzle.DecodeItem, which another branch adds: the
// member is taken out of the object and the rest goes to puzzle.Decode,
// so every other decision (unknown or repeated names, case, UTF-8) stays
// puzzle's. Replace it with puzzle.DecodeItem once that lands.
func decodeItem(line []byte) (customID string, has bool, err error) {
	// A custom_id is spelled "custom_id", or with an escape somewhere in
	// it: most lines have neither, and pay for no second pass.
	if !bytes.Contains(line, []byte(`custom_id`)) && bytes.IndexByte(line, '\\') < 0 {
		_, err := puzzle.Decode(line)
		return "", false, err
	}
	rest, customID, has, ok := withoutCustomID(line)
	if has && !ok {
		return "", false, invalidItem("custom_id", "%s", customID)
	}
	if !ok {
		// Not an object of unique names: puzzle.Decode says what is wrong
		// with it the way the API would.
		_, err := puzzle.Decode(line)
		if err == nil {
			err = invalidItem("", "not a valid request")
		}
		return "", false, err
	}
	if has {
		switch {
		case len(customID) > apitype.MaxCustomIDBytes:
			return "", false, invalidItem("custom_id", "custom_id is %d bytes, at most %d", len(customID), apitype.MaxCustomIDBytes)
		case !utf8.ValidString(customID):
			return "", false, invalidItem("custom_id", "custom_id is not valid UTF-8")
		}
	}
	if _, err := puzzle.Decode(rest); err != nil {
		return "", false, err
	}
	return customID, has, nil
}

// withoutCustomID returns the object of line without its custom_id
// member, and that member's value. ok is false when line is not one JSON
// object with unique names; when that is custom_id's fault, has is true
// and customID says what is wrong.
func withoutCustomID(line []byte) (rest []byte, customID string, has, ok bool) {
	dec := jsontext.NewDecoder(bytes.NewReader(line)) // rejects repeated names and invalid UTF-8
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return nil, "", false, false
	}
	out := make([]byte, 0, len(line))
	out = append(out, '{')
	members := 0
	for dec.PeekKind() != '}' {
		name, err := dec.ReadToken()
		var se *jsontext.SyntacticError
		if errors.As(err, &se) && errors.Is(err, jsontext.ErrDuplicateName) && se.JSONPointer == "/custom_id" {
			return nil, `"custom_id" appears twice`, true, false
		}
		if err != nil {
			return nil, "", false, false
		}
		val, err := dec.ReadValue()
		if err != nil {
			return nil, "", false, false
		}
		if name.String() == "custom_id" {
			if val.Kind() != '"' {
				return nil, "custom_id must be a string, got " + val.Kind().String(), true, false
			}
			var tok jsontext.Token
			d := jsontext.NewDecoder(bytes.NewReader(val))
			if tok, err = d.ReadToken(); err != nil {
				return nil, "", false, false
			}
			customID, has = tok.String(), true
			continue
		}
		if members > 0 {
			out = append(out, ',')
		}
		members++
		out, err = jsontext.AppendQuote(out, name.String())
		if err != nil {
			return nil, "", false, false
		}
		out = append(out, ':')
		out = append(out, val...)
	}
	if _, err := dec.ReadToken(); err != nil {
		return nil, "", false, false
	}
	if _, err := dec.ReadValue(); err != io.EOF {
		return nil, "", false, false // something after the object
	}
	return append(out, '}'), customID, has, true
}

func invalidItem(field, format string, args ...any) error {
	e := solvers.Invalid(field, format, args...)
	e.Code = puzzle.CodeInvalidRequest
	return e
}
