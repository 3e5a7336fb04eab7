package contract

import (
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
)

// Limits on identifiers. Ids end up as subject tokens and inside
// Nats-Msg-Id values, so they are kept short and free of '.', '*', '>' and
// white space.
const (
	MaxIDLen      = 128
	MaxTokenLen   = 64
	MaxTypeLen    = 128
	MaxKindLen    = 32
	MaxAttempt    = 1_000_000
	MaxMessageLen = 4096
)

// The patterns of ids, tokens and types, written out byte by byte: they
// run several times on every message, where regexp cost a fifth of a
// lifecycle decode. TestNamePatterns and FuzzNamePatterns hold them to
// the regular expressions the docs give:
//
//	id     ^[A-Za-z0-9_-]+$
//	token  ^[a-z0-9][a-z0-9_-]*$
//	type   ^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)*$
func isID(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isLowerOrDigit(c) && (c < 'A' || c > 'Z') && c != '_' && c != '-' {
			return false
		}
	}
	return s != ""
}

func isToken(s string) bool {
	if s == "" || !isLowerOrDigit(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isLowerOrDigit(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isType(s string) bool {
	for {
		part, rest, more := strings.Cut(s, ".")
		if !isToken(part) {
			return false
		}
		if !more {
			return true
		}
		s = rest
	}
}

func isLowerOrDigit(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

// NewID returns a new ULID, the default id for events, deliveries and jobs.
func NewID() string {
	return ulid.MustNew(ulid.Timestamp(time.Now()), rand.Reader).String()
}

// ValidateID reports whether id can be used as an item, event, delivery, job
// or run id: 1 to 128 characters from [A-Za-z0-9_-].
func ValidateID(field, id string) error {
	return checkName(field, id, MaxIDLen, isID, "use only letters, digits, '_' and '-' (it becomes a subject token)")
}

// ValidateToken checks a lowercase subject token such as a retry kind, a
// source, a job type or a workflow name: [a-z0-9][a-z0-9_-]*, at most 64
// characters.
func ValidateToken(field, tok string) error {
	return checkName(field, tok, MaxTokenLen, isToken, "be lowercase letters, digits, '_' or '-', starting with a letter or digit")
}

// ValidateKind checks a retry kind. Kinds are tokens of at most 32
// characters; "event", "event-trigger" and "job" are built in and any other
// kind works the same way.
func ValidateKind(field, kind string) error {
	if err := ValidateToken(field, kind); err != nil {
		return err
	}
	if len(kind) > MaxKindLen {
		return tooLong(field, len(kind), MaxKindLen)
	}
	return nil
}

// ValidateType checks an event type: dot-separated lowercase tokens such as
// "invoice.paid", at most 128 characters.
func ValidateType(field, typ string) error {
	return checkName(field, typ, MaxTypeLen, isType, "be lowercase dot-separated tokens of letters, digits, '_' or '-'")
}

// checkName checks a required name of at most max characters that must
// match pattern; must says what pattern asks for.
func checkName(field, name string, max int, pattern func(string) bool, must string) error {
	switch {
	case name == "":
		return fieldErr(field, "is required")
	case len(name) > max:
		return tooLong(field, len(name), max)
	case !pattern(name):
		return fieldErr(field, fmt.Sprintf("%q must %s", name, must))
	}
	return nil
}

// tooLong refuses a name of n characters where max is the limit.
func tooLong(field string, n, max int) error {
	return fieldErr(field, fmt.Sprintf("is %d characters, more than the limit of %d", n, max))
}

// ValidateAttempt checks a 1-based attempt number.
func ValidateAttempt(field string, attempt int) error {
	if attempt < 1 || attempt > MaxAttempt {
		return fieldErr(field, fmt.Sprintf("must be between 1 and %d, got %d", MaxAttempt, attempt))
	}
	return nil
}
