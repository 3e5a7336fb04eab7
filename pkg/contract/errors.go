package contract

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

var (
	// ErrInvalid is wrapped by every validation and decoding error: the input
	// is malformed and retrying it will not help (HTTP 400, NATS Term).
	ErrInvalid = errors.New("invalid input")
	// ErrTooLarge is wrapped when input exceeds a size limit (HTTP 413).
	ErrTooLarge = errors.New("input too large")
)

// FieldError says which field of an input is wrong and why.
type FieldError struct {
	Field  string
	Reason string
	// Err is ErrInvalid or ErrTooLarge.
	Err error
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + " " + e.Reason
}

func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(field, reason string) error {
	return &FieldError{Field: field, Reason: reason, Err: ErrInvalid}
}

func tooLarge(field string, size, limit int) error {
	return &FieldError{
		Field:  field,
		Reason: fmt.Sprintf("is %d bytes, more than the limit of %d", size, limit),
		Err:    ErrTooLarge,
	}
}

// quoted matches a Go-quoted value inside an error text.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// fieldName is what a field path of the contract looks like: JSON names
// and dots, at most 64 bytes. An unknown field's name comes from the
// input and may be anything; only names of this shape are kept.
var fieldName = regexp.MustCompile(`^"[a-z][a-z0-9_.]{0,63}"$`)

func knownField(q string) bool { return fieldName.MatchString(q) }

// maxLogReason bounds the reason logged or sent with a termination.
const maxLogReason = 256

// LogReason is err's text made safe for logs and for the reason of a
// terminated NATS message: every quoted value is replaced by "…", since a
// decoding error quotes the bad input, and input that is bad may be a
// secret in the wrong place. The field and the rule broken stay readable:
// a quoted name right after the word field is the contract's own field
// name (from the decoder, never from the input's values), and is kept.
func LogReason(err error) string {
	if err == nil {
		return ""
	}
	text := err.Error()
	var b strings.Builder
	last := 0
	for _, m := range quoted.FindAllStringIndex(text, -1) {
		b.WriteString(text[last:m[0]])
		// "unknown field" names a key of the input: redacted like a value.
		if strings.HasSuffix(text[:m[0]], "field ") && !strings.HasSuffix(text[:m[0]], "unknown field ") && knownField(text[m[0]:m[1]]) {
			b.WriteString(text[m[0]:m[1]])
		} else {
			b.WriteString(`"…"`)
		}
		last = m[1]
	}
	b.WriteString(text[last:])
	s := b.String()
	if len(s) <= maxLogReason {
		return s
	}
	cut := maxLogReason
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
