package puzzle

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/solvers"
)

// wireItem is one item of a batch as it is decoded: a request and the
// caller's optional name for it.
type wireItem struct {
	CustomID jsontext.Value `json:"custom_id"`
	Kind     Kind           `json:"kind"`
	Puzzle   jsontext.Value `json:"puzzle"`
	Options  jsontext.Value `json:"options"`
}

// DecodeItem parses one item of a batch, {"custom_id"?, "kind", "puzzle",
// "options"?}: a request with the caller's name for it, held to Decode's
// rules (exact names, no duplicate or unknown names, valid UTF-8, nothing
// after the value). customID is "" when the item has none. It decodes
// each line of an NDJSON batch and each element of {"tasks": [...]}.
//
// A custom_id is a non-empty string of at most apitype.MaxCustomIDBytes
// bytes of UTF-8; null is refused rather than read as "none", so that an
// item means the same to every reader. Errors are *solvers.InputError
// naming the field from the item's root ("custom_id", "puzzle.board[2]").
func DecodeItem(data []byte) (p *Parsed, customID string, err error) {
	if p, customID, ok := fastSliding(data, true); ok {
		return p, customID, nil
	}
	return decodeItem(data)
}

// CheckItem says whether DecodeItem takes data, with the same error, and
// returns the item's custom_id, without keeping the request: puzzlectl
// checks a whole input this way before it sends any of it. A sliding
// item in the fast path's spelling costs no allocation but its
// custom_id's.
func CheckItem(data []byte) (customID string, err error) {
	var sc slidingScan
	if scanSliding(data, true, &sc) && sc.valid() {
		return sc.customID, nil
	}
	_, customID, err = decodeItem(data)
	return customID, err
}

// decodeItem is DecodeItem's general path.
func decodeItem(data []byte) (p *Parsed, customID string, err error) {
	var it wireItem
	if err := unmarshal(data, &it); err != nil {
		return nil, "", err
	}
	if customID, err = parseCustomID(it.CustomID); err != nil {
		return nil, "", err
	}
	if p, err = parse(it.Kind, it.Puzzle, it.Options); err != nil {
		return nil, "", err
	}
	return p, customID, nil
}

// parseCustomID validates a raw custom_id member; absent is "".
func parseCustomID(raw jsontext.Value) (string, error) {
	if len(raw) == 0 {
		return "", nil
	}
	if raw.Kind() != '"' {
		return "", inputErr(CodeInvalidRequest, "custom_id",
			"custom_id: expected a string, got "+jsonValue(raw.Kind(), raw))
	}
	var s string
	if err := decodePart(raw, &s, "custom_id"); err != nil {
		return "", err
	}
	switch {
	case s == "":
		return "", inputErr(CodeInvalidRequest, "custom_id", "custom_id must not be empty; leave it out instead")
	case len(s) > apitype.MaxCustomIDBytes:
		return "", inputErr(CodeInvalidRequest, "custom_id",
			fmt.Sprintf("custom_id is at most %d bytes, got %d", apitype.MaxCustomIDBytes, len(s)))
	case !utf8.ValidString(s):
		// The strict decoder refuses invalid UTF-8 already; this keeps
		// the guarantee if that option ever changes.
		return "", inputErr(CodeInvalidRequest, "custom_id", "custom_id must be valid UTF-8")
	}
	return s, nil
}

// BatchDecoder reads the items of a {"tasks": [item, ...]} body one at a
// time from a stream, so that a large batch is never held whole: its
// memory is the decoder's buffer, about one item. Items are held to
// DecodeItem's rules and the envelope to Decode's (only the member
// "tasks", once; nothing after the object). Errors name the place from the
// body's root: "tasks[17].puzzle.board[2]".
type BatchDecoder struct {
	dec      *jsontext.Decoder
	maxItems int
	state    int // 0: before the envelope, 1: inside the array, 2: done
	n        int // items returned
	webhook  *string
}

// Webhook returns the envelope's "webhook" member, a string, once the
// body has been read to its end (Next returned io.EOF); ok is false when
// the body has none. Its value is the API's to check.
func (d *BatchDecoder) Webhook() (url string, ok bool) {
	if d.webhook == nil {
		return "", false
	}
	return *d.webhook, true
}

// readWebhook reads the value of a "webhook" member: a string, once.
func (d *BatchDecoder) readWebhook() error {
	if d.webhook != nil {
		return inputErr(CodeInvalidRequest, "webhook", `duplicate field "webhook"`)
	}
	if k := d.dec.PeekKind(); k != '"' {
		if k == 0 {
			_, err := d.dec.ReadToken()
			return d.syntaxError(err)
		}
		return inputErr(CodeInvalidRequest, "webhook", "webhook: expected a string, got "+jsonValue(k, nil))
	}
	v, err := d.dec.ReadValue()
	if err != nil {
		return d.syntaxError(err)
	}
	var s string
	if err := decodePart(v, &s, "webhook"); err != nil {
		return err
	}
	d.webhook = &s
	return nil
}

// NewBatchDecoder reads a batch body from r; more than maxItems items
// (maxItems > 0) is a too_large error at the first item past it.
func NewBatchDecoder(r io.Reader, maxItems int) *BatchDecoder {
	// The stream checks syntax only: names and UTF-8 inside an item are
	// DecodeItem's to check, so that its errors name the place as
	// Decode's do (the stream's pointer inside a raw value is not kept).
	// The envelope's one name is checked by open and close.
	return &BatchDecoder{dec: jsontext.NewDecoder(sourceReader{r}, jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)), maxItems: maxItems}
}

