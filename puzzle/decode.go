package puzzle

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	json "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/puzzleq/puzzleq/solvers"
)

// strict holds the decoding decisions every request is held to, whoever
// reads it (the API, the worker, puzzlectl): names match exactly (no case
// folding, so neither "KIND" nor "\u212Aind" with a Kelvin sign is "kind"),
// a name repeated in one object is an error, a member the type does not
// declare is an error, and the text must be valid UTF-8. A request that
// means one thing to us must not mean another to a proxy, an audit log or
// a client validator that reads the first key, or folds case differently.
//
// encoding/json (v1) folds case, keeps the last of duplicate names and
// replaces invalid UTF-8, so it is used only to encode.
var strict = json.JoinOptions(
	json.RejectUnknownMembers(true),
	json.MatchCaseInsensitiveNames(false),
	jsontext.AllowDuplicateNames(false),
	jsontext.AllowInvalidUTF8(false),
	json.WithUnmarshalers(json.JoinUnmarshalers(
		json.UnmarshalFromFunc(refuseNull[*int]),
		json.UnmarshalFromFunc(refuseNull[*int64]),
		json.UnmarshalFromFunc(refuseNull[*bool]),
		json.UnmarshalFromFunc(refuseNull[*string]),
	)),
)

// errNull is what refuseNull reports; decodeError names the field.
var errNull = errors.New("null where a value is required")

// refuseNull refuses a JSON null where a number, boolean or string is
// expected: the decoder's default reads it as the zero value, so
// [[1,null,3]] would be solved as [[1,0,3]] and share its cache key, and
// a request would mean something its sender did not write. Any other
// value goes to the default decoding (errors.ErrUnsupported).
func refuseNull[T any](dec *jsontext.Decoder, _ T) error {
	if dec.PeekKind() == 'n' {
		if _, err := dec.ReadToken(); err != nil {
			return err
		}
		return errNull
	}
	return errors.ErrUnsupported
}

// wireRequest is Request as it is decoded: the parts stay raw until the
// kind says what they hold.
type wireRequest struct {
	Kind    Kind           `json:"kind"`
	Puzzle  jsontext.Value `json:"puzzle"`
	Options jsontext.Value `json:"options"`
}

// wireBatch is the body of POST /v1/batches in the JSON format.
type wireBatch struct {
	Tasks []wireRequest `json:"tasks"`
}

// Decode parses one JSON request strictly (see strict: exact names, no
// duplicate or unknown names, valid UTF-8, nothing after the value) and
// validates it. Errors are *solvers.InputError with Field as a path from
// the request root ("puzzle.board[2]").
func Decode(data []byte) (*Parsed, error) {
	if p, _, ok := fastSliding(data, false); ok {
		return p, nil
	}
	return decode(data)
}

// decode is Decode's general path.
func decode(data []byte) (*Parsed, error) {
	var req wireRequest
	if err := unmarshal(data, &req); err != nil {
		return nil, err
	}
	return parse(req.Kind, req.Puzzle, req.Options)
}

// DecodeBatch parses the JSON body of a batch, {"tasks": [request, ...]},
// as strictly as Decode, in one pass over the envelope and every item.
// A batch of more than maxItems tasks (maxItems > 0) is rejected before
// any item is validated. Errors name the item: "tasks[17].puzzle.board".
//
// The items are Compact: a batch is decoded to be queued, and what a
// queue needs of a large puzzle is its payload, not its grids. Each
// item's raw JSON is dropped as soon as it is parsed, so the memory a
// decode takes beyond the body is about one item's worth at a time.
func DecodeBatch(data []byte, maxItems int) ([]*Parsed, error) {
	var br wireBatch
	if err := unmarshal(data, &br); err != nil {
		return nil, err
	}
	if br.Tasks == nil {
		return nil, inputErr(CodeInvalidRequest, "tasks", "tasks is required")
	}
	if maxItems > 0 && len(br.Tasks) > maxItems {
		return nil, solvers.TooLarge("tasks", "a batch holds at most %d tasks, got %d", maxItems, len(br.Tasks))
	}
	reqs := make([]*Parsed, len(br.Tasks))
	for i := range br.Tasks {
		r := br.Tasks[i]
		br.Tasks[i] = wireRequest{}
		p, err := parse(r.Kind, r.Puzzle, r.Options)
		if err != nil {
			return nil, prefixField(err, "tasks["+strconv.Itoa(i)+"]")
		}
		reqs[i] = p.Compact()
	}
	return reqs, nil
}

// DecodeStrict decodes exactly one JSON value into v with the rules of
// Decode, for JSON inputs that are not requests (the p84021 judge format).
// Errors are *solvers.InputError naming the place.
func DecodeStrict(data []byte, v any) error { return unmarshal(data, v) }

// unmarshal decodes data into v with the strict options and turns any
// error into an InputError that names the place.
func unmarshal(data []byte, v any) error {
	if len(bytes.TrimLeft(data, " \t\r\n")) == 0 {
		return inputErr(CodeInvalidRequest, "", "empty body: expected a JSON object")
	}
	if err := json.Unmarshal(data, v, strict); err != nil {
		return decodeError(err)
	}
	return nil
}

// decodePart decodes one member of the request strictly; its errors name
// the field under the member ("puzzle.board[1][2]").
func decodePart(data []byte, v any, field string) error {
	if err := unmarshal(data, v); err != nil {
		return prefixField(err, field)
	}
	return nil
}

// maxFieldLen bounds the path echoed back in an error, so a deeply
// nested body cannot make the answer as large as the request.
const maxFieldLen = 200

