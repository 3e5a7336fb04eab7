package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Size and shape limits applied before any JSON is decoded.
const (
	// MaxEnvelopeBytes is the largest envelope accepted anywhere; streams are
	// configured with the same max message size.
	MaxEnvelopeBytes = 1 << 20
	// MaxDataBytes caps an event's data, a payload or a checkpoint.
	MaxDataBytes = 512 << 10
	// MaxDepth is the deepest nesting of objects and arrays accepted.
	MaxDepth = 32
)

// checkShape rejects input that is too large, not UTF-8, nested deeper than
// MaxDepth or followed by trailing data, without building any value: a
// 10,000-deep array costs a scan, not a stack.
//
// Every message on the hot paths passes here several times (envelope, data,
// payload), so well-formed input takes an allocation-free path: a depth
// scan and json.Valid. Only input that fails is walked token by token, to
// say what is wrong with it.
func checkShape(field string, b []byte, limit int) error {
	if len(b) > limit {
		return tooLarge(field, len(b), limit)
	}
	if len(b) == 0 {
		return fieldErr(field, "is empty")
	}
	if !utf8.Valid(b) {
		return fieldErr(field, "is not valid UTF-8")
	}
	if maxDepth(b) <= MaxDepth && jsonValid(b) {
		return nil
	}
	if err := explainShape(field, b); err != nil {
		return err
	}
	// The fast checks and the walk disagree only if one of them is wrong;
	// refusing is the safe side.
	return fieldErr(field, "is not valid JSON")
}

// maxDepth returns the deepest nesting of objects and arrays in b, skipping
// brackets inside strings. On malformed input the figure may be wrong; the
// caller then explains the input with explainShape anyway.
func maxDepth(b []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++ // the escaped byte cannot end the string
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			deepest = max(deepest, depth)
		case '}', ']':
			depth--
		}
	}
	return deepest
}

// jsonValid is json.Valid by the v2 tokenizer, four times faster here:
// duplicate names and invalid UTF-8 are allowed as json.Valid allows them
// (checkShape refuses invalid UTF-8 before). It is named so the fuzz test
// compares the very check checkShape makes.
func jsonValid(b []byte) bool {
	return jsontext.Value(b).IsValid(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
}

// explainShape walks input token by token and returns the error that names
// its problem, or nil when it finds none.
func explainShape(field string, b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	depth, tokens := 0, 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			// Token reports a value cut off inside an object or array as a
			// plain EOF, and blank input as no token at all.
			switch {
			case tokens == 0:
				return fieldErr(field, "is empty")
			case depth > 0:
				return fieldErr(field, "is not valid JSON: unexpected end of input (truncated JSON)")
			}
			break
		}
		if err != nil {
			return fieldErr(field, "is not valid JSON: "+jsonReason(err))
		}
		tokens++
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				depth++
				if depth > MaxDepth {
					return fieldErr(field, fmt.Sprintf("is nested deeper than %d levels", MaxDepth))
				}
			default:
				depth--
			}
		}
		if depth == 0 && dec.More() {
			return fieldErr(field, "has data after the JSON value")
		}
	}
	return nil
}

// decodeStrict decodes b into v rejecting unknown fields, after checkShape.
func decodeStrict(field string, b []byte, limit int, v any) error {
	if err := checkShape(field, b, limit); err != nil {
		return err
	}
	return decodeShaped(field, b, v)
}

// decodeShaped decodes b into v rejecting unknown fields. b must have
// passed checkShape already, or be a value inside JSON that did (the data
// of a decoded envelope): it is then valid JSON no deeper and no larger.
//
// Input is decoded first by the faster encoding/json/v2 decoder (its
// module form; it runs about four times faster and allocates a fifth of
// the bytes here). What v2 refuses and v1 accepts (keys in another case,
// duplicate keys) goes on to encoding/json, so what is accepted, what it
// decodes to and every error message stay those of encoding/json;
// FuzzFastDecodeMatchesStd holds the two to that.
func decodeShaped(field string, b []byte, v any) error {
	if fastUnmarshal(b, v) == nil {
		return checkNUL(field, b, v)
	}
	// v2 may have filled part of v before it stopped.
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv.Elem().SetZero()
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		reason := jsonReason(err)
		if !namesField(err) {
			if path := failingField(b, reflect.TypeOf(v)); path != "" {
				reason = fmt.Sprintf("field %q: %s", path, reason)
			}
		}
		return fieldErr(field, "is not valid: "+reason)
	}
	return checkNUL(field, b, v)
}

// fastUnmarshal is the strict v2 decode decodeShaped tries first.
func fastUnmarshal(b []byte, v any) error {
	return jsonv2.Unmarshal(b, v, jsonv2.RejectUnknownMembers(true))
}