// sourceReader marks the errors of the body's reader: the JSON decoder
// wraps one that comes in the middle of a value in a syntax error, and it
// must reach the caller as what it is (a body too large, a deadline).
type sourceReader struct{ r io.Reader }

func (s sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = &sourceError{err}
	}
	return n, err
}

type sourceError struct{ err error }

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// Index is the index the next item returned by Next will have.
func (d *BatchDecoder) Index() int { return d.n }

// Next returns the next item and its custom_id. After the last item it
// checks the rest of the body and returns io.EOF. A batch of no items is
// an error: "tasks" must hold at least one.
func (d *BatchDecoder) Next() (*Parsed, string, error) {
	i := d.n
	raw, err := d.NextRaw()
	if err != nil {
		return nil, "", err
	}
	p, id, err := DecodeItem(raw)
	if err != nil {
		d.state = 2
		return nil, "", prefixField(err, "tasks["+strconv.Itoa(i)+"]")
	}
	return p, id, nil
}

// NextRaw is Next without the item's decoding: it returns the item's
// JSON, valid until the next call, for a caller that weighs an item before
// it decodes it (DecodeItem, with errors under "tasks[<Index>]").
func (d *BatchDecoder) NextRaw() ([]byte, error) {
	if d.state == 2 {
		return nil, io.EOF
	}
	if d.state == 0 {
		if err := d.open(); err != nil {
			d.state = 2
			return nil, err
		}
		d.state = 1
	}
	if d.dec.PeekKind() == ']' {
		d.state = 2
		if err := d.close(); err != nil {
			return nil, err
		}
		if d.n == 0 {
			return nil, inputErr(CodeInvalidRequest, "tasks", "a batch needs at least one task")
		}
		return nil, io.EOF
	}
	if d.maxItems > 0 && d.n >= d.maxItems {
		d.state = 2
		return nil, solvers.TooLarge("tasks", "a batch holds at most %d tasks", d.maxItems)
	}
	v, err := d.dec.ReadValue()
	if err != nil {
		d.state = 2
		return nil, d.syntaxError(err)
	}
	d.n++
	return v, nil
}

// open reads the envelope up to the first item: '{', "tasks", '[', with
// a "webhook" member before "tasks" if there is one.
func (d *BatchDecoder) open() error {
	tok, err := d.dec.ReadToken()
	if err == io.EOF {
		return inputErr(CodeInvalidRequest, "", "empty body: expected a JSON object")
	}
	if err != nil {
		return d.syntaxError(err)
	}
	if tok.Kind() != '{' {
		return inputErr(CodeInvalidRequest, "", "value: expected an object, got "+jsonValue(tok.Kind(), nil))
	}
	for {
		if d.dec.PeekKind() == '}' {
			return inputErr(CodeInvalidRequest, "tasks", "tasks is required")
		}
		name, err := d.dec.ReadToken()
		if err != nil {
			return d.syntaxError(err)
		}
		if name.String() == "webhook" {
			if err := d.readWebhook(); err != nil {
				return err
			}
			continue
		}
		if name.String() != "tasks" {
			return inputErr(CodeInvalidRequest, truncate(name.String(), 40), fmt.Sprintf("unknown field %q", truncate(name.String(), 40)))
		}
		switch k := d.dec.PeekKind(); k {
		case '[':
			if _, err := d.dec.ReadToken(); err != nil {
				return d.syntaxError(err)
			}
			return nil
		case 'n':
			return inputErr(CodeInvalidRequest, "tasks", "tasks is required")
		case 0:
			_, err := d.dec.ReadToken()
			return d.syntaxError(err)
		default:
			return inputErr(CodeInvalidRequest, "tasks", "tasks: expected an array, got "+jsonValue(k, nil))
		}
	}
}

// close reads the end of the array and of the envelope, and checks that
// nothing follows.
func (d *BatchDecoder) close() error {
	if _, err := d.dec.ReadToken(); err != nil { // ']'
		return d.syntaxError(err)
	}
	for d.dec.PeekKind() == '"' {
		// A member after "tasks": "webhook", or "tasks" again (a
		// duplicate) or an unknown one; for those the items decoded so
		// far stand for nothing, and the whole batch is refused.
		name, err := d.dec.ReadToken()
		if err != nil {
			return d.syntaxError(err)
		}
		if name.String() == "webhook" {
			if err := d.readWebhook(); err != nil {
				return err
			}
			continue
		}
		return inputErr(CodeInvalidRequest, truncate(name.String(), 40), fmt.Sprintf("unknown field %q", truncate(name.String(), 40)))
	}
	if _, err := d.dec.ReadToken(); err != nil { // '}'
		return d.syntaxError(err)
	}
	if _, err := d.dec.ReadToken(); err != io.EOF {
		if err == nil {
			return inputErr(CodeInvalidRequest, "", fmt.Sprintf("unexpected data after the JSON value at byte %d", d.dec.InputOffset()))
		}
		return d.syntaxError(err)
	}
	return nil
}

// syntaxError maps an error of the stream to an InputError, as Decode's
// are. A read error of the underlying
// reader (a body cut off, a limit) is returned as it is, for the caller
// to answer.
func (d *BatchDecoder) syntaxError(err error) error {
	var src *sourceError
	if errors.As(err, &src) {
		return src.err
	}
	var syn *jsontext.SyntacticError
	if !errors.As(err, &syn) {
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			return inputErr(CodeInvalidRequest, "", "truncated JSON")
		}
		return err
	}
	return decodeError(err)
}