// decodeError maps an error of the JSON decoder to an InputError whose
// Field is the path of the offending value, in our dotted notation.
func decodeError(err error) error {
	var (
		syn *jsontext.SyntacticError
		sem *json.SemanticError
	)
	switch {
	case errors.As(err, &syn):
		switch {
		case errors.Is(syn.Err, jsontext.ErrDuplicateName):
			name := syn.JSONPointer.LastToken()
			return inputErr(CodeInvalidRequest, memberPath(syn.JSONPointer),
				fmt.Sprintf("key %q appears twice in one object", truncate(name, 40)))
		case errors.Is(syn.Err, io.ErrUnexpectedEOF):
			return inputErr(CodeInvalidRequest, "", "truncated JSON")
		case strings.Contains(syn.Err.Error(), "exceeded max depth"):
			// The path would be as deep as the nesting: say nothing of it.
			return inputErr(CodeInvalidRequest, "", fmt.Sprintf("JSON nested too deeply at byte %d", syn.ByteOffset))
		case strings.Contains(syn.Err.Error(), "after top-level value"):
			return inputErr(CodeInvalidRequest, "", fmt.Sprintf("unexpected data after the JSON value at byte %d", syn.ByteOffset))
		}
		return inputErr(CodeInvalidRequest, fieldPath(syn.JSONPointer), fmt.Sprintf("malformed JSON at byte %d: %s",
			syn.ByteOffset, truncate(strings.TrimPrefix(syn.Err.Error(), "jsontext: "), 200)))
	case errors.As(err, &sem):
		if errors.Is(sem.Err, json.ErrUnknownName) {
			name := sem.JSONPointer.LastToken()
			return inputErr(CodeInvalidRequest, memberPath(sem.JSONPointer), fmt.Sprintf("unknown field %q", truncate(name, 40)))
		}
		field := fieldPath(sem.JSONPointer)
		if errors.Is(sem.Err, errNull) && sem.GoType != nil && sem.GoType.Kind() == reflect.Pointer {
			return inputErr(CodeInvalidRequest, field,
				fmt.Sprintf("%s: expected %s, got null", orRoot(field), jsonKind(sem.GoType.Elem())))
		}
		if sem.GoType == nil {
			return inputErr(CodeInvalidRequest, field, "invalid JSON: "+truncate(strings.TrimPrefix(sem.Error(), "json: "), 200))
		}
		return inputErr(CodeInvalidRequest, field,
			fmt.Sprintf("%s: expected %s, got %s", orRoot(field), jsonKind(sem.GoType), jsonValue(sem.JSONKind, sem.JSONValue)))
	}
	return inputErr(CodeInvalidRequest, "", "invalid JSON: "+truncate(strings.TrimPrefix(err.Error(), "json: "), 200))
}

// fieldPath turns a JSON Pointer ("/tasks/17/puzzle/board/2") into the
// path notation of our errors ("tasks[17].puzzle.board[2]"). Every name
// our requests declare is a word, so a token of digits is an array index.
func fieldPath(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		if b.Len() > maxFieldLen {
			b.WriteString("...")
			break
		}
		if isIndex(tok) {
			b.WriteByte('[')
			b.WriteString(tok)
			b.WriteByte(']')
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(truncate(tok, 40))
	}
	return b.String()
}

// memberPath is fieldPath for a pointer whose last token is an object
// member's name (an unknown or repeated name), which may be all digits.
func memberPath(p jsontext.Pointer) string {
	parent, name := fieldPath(p.Parent()), truncate(p.LastToken(), 40)
	if parent == "" {
		return name
	}
	return parent + "." + name
}

func isIndex(tok string) bool {
	if tok == "" {
		return false
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return false
		}
	}
	return true
}

func inputErr(code, field, msg string) *solvers.InputError {
	return &solvers.InputError{Code: code, Field: field, Msg: msg}
}

// jsonKind names a Go type in JSON's terms: clients never see Go names.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer within range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "another type"
}

// jsonValue describes what the decoder found ("number 1e400", "a JSON
// string").
func jsonValue(k jsontext.Kind, v jsontext.Value) string {
	switch k {
	case '0':
		if len(v) > 0 {
			return "number " + truncate(string(v), 40)
		}
		return "a number"
	case '"':
		return "a JSON string"
	case 't', 'f':
		return "a JSON boolean"
	case 'n':
		return "null"
	case '{', '}':
		return "a JSON object"
	case '[', ']':
		return "a JSON array"
	}
	return "another value"
}

func orRoot(f string) string {
	if f == "" {
		return "value"
	}
	return f
}

// prefixField returns err with its Field moved under prefix.
func prefixField(err error, prefix string) error {
	var ie *solvers.InputError
	if !errors.As(err, &ie) {
		return err
	}
	c := *ie
	switch {
	case c.Field == "":
		c.Field = prefix
	case strings.HasPrefix(c.Field, "["):
		c.Field = prefix + c.Field
	default:
		c.Field = prefix + "." + c.Field
	}
	// A message that starts with the place says the whole path, so that
	// "board[2]: expected ..." inside item 17 reads
	// "tasks[17].puzzle.board[2]: expected ...".
	if rest, ok := strings.CutPrefix(c.Msg, orRoot(ie.Field)+": "); ok {
		c.Msg = c.Field + ": " + rest
	}
	return &c
}

// PrefixField is prefixField for callers that nest requests, such as a
// batch naming "tasks[17]" or a judge body naming "body".
func PrefixField(err error, prefix string) error { return prefixField(err, prefix) }

// truncate shortens s to at most n bytes and "...", cutting at a rune
// boundary so that the message stays valid UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
