// Package policy holds retry policies and the pure retry decision: given a
// policy and a failed attempt, retry when, or stop and why. Decide does no
// I/O and reads no clock, so the scheduler, the CLI's simulator and tests
// all get the same answer for the same input and random source.
package policy

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
)

// Limits that Validate enforces; the database has the same checks.
const (
	MaxMaxRetries = 1000
	MaxDelay      = contract.MaxRetryAfter
	MaxNameLen    = contract.MaxTokenLen
	// AnyKind is the kind of the fallback policy for kinds without one.
	AnyKind = "*"
	// DefaultMaxHold is how long an item may be held back (throttled,
	// paused, waiting for a slot) before it is exhausted as hold_expired,
	// when the policy does not say.
	DefaultMaxHold = 30 * 24 * time.Hour
	// DefaultMaxRetryAfter is the longest retry-after hint of a failure
	// the scheduler honours, when the policy does not say.
	DefaultMaxRetryAfter = 24 * time.Hour
)

// Policy is a retry policy for a kind and, optionally, a job type (a row of
// retry_policies). It is the one shape of a policy: the scheduler decides
// with it, the store reads and writes it, and the HTTP API, the CLI and the
// dashboard exchange it in its JSON form (see MarshalJSON), whose field
// names are the retry_policies columns.
type Policy struct {
	Kind    string
	JobType string
	Name    string
	Version int
	// MaxRetries is how many retries are allowed: at most MaxRetries+1
	// attempts.
	MaxRetries int
	Backoff    backoff.Config
	// RetryableClasses makes classes that are not retryable by default
	// retryable; NonRetryableClasses stops retries for the classes listed
	// and wins over everything else.
	RetryableClasses    []errclass.Class
	NonRetryableClasses []errclass.Class
	Enabled             bool
	// MaxHold bounds how long an item may be held back in one stretch
	// (from its first hold until it runs); 0 means DefaultMaxHold.
	MaxHold time.Duration
	// MaxRetryAfter bounds a failure's own retry-after hint, which may be
	// longer than Backoff.Max; 0 means DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration
	// ClassBackoff gives error classes their own backoff (see
	// ClassBackoff); a class without an entry uses Backoff.
	ClassBackoff map[errclass.Class]ClassBackoff
	// UpdatedBy, CreatedAt and UpdatedAt say who changed a stored policy
	// last and when; the store sets them, and Decide and Validate ignore
	// them.
	UpdatedBy string
	CreatedAt time.Time
	UpdatedAt time.Time
}

func invalid(field, reason string) error {
	return &contract.FieldError{Field: field, Reason: reason, Err: contract.ErrInvalid}
}

