package contract

import (
	"crypto/rand"
	"fmt"
	"regexp"
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

var (
	idPattern    = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	tokenPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)
	typePattern  = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)*$`)
)

// NewID returns a new ULID, the default id for events, deliveries and jobs.
func NewID() string {
	return ulid.MustNew(ulid.Timestamp(time.Now()), rand.Reader).String()
}

// ValidateID reports whether id can be used as an item, event, delivery, job
// or run id: 1 to 128 characters from [A-Za-z0-9_-].
func ValidateID(field, id string) error {
	return checkName(field, id, MaxIDLen, idPattern, "use only letters, digits, '_' and '-' (it becomes a subject token)")
}

// ValidateToken checks a lowercase subject token such as a retry kind, a
// source, a job type or a workflow name: [a-z0-9][a-z0-9_-]*, at most 64
// characters.
func ValidateToken(field, tok string) error {
	return checkName(field, tok, MaxTokenLen, tokenPattern, "be lowercase letters, digits, '_' or '-', starting with a letter or digit")
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
	return checkName(field, typ, MaxTypeLen, typePattern, "be lowercase dot-separated tokens of letters, digits, '_' or '-'")
}

// checkName checks a required name of at most max characters that must
// match pattern; must says what pattern asks for.
func checkName(field, name string, max int, pattern *regexp.Regexp, must string) error {
	switch {
	case name == "":
		return fieldErr(field, "is required")
	case len(name) > max:
		return tooLong(field, len(name), max)
	case !pattern.MatchString(name):
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
