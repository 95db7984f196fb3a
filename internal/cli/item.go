package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/puzzle"
	"github.com/puzzleq/puzzleq/solvers"
)

// decodeItem validates one line of an NDJSON batch as the API does: the
// request, held to puzzle.Decode's rules, and an optional top-level
// "custom_id", a non-empty string of at most apitype.MaxCustomIDBytes
// bytes. has reports whether the line had a custom_id.
//
// It stands in for puzzle.DecodeItem, which another branch adds: the
// member is taken out of the object and the rest goes to puzzle.Decode,
// so every other decision (unknown or repeated names, case, UTF-8) stays
// puzzle's. Replace it with puzzle.DecodeItem once that lands.
func decodeItem(line []byte) (customID string, has bool, err error) {
	if customID, has, ok := fastSliding(line); ok {
		return customID, has, nil
	}
	return decodeItemFull(line)
}

// decodeItemFull is decodeItem without its fast path.
func decodeItemFull(line []byte) (customID string, has bool, err error) {
	// A custom_id is spelled "custom_id", or with an escape somewhere in
	// it: most lines have neither, and pay for no second pass.
	if !bytes.Contains(line, []byte(`custom_id`)) && bytes.IndexByte(line, '\\') < 0 {
		_, err := puzzle.Decode(line)
		return "", false, err
	}
	rest, customID, has, err := withoutCustomID(line)
	var ie *solvers.InputError
	switch {
	case errors.As(err, &ie):
		return "", false, err // the custom_id's own fault
	case err != nil:
		// Not one object of unique names. puzzle.Decode says what is
		// wrong the way the API would, unless it stops at the custom_id
		// it does not know.
		_, perr := puzzle.Decode(line)
		if perr == nil || errors.As(perr, &ie) && ie.Field == "custom_id" {
			return "", false, err2input(err)
		}
		return "", false, perr
	}
	if has {
		switch {
		case customID == "":
			// The API refuses it (puzzle.DecodeItem): a line it would
			// refuse fails here, before any batch is sent.
			return "", false, invalidItem("custom_id", "custom_id must not be empty; leave it out instead")
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

// errTrailing is a line with more than one JSON value.
var errTrailing = errors.New("unexpected data after the request's object")

// withoutCustomID returns the object of line without its custom_id
// member, and that member's value. The error is an *InputError when the
// custom_id is at fault, else the tokenizer's: line is not one JSON object
// of unique names.
func withoutCustomID(line []byte) (rest []byte, customID string, has bool, err error) {
	dec := jsontext.NewDecoder(bytes.NewReader(line)) // rejects repeated names and invalid UTF-8
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, "", false, err
	}
	if tok.Kind() != '{' {
		return nil, "", false, fmt.Errorf("expected a JSON object, got %s", tok.Kind())
	}
	out := make([]byte, 0, len(line))
	out = append(out, '{')
	members := 0
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		var se *jsontext.SyntacticError
		if errors.As(err, &se) && errors.Is(err, jsontext.ErrDuplicateName) && se.JSONPointer == "/custom_id" {
			return nil, "", false, invalidItem("custom_id", `"custom_id" appears twice`)
		}
		if err != nil {
			return nil, "", false, err
		}
		name := tok.String() // before the next read voids tok
		val, err := dec.ReadValue()
		if err != nil {
			return nil, "", false, err
		}
		if name == "custom_id" {
			if val.Kind() != '"' {
				return nil, "", false, invalidItem("custom_id", "custom_id must be a string, got %s", val.Kind())
			}
			tok, err := jsontext.NewDecoder(bytes.NewReader(val)).ReadToken()
			if err != nil {
				return nil, "", false, err
			}
			customID, has = tok.String(), true
			continue
		}
		if members > 0 {
			out = append(out, ',')
		}
		members++
		if out, err = jsontext.AppendQuote(out, name); err != nil {
			return nil, "", false, err
		}
		out = append(out, ':')
		out = append(out, val...)
	}
	if _, err := dec.ReadToken(); err != nil {
		return nil, "", false, err
	}
	if _, err := dec.ReadValue(); err != io.EOF {
		return nil, "", false, errTrailing
	}
	return append(out, '}'), customID, has, nil
}

// err2input words a tokenizer's error as an InputError at its place.
func err2input(err error) error {
	var se *jsontext.SyntacticError
	if !errors.As(err, &se) {
		return invalidItem("", "%v", err)
	}
	field := strings.ReplaceAll(strings.TrimPrefix(string(se.JSONPointer), "/"), "/", ".")
	if errors.Is(err, jsontext.ErrDuplicateName) {
		return invalidItem(field, "%q appears twice", se.JSONPointer.LastToken())
	}
	return invalidItem(field, "invalid JSON at byte %d: %v", se.ByteOffset, se.Err)
}

func invalidItem(field, format string, args ...any) error {
	e := solvers.Invalid(field, format, args...)
	e.Code = puzzle.CodeInvalidRequest
	return e
}
