package api_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/puzzleq/puzzleq/apitype"
	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/solvers"
)

// The tests in this file hold the Go wire contract (package apitype) to
// openapi.yaml, field by field, so neither can change without the other.
// The tests in openapi_test.go hold the server's real answers to the same
// document, which closes the loop: document, types and server agree.

// wireTypes maps every schema that a JSON answer of the API uses to the
// apitype type that carries it.
var wireTypes = map[string]reflect.Type{
	"Task":          reflect.TypeFor[apitype.Task](),
	"TaskError":     reflect.TypeFor[apitype.TaskError](),
	"TaskPuzzle":    reflect.TypeFor[apitype.TaskPuzzle](),
	"Batch":         reflect.TypeFor[apitype.Batch](),
	"BatchCreated":  reflect.TypeFor[apitype.BatchCreated](),
	"BatchCanceled": reflect.TypeFor[apitype.BatchCanceled](),
	"ResultLine":    reflect.TypeFor[apitype.ResultLine](),
	"Status":        reflect.TypeFor[apitype.Status](),
	"ErrorBody":     reflect.TypeFor[apitype.ErrorBody](),
	"Error":         reflect.TypeFor[apitype.Error](),
	"Webhook":       reflect.TypeFor[apitype.Webhook](),
	"WebhookEvent":  reflect.TypeFor[apitype.WebhookEvent](),
	"BatchProgress": reflect.TypeFor[apitype.BatchProgress](),
	"ItemEvent":     reflect.TypeFor[apitype.ItemEvent](),
	"BatchSummary":  reflect.TypeFor[apitype.BatchSummary](),
	"BatchList":     reflect.TypeFor[apitype.BatchList](),
	"TaskList":      reflect.TypeFor[apitype.TaskList](),
	"BatchRetried":  reflect.TypeFor[apitype.BatchRetried](),
	"ServiceStatus": reflect.TypeFor[apitype.ServiceStatus](),
	"WorkerStatus":  reflect.TypeFor[apitype.WorkerStatus](),
	"QueueStatus":   reflect.TypeFor[apitype.QueueStatus](),
	"History":       reflect.TypeFor[apitype.History](),
	"HistoryPoint":  reflect.TypeFor[apitype.HistoryPoint](),
	// The dashboard's sign-in is not part of the public contract, so its
	// type stays with the server.
	"Session": reflect.TypeFor[api.SessionInfo](),
}

// TestWireTypesMatchDocument checks every schema of wireTypes against its
// Go type: each property has a field of that JSON name and a matching type
// (recursively, nested objects and arrays included), each field a property,
// and a required property is never omitempty.
func TestWireTypesMatchDocument(t *testing.T) {
	doc := loadDoc(t)
	for name, typ := range wireTypes {
		ref := doc.Components.Schemas[name]
		if ref == nil || ref.Value == nil {
			t.Errorf("schema %s is not in the document; drop it from wireTypes", name)
			continue
		}
		checkSchema(t, name, typ, ref.Value)
	}
}

// Every JSON answer of every operation is one of wireTypes, so a new
// resource cannot be documented without a Go type (or served from an
// ad-hoc map).
func TestEveryJSONAnswerHasAWireType(t *testing.T) {
	doc := loadDoc(t)
	var n int
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for status, resp := range op.Responses.Map() {
				mt := resp.Value.Content.Get("application/json")
				if mt == nil {
					continue
				}
				n++
				name, ok := strings.CutPrefix(mt.Schema.Ref, "#/components/schemas/")
				if !ok || wireTypes[name] == nil {
					t.Errorf("%s %s %s: the JSON answer's schema %q has no apitype type", method, path, status, mt.Schema.Ref)
				}
			}
		}
	}
	if n < 30 {
		t.Errorf("only %d JSON answers in the document; is it loaded?", n)
	}
}

// The enums of the document are apitype's lists, in any order.
func TestWireEnumsMatchDocument(t *testing.T) {
	doc := loadDoc(t)
	enum := func(schema, prop string) []string {
		t.Helper()
		s := doc.Components.Schemas[schema].Value
		if prop != "" {
			s = s.Properties[prop].Value
		}
		var out []string
		for _, v := range s.Enum {
			out = append(out, v.(string))
		}
		slices.Sort(out)
		return out
	}
	sorted := func(v []string) []string { v = slices.Clone(v); slices.Sort(v); return v }
	var states []string
	for _, s := range apitype.TaskStates() {
		states = append(states, string(s))
	}
	for _, c := range []struct {
		what      string
		doc, code []string
	}{
		{"TaskState", enum("TaskState", ""), sorted(states)},
		{"Error.code", enum("Error", "code"), sorted(apitype.ErrorCodes())},
		{"TaskError.code", enum("TaskError", "code"), sorted(apitype.TaskErrorCodes())},
	} {
		if len(c.doc) == 0 || !slices.Equal(c.doc, c.code) {
			t.Errorf("%s: the document says %q, apitype says %q", c.what, c.doc, c.code)
		}
	}
	// Counts has one member per state.
	counts := doc.Components.Schemas["Batch"].Value.Properties["counts"].Value
	var members []string
	for k := range counts.Properties {
		members = append(members, k)
	}
	if slices.Sort(members); !slices.Equal(members, sorted(states)) {
		t.Errorf("Batch.counts has members %q, want one per state %q", members, sorted(states))
	}
}

