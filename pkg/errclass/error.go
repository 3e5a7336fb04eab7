package errclass

import (
	"errors"
	"time"
)

// Error is a classified application error. Build it with New, Wrap,
// NonRetryable or RetryAfter; each of them keeps the class, retry-after hint
// and non-retryable flag of an *Error already in the wrapped chain unless it
// sets them itself, so the outermost *Error always carries the full picture.
type Error struct {
	// Class is the error class; empty means "classify the message".
	Class Class
	// Message describes the failure; with a Cause, Error() is
	// "Message: Cause".
	Message string
	// RetryAfter is the caller's hint for when to try again (e.g. from an
	// HTTP Retry-After header); zero means none.
	RetryAfter time.Duration
	// NonRetryable stops retries whatever the class and the policy say.
	NonRetryable bool
	// Cause is the wrapped error, if any.
	Cause error

	sentinel bool
}

func (e *Error) Error() string {
	switch {
	case e.Cause == nil && e.Message == "":
		return string(e.Class)
	case e.Cause == nil:
		return e.Message
	case e.Message == "":
		return e.Cause.Error()
	}
	return e.Message + ": " + e.Cause.Error()
}

func (e *Error) Unwrap() error { return e.Cause }

// Is matches the package's sentinel errors: ErrTimeout and the other class
// sentinels match an *Error of that class, ErrNonRetryable one marked
// NonRetryable.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || !t.sentinel {
		return false
	}
	if t.NonRetryable {
		return e.NonRetryable
	}
	return t.Class == e.Class
}

// Sentinels for errors.Is, and ready-made classified errors to wrap:
// fmt.Errorf("call api: %w", errclass.ErrRateLimit) classifies as rate_limit.
var (
	ErrTimeout        = sentinel(Timeout)
	ErrNetwork        = sentinel(Network)
	ErrRateLimit      = sentinel(RateLimit)
	ErrTemporary      = sentinel(Temporary)
	ErrAuthentication = sentinel(Authentication)
	ErrPermission     = sentinel(Permission)
	ErrValidation     = sentinel(Validation)
	// ErrNonRetryable matches errors marked with NonRetryable.
	ErrNonRetryable error = &Error{Message: "non-retryable", NonRetryable: true, sentinel: true}
)

func sentinel(c Class) error { return &Error{Class: c, sentinel: true} }

// New returns an error of class c.
func New(c Class, msg string) error {
	return &Error{Class: c, Message: msg}
}

// Wrap classifies err as c, keeping an inner retry-after hint and
// non-retryable flag. It returns nil for a nil err.
func Wrap(c Class, err error) error {
	if err == nil {
		return nil
	}
	e := inherit(err)
	e.Class = c
	return e
}

// NonRetryable marks err so that it is never retried, whatever its class and
// the policy say. It returns nil for a nil err.
func NonRetryable(err error) error {
	if err == nil {
		return nil
	}
	e := inherit(err)
	e.NonRetryable = true
	return e
}

// RetryAfter attaches a hint to retry err no sooner than d from now; the
// scheduler caps it at the policy's max delay. It returns nil for a nil err.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	e := inherit(err)
	e.RetryAfter = max(d, 0)
	return e
}

// inherit wraps err in a new *Error carrying the fields of the outermost
// *Error already in its chain.
func inherit(err error) *Error {
	e := &Error{Cause: err}
	if inner, ok := As(err); ok {
		e.Class, e.RetryAfter, e.NonRetryable = inner.Class, inner.RetryAfter, inner.NonRetryable
	}
	return e
}

// As returns the outermost *Error in err's chain.
func As(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}