// checkNUL refuses a decoded string that holds a NUL.
func checkNUL(field string, b []byte, v any) error {
	// JSON can only put a NUL into a decoded string as the escape \u0000
	// (a raw control character is invalid JSON), so input without that
	// escape needs no walk over the decoded value.
	if !bytes.Contains(b, nulEscape) {
		return nil
	}
	return CheckStorable(field, v)
}

var nulEscape = []byte(`\u0000`)

// namesField reports whether encoding/json already named the field in err.
// Errors returned by UnmarshalJSON methods (time.Time, RetryAfter) come
// without one.
func namesField(err error) bool {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	return errors.As(err, &typeErr) || errors.As(err, &syntaxErr) ||
		errors.Is(err, io.ErrUnexpectedEOF) || strings.HasPrefix(err.Error(), "json: unknown field ")
}

// failingField finds the dotted path of the first field (in key order) of
// the JSON object b whose value does not decode into its field of struct
// type t. It runs only after a decode failed, on input already bounded by
// checkShape.
func failingField(b []byte, t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return ""
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(b, &obj) != nil {
		return ""
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		ft, ok := jsonField(t, key)
		if !ok {
			continue
		}
		if json.Unmarshal(obj[key], reflect.New(ft).Interface()) == nil {
			continue
		}
		if sub := failingField(obj[key], ft); sub != "" {
			return key + "." + sub
		}
		return key
	}
	return ""
}

// jsonField returns the type of the field of struct t that JSON key
// decodes into.
func jsonField(t reflect.Type, key string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if strings.EqualFold(name, key) {
			return f.Type, true
		}
	}
	return nil, false
}

// jsonReason turns encoding/json errors into text that names the field.
func jsonReason(err error) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		// Value is the JSON kind, followed by the literal for a number
		// ("number 1.5"): the kind alone says what is wrong.
		got, _, _ := strings.Cut(typeErr.Value, " ")
		if typeErr.Field != "" {
			return fmt.Sprintf("field %q must be %s, got %s", typeErr.Field, typeName(typeErr.Type.String()), got)
		}
		return fmt.Sprintf("expected %s, got %s", typeName(typeErr.Type.String()), got)
	case errors.As(err, &syntaxErr):
		return fmt.Sprintf("syntax error at byte %d: %s", syntaxErr.Offset, syntaxErr.Error())
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "unexpected end of input (truncated JSON)"
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return "unknown field " + rest
	}
	return strings.TrimPrefix(msg, "json: ")
}

func typeName(goType string) string {
	switch {
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "an integer"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "string", goType == "time.Time":
		return "a string"
	case goType == "contract.Priority":
		return "a string: high, normal or low"
	case goType == "bool":
		return "a boolean"
	case strings.HasPrefix(goType, "map"), strings.HasPrefix(goType, "struct"):
		return "an object"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	}
	return goType
}

// checkRaw validates an optional embedded JSON value (data, payload,
// checkpoint).
func checkRaw(field string, raw json.RawMessage) error {
	if len(raw) == 0 {
		return nil
	}
	return checkShape(field, raw, MaxDataBytes)
}

// CheckStorable rejects a decoded value whose strings (outside raw JSON)
// hold a NUL character, which Postgres text cannot store. Decoders of this
// package call it; HTTP handlers decoding into their own types should too.
//
// The error names the field by its JSON path, below field when field is
// not empty (e.g. "data.error.message").
func CheckStorable(field string, v any) error {
	path := nulField(reflect.ValueOf(v), "")
	if path == "" {
		return nil
	}
	return fieldErr(joinPath(field, path), `contains a NUL character (\u0000), which cannot be stored`)
}

// nulField returns the JSON path of the first decoded string that holds a
// NUL character: Postgres text cannot store one, so such a message would be
// redelivered forever. Raw JSON (data, payload, checkpoint) is kept as JSON
// text, where \u0000 stays an escape, and is not inspected.
func nulField(v reflect.Value, path string) string {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return ""
		}
		return nulField(v.Elem(), path)
	case reflect.String:
		if strings.IndexByte(v.String(), 0) >= 0 {
			return path
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() || f.Type == rawMessageType {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" {
				name = f.Name
			}
			if p := nulField(v.Field(i), joinPath(path, name)); p != "" {
				return p
			}
		}
	case reflect.Map:
		iter := v.MapRange()
		for iter.Next() {
			if strings.IndexByte(iter.Key().String(), 0) >= 0 {
				return path
			}
			if p := nulField(iter.Value(), joinPath(path, iter.Key().String())); p != "" {
				return p
			}
		}
	case reflect.Slice:
		if v.Type() == rawMessageType {
			return ""
		}
		for i := range v.Len() {
			if p := nulField(v.Index(i), fmt.Sprintf("%s[%d]", path, i)); p != "" {
				return p
			}
		}
	}
	return ""
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
