// Package pgtext makes strings from messages and requests storable in
// Postgres. A text or json value with a NUL byte or invalid UTF-8 is an
// error there (SQLSTATE 22021; jsonb also refuses "\u0000", 22P05), and a
// message whose handling always fails on it is delivered again forever.
// JSON strings decode to any of these, so every free-text field a store
// writes goes through Clean (text) or CleanMap (jsonb) first.
package pgtext

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/retryd/retryd/pkg/contract"
)

// Clean returns s with every NUL byte and invalid UTF-8 sequence replaced
// by U+FFFD. Valid text comes back unchanged (and unallocated).
func Clean(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// Truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// CleanMap returns m with Clean applied to every key and string value,
// nested maps and slices included, for a jsonb column. m itself is not
// changed.
func CleanMap(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[Clean(k)] = cleanValue(v)
	}
	return out
}

func cleanValue(v any) any {
	switch v := v.(type) {
	case string:
		return Clean(v)
	case map[string]any:
		return CleanMap(v)
	case map[string]string:
		out := make(map[string]string, len(v))
		for k, s := range v {
			out[Clean(k)] = Clean(s)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = cleanValue(e)
		}
		return out
	case []string:
		out := make([]string, len(v))
		for i, s := range v {
			out[i] = Clean(s)
		}
		return out
	}
	return v
}

// Check validates free text from a request (a reason, a name): at most max
// bytes and no NUL character, which Postgres cannot store. Its error is a
// *contract.FieldError naming field, ready for an HTTP 400.
func Check(field, v string, max int) error {
	switch {
	case len(v) > max:
		return &contract.FieldError{Field: field, Reason: fmt.Sprintf("is longer than %d bytes", max), Err: contract.ErrInvalid}
	case strings.IndexByte(v, 0) >= 0:
		return &contract.FieldError{Field: field, Reason: "must not contain NUL characters", Err: contract.ErrInvalid}
	}
	return nil
}

// CheckActor validates who asks for an operator action and why: by (the
// token's name, at most contract.MaxTokenLen) and reason (at most
// maxReason bytes), each as Check does.
func CheckActor(by, reason string, maxReason int) error {
	if err := Check("by", by, contract.MaxTokenLen); err != nil {
		return err
	}
	return Check("reason", reason, maxReason)
}
