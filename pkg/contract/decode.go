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
	if err := CheckStorable(field, v); err != nil {
		return err
	}
	return nil
}

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
		if typeErr.Field != "" {
			return fmt.Sprintf("field %q must be %s, got %s", typeErr.Field, typeName(typeErr.Type.String()), typeErr.Value)
		}
		return fmt.Sprintf("expected %s, got %s", typeName(typeErr.Type.String()), typeErr.Value)
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