// The solvers are pure and do not import apitype, but the API sends their
// InputError codes as they are: they must be codes of the contract.
func TestSolverCodesAreWireCodes(t *testing.T) {
	for got, want := range map[string]string{
		solvers.CodeInvalidPuzzle: apitype.CodeInvalidPuzzle,
		solvers.CodeTooLarge:      apitype.CodeTooLarge,
	} {
		if got != want {
			t.Errorf("solvers code %q, apitype code %q", got, want)
		}
	}
}

var (
	rawMessageType = reflect.TypeFor[json.RawMessage]()
	timeType       = reflect.TypeFor[time.Time]()
)

// checkSchema compares one schema with one Go type; at names the place
// ("Batch.tasks[].error.code") in failures.
func checkSchema(t *testing.T, at string, typ reflect.Type, s *openapi3.Schema) {
	t.Helper()
	if typ == rawMessageType {
		return // any JSON: the solvers' results, held by their own tests
	}
	nullable := s.Nullable
	if base := orNull(s); base != nil {
		s, nullable = base, true
	}
	if typ.Kind() == reflect.Pointer {
		if !nullable {
			t.Errorf("%s is not nullable, but its Go type %s can be nil", at, typ)
		}
		typ = typ.Elem()
	} else if nullable && typ.Kind() != reflect.Slice && typ.Kind() != reflect.Map {
		t.Errorf("%s is nullable, but its Go type %s cannot be null", at, typ)
	}
	switch {
	case s.Type.Is("object") && len(s.Properties) == 0 && s.AdditionalProperties.Schema != nil:
		// A map: string keys, one schema for every value.
		if typ.Kind() != reflect.Map || typ.Key().Kind() != reflect.String {
			t.Errorf("%s is a map of strings, its Go type is %s", at, typ)
			return
		}
		checkSchema(t, at+"{}", typ.Elem(), s.AdditionalProperties.Schema.Value)
	case s.Type.Is("object"):
		checkObject(t, at, typ, s)
	case s.Type.Is("array"):
		if typ.Kind() != reflect.Slice {
			t.Errorf("%s is an array, its Go type is %s", at, typ)
			return
		}
		checkSchema(t, at+"[]", typ.Elem(), s.Items.Value)
	case s.Type.Is("string") && s.Format == "date-time":
		if typ != timeType {
			t.Errorf("%s is a date-time, its Go type is %s", at, typ)
		}
	case s.Type.Is("string"):
		if typ.Kind() != reflect.String {
			t.Errorf("%s is a string, its Go type is %s", at, typ)
		}
	case s.Type.Is("integer"):
		switch typ.Kind() {
		case reflect.Int, reflect.Int32, reflect.Int64:
		default:
			t.Errorf("%s is an integer, its Go type is %s", at, typ)
		}
	case s.Type.Is("number"):
		if typ.Kind() != reflect.Float64 && typ.Kind() != reflect.Float32 {
			t.Errorf("%s is a number, its Go type is %s", at, typ)
		}
	case s.Type.Is("boolean"):
		if typ.Kind() != reflect.Bool {
			t.Errorf("%s is a boolean, its Go type is %s", at, typ)
		}
	default:
		t.Errorf("%s: schema type %v is not checked; its Go type is %s (use json.RawMessage for any JSON)", at, s.Type, typ)
	}
}

// orNull returns X of a schema `oneOf: [X, NullValue]`, OpenAPI 3.0's
// "X or null"; nil for any other schema.
func orNull(s *openapi3.Schema) *openapi3.Schema {
	if len(s.OneOf) != 2 {
		return nil
	}
	const null = "#/components/schemas/NullValue"
	switch {
	case s.OneOf[1].Ref == null:
		return s.OneOf[0].Value
	case s.OneOf[0].Ref == null:
		return s.OneOf[1].Value
	}
	return nil
}

func checkObject(t *testing.T, at string, typ reflect.Type, s *openapi3.Schema) {
	t.Helper()
	if typ.Kind() != reflect.Struct {
		t.Errorf("%s is an object, its Go type is %s", at, typ)
		return
	}
	if len(s.Properties) == 0 {
		t.Errorf("%s is an object without properties; say what it holds", at)
	}
	fields := map[string]reflect.StructField{}
	omitempty := map[string]bool{}
	for f := range typ.Fields() {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if tag == "" || name == "" {
			t.Errorf("%s: field %s.%s has no JSON name", at, typ, f.Name)
			continue
		}
		if name == "-" {
			continue
		}
		fields[name] = f
		omitempty[name] = slices.Contains(strings.Split(opts, ","), "omitempty")
	}
	for name, prop := range s.Properties {
		f, ok := fields[name]
		if !ok {
			t.Errorf("%s.%s is documented, but %s has no field with that JSON name", at, name, typ)
			continue
		}
		if omitempty[name] && slices.Contains(s.Required, name) {
			t.Errorf("%s.%s is required, but field %s.%s is omitempty", at, name, typ, f.Name)
		}
		ft := f.Type
		if omitempty[name] && ft.Kind() == reflect.Pointer && !prop.Value.Nullable && orNull(prop.Value) == nil {
			// Absent, never null: omitempty drops the nil pointer.
			ft = ft.Elem()
		}
		checkSchema(t, at+"."+name, ft, prop.Value)
	}
	for name, f := range fields {
		if s.Properties[name] == nil {
			t.Errorf("field %s.%s (JSON %q) is not documented in %s", typ, f.Name, name, at)
		}
	}
}