// Validate checks the policy. Errors are *contract.FieldError wrapping
// contract.ErrInvalid, named after the retry_policies columns.
func (p Policy) Validate() error {
	if p.Kind != AnyKind {
		if err := contract.ValidateKind("kind", p.Kind); err != nil {
			return err
		}
	}
	if p.JobType != "" {
		if err := contract.ValidateToken("job_type", p.JobType); err != nil {
			return err
		}
	}
	b := p.Backoff
	switch {
	case p.Name == "" || len(p.Name) > MaxNameLen:
		return invalid("name", fmt.Sprintf("is required and at most %d characters", MaxNameLen))
	case p.Version < 1:
		return invalid("version", fmt.Sprintf("must be at least 1, got %d", p.Version))
	case p.MaxRetries < 0 || p.MaxRetries > MaxMaxRetries:
		return invalid("max_retries", fmt.Sprintf("must be between 0 and %d, got %d", MaxMaxRetries, p.MaxRetries))
	case b.Base < 0:
		return invalid("base_delay_ms", fmt.Sprintf("must not be negative, got %d", b.Base.Milliseconds()))
	case b.Max < b.Base:
		return invalid("max_delay_ms", fmt.Sprintf("must be at least base_delay_ms (%d), got %d", b.Base.Milliseconds(), b.Max.Milliseconds()))
	case b.Max > MaxDelay:
		return invalid("max_delay_ms", fmt.Sprintf("must be at most %d (366 days), got %d", MaxDelay.Milliseconds(), b.Max.Milliseconds()))
	case math.IsNaN(b.Multiplier) || math.IsInf(b.Multiplier, 0) || b.Multiplier < 1:
		return invalid("multiplier", fmt.Sprintf("must be a number >= 1, got %v", b.Multiplier))
	case b.Jitter == "" || !b.Jitter.Valid():
		return invalid("jitter", fmt.Sprintf("%q must be none, full, equal or additive", b.Jitter))
	case b.JitterMax < 0 || b.JitterMax > MaxDelay:
		return invalid("jitter_ms", fmt.Sprintf("must be between 0 and %d, got %d", MaxDelay.Milliseconds(), b.JitterMax.Milliseconds()))
	case p.MaxHold < 0 || p.MaxHold > MaxDelay:
		return invalid("max_hold_ms", fmt.Sprintf("must be between 1 and %d (0 for the default of 30 days), got %d", MaxDelay.Milliseconds(), p.MaxHold.Milliseconds()))
	case p.MaxRetryAfter < 0 || p.MaxRetryAfter > MaxDelay:
		return invalid("max_retry_after_ms", fmt.Sprintf("must be between 0 and %d, got %d", MaxDelay.Milliseconds(), p.MaxRetryAfter.Milliseconds()))
	}
	if err := p.validateClassBackoff(); err != nil {
		return err
	}
	if err := validateClasses("retryable_classes", p.RetryableClasses); err != nil {
		return err
	}
	if err := validateClasses("non_retryable_classes", p.NonRetryableClasses); err != nil {
		return err
	}
	for _, c := range p.NonRetryableClasses {
		if slices.Contains(p.RetryableClasses, c) {
			return invalid("non_retryable_classes", fmt.Sprintf("%q is also in retryable_classes", c))
		}
	}
	return nil
}

func validateClasses(field string, classes []errclass.Class) error {
	for _, c := range classes {
		if !c.Valid() {
			return invalid(field, fmt.Sprintf("%q is not an error class (timeout, network, rate_limit, temporary, authentication, permission, validation, unknown)", c))
		}
	}
	return nil
}

// Retryable reports whether the policy retries errors of class c: not when c
// is in NonRetryableClasses, yes when it is in RetryableClasses, otherwise
// c's default (errclass.Class.Retryable). An empty class counts as unknown.
func (p Policy) Retryable(c errclass.Class) bool {
	if c == "" {
		c = errclass.Unknown
	}
	switch {
	case slices.Contains(p.NonRetryableClasses, c):
		return false
	case slices.Contains(p.RetryableClasses, c):
		return true
	}
	return c.Retryable()
}

// EffectiveMaxRetries is the item's override when set, else the policy's
// MaxRetries; negative values count as 0.
func (p Policy) EffectiveMaxRetries(override *int) int {
	if override != nil {
		return max(*override, 0)
	}
	return max(p.MaxRetries, 0)
}

// EffectiveMaxHold is MaxHold, or DefaultMaxHold when it is not set.
func (p Policy) EffectiveMaxHold() time.Duration {
	if p.MaxHold <= 0 {
		return DefaultMaxHold
	}
	return p.MaxHold
}

// EffectiveMaxRetryAfter is MaxRetryAfter, or DefaultMaxRetryAfter when it
// is not set.
func (p Policy) EffectiveMaxRetryAfter() time.Duration {
	if p.MaxRetryAfter <= 0 {
		return DefaultMaxRetryAfter
	}
	return p.MaxRetryAfter
}

// delayMS is d in whole milliseconds, the unit of decisions and the
// database.
func delayMS(d time.Duration) int64 { return d.Milliseconds() }
