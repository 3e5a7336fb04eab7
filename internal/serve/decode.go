package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/retryd/retryd/pkg/contract"
)

// DecodeJSON reads at most limit bytes of the request body and decodes them
// into v strictly: an empty body, invalid UTF-8, malformed JSON, a field v
// does not have, a value of the wrong type or data after the JSON value is
// an error wrapping contract.ErrInvalid; a body over limit wraps
// contract.ErrTooLarge. Errors are *contract.FieldError naming the field
// ("body" when no field is to blame), ready for WriteError. Nesting deeper
// than contract.MaxDepth is refused before decoding.
func DecodeJSON(r *http.Request, limit int64, v any) error {
	if err := RequireJSON(r); err != nil {
		return err
	}
	if r.Body == nil {
		return invalid("body", "is empty")
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, limit))
	if err != nil {
		var maxBytes *http.MaxBytesError
		if errors.As(err, &maxBytes) {
			return &contract.FieldError{
				Field:  "body",
				Reason: fmt.Sprintf("is larger than the limit of %d bytes", limit),
				Err:    contract.ErrTooLarge,
			}
		}
		return invalid("body", "could not be read: "+err.Error())
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return invalid("body", "is empty")
	}
	if !utf8.Valid(body) {
		return invalid("body", "is not valid UTF-8")
	}
	if depth(body) > contract.MaxDepth {
		return invalid("body", fmt.Sprintf("is nested deeper than %d levels", contract.MaxDepth))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalid("body", "has data after the JSON value")
	}
	return contract.CheckStorable("", v)
}

// DecodeOptionalJSON is DecodeJSON for a body that may be left out (an
// action whose fields all have defaults): a request without one leaves v
// as it is.
func DecodeOptionalJSON(r *http.Request, limit int64, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return DecodeJSON(r, limit, v)
}

// RequireJSON refuses a request whose Content-Type is not JSON
// (application/json, or a type with the +json suffix such as
// application/cloudevents+json) with an error wrapping
// ErrUnsupportedMediaType. A browser can send a form or text/plain to
// another site without asking it first (no CORS preflight); it cannot
// send application/json, so requiring it shuts that door too.
func RequireJSON(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return fmt.Errorf("%w: Content-Type is missing: send application/json", ErrUnsupportedMediaType)
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return fmt.Errorf("%w: Content-Type is not JSON: send application/json", ErrUnsupportedMediaType)
	}
	return nil
}

// depth returns the deepest nesting of objects and arrays in b, counting
// brackets outside strings. It runs before decoding so that a 10,000-deep
// body costs one scan.
func depth(b []byte) int {
	d, deepest := 0, 0
	inString, escaped := false, false
	for _, c := range b {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			d++
			deepest = max(deepest, d)
		case c == '}' || c == ']':
			d--
		}
	}
	return deepest
}

func invalid(field, reason string) error {
	return &contract.FieldError{Field: field, Reason: reason, Err: contract.ErrInvalid}
}

// decodeError turns an encoding/json error into a FieldError naming the
// field.
func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	var fieldErr *contract.FieldError
	switch {
	case errors.As(err, &fieldErr):
		// A type's UnmarshalJSON that checks its own fields names them.
		return err
	case errors.As(err, &typeErr):
		if typeErr.Field != "" {
			return invalid(typeErr.Field, fmt.Sprintf("must be %s, got %s", jsonKind(typeErr.Type.String()), typeErr.Value))
		}
		return invalid("body", fmt.Sprintf("must be %s, got %s", jsonKind(typeErr.Type.String()), typeErr.Value))
	case errors.As(err, &syntaxErr):
		return invalid("body", fmt.Sprintf("is not valid JSON at byte %d: %s", syntaxErr.Offset, syntaxErr.Error()))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("body", "is not valid JSON: unexpected end of input (truncated)")
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return invalid(name, "is not a known field")
	}
	// Errors from a type's UnmarshalJSON (e.g. time.Time, RetryAfter) and
	// the decoder's depth limit.
	return invalid("body", "is not valid: "+strings.TrimPrefix(msg, "json: "))
}

// jsonKind names the JSON kind a Go type decodes from. pkg/contract's
// typeName does the same for the SDK's errors; it stays a copy on purpose
// (CONTRIBUTING.md, deliberate duplicates).
func jsonKind(goType string) string {
	switch {
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "an integer"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "string", goType == "time.Time":
		return "a string"
	case goType == "bool":
		return "a boolean"
	case strings.HasPrefix(goType, "map"), strings.HasPrefix(goType, "struct"), strings.Contains(goType, "."):
		return "an object"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	}
	return goType
}
