package contract

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// ErrorInfo is what went wrong in an attempt. Class is one of the error
// classes (see package errclass); empty means "classify the message".
type ErrorInfo struct {
	Class   string `json:"class,omitempty"`
	Message string `json:"message"`
	// NonRetryable marks this failure as final whatever its class, like
	// Temporal's non-retryable application errors.
	NonRetryable bool `json:"non_retryable,omitempty"`
}

// FailedData is published by an item's owner on retry.<kind>.failed.<id>
// when attempt number Attempt did not succeed.
type FailedData struct {
	Kind    string    `json:"kind"`
	ID      string    `json:"id"`
	Attempt int       `json:"attempt"`
	Error   ErrorInfo `json:"error"`
	// Reason is a short machine-readable cause. Owners hold items back with
	// a held event; the reasons they used before it existed
	// (source_throttled, source_paused, trigger_throttled, max_concurrency)
	// still make the scheduler decide a hold (see LegacyHoldReason).
	Reason     string      `json:"reason,omitempty"`
	RetryAfter *RetryAfter `json:"retry_after,omitempty"`
	JobType    string      `json:"job_type,omitempty"`
	Source     string      `json:"source,omitempty"`
	// MaxRetries and RetryEnabled are job-level overrides of the policy;
	// TimeoutMS is the job's own timeout. The scheduler keeps all three
	// and sends them back on the due.
	MaxRetries   *int  `json:"max_retries,omitempty"`
	RetryEnabled *bool `json:"retry_enabled,omitempty"`
	TimeoutMS    int64 `json:"timeout_ms,omitempty"`
	// Priority is a job's priority band (empty: normal), kept by the
	// scheduler and sent back on the due so the retry runs in its band.
	Priority   Priority          `json:"priority,omitempty"`
	Payload    json.RawMessage   `json:"payload,omitempty"`
	Checkpoint json.RawMessage   `json:"checkpoint,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// Executor names the worker instance that ran the attempt (see
	// ValidateExecutor); empty when the owner does not say.
	Executor string `json:"executor,omitempty"`
}

// SucceededData is published by the owner when attempt Attempt worked.
type SucceededData struct {
	Kind     string            `json:"kind"`
	ID       string            `json:"id"`
	Attempt  int               `json:"attempt"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Executor names the worker instance that ran the attempt, as on
	// FailedData.
	Executor string `json:"executor,omitempty"`
}

// Decision says why the scheduler chose a time: the policy and version, the
// backoff figures, and what decided (see the DecidedBy values).
type Decision struct {
	Policy        string `json:"policy"`
	PolicyVersion int    `json:"policy_version"`
	DecidedBy     string `json:"decided_by"`
	ErrorClass    string `json:"error_class,omitempty"`
	BaseDelayMS   int64  `json:"base_delay_ms"`
	JitterMS      int64  `json:"jitter_ms"`
	DelayMS       int64  `json:"delay_ms"`
	RetryAfterMS  *int64 `json:"retry_after_ms,omitempty"`
	RetryCount    int    `json:"retry_count"`
	MaxRetries    int    `json:"max_retries"`
	// HoldReason, HeldSince and MaxHoldMS are set for a hold: the
	// reason, when the item's current hold began and the policy's
	// limit on it. A hold leaves RetryCount as it was.
	HoldReason string     `json:"hold_reason,omitempty"`
	HeldSince  *time.Time `json:"held_since,omitempty"`
	MaxHoldMS  int64      `json:"max_hold_ms,omitempty"`
	// BackoffClass is set when the error's class has its own backoff in
	// the policy (class_backoff) and it timed this retry.
	BackoffClass string `json:"backoff_class,omitempty"`
	// CappedBy names the limit that shortened the delay asked for:
	// "max_retry_after" (a failure's retry-after hint) or "max_hold".
	CappedBy string `json:"capped_by,omitempty"`
	Note     string `json:"note,omitempty"`
}

// Values of Decision.DecidedBy.
const (
	// DecidedByBackoff: a failure, delayed by the policy's backoff.
	DecidedByBackoff = "backoff"
	// DecidedByRetryAfter: a failure, delayed by its own retry-after hint
	// (up to the policy's max_retry_after).
	DecidedByRetryAfter = "retry_after"
	// DecidedByHold: a throttle or concurrency hold, released when the
	// owner said it lifts (or polled at the backoff delay without one).
	DecidedByHold = "hold"
	// DecidedByPauseUntil: a pause hold released at the pause's end.
	DecidedByPauseUntil = "pause_until"
	// DecidedByPause: a pause without an end, held until a release fact
	// or max_hold.
	DecidedByPause = "pause"
	// DecidedByResume: released early by a release fact (a resume, a
	// limit change).
	DecidedByResume = "resume"
	// DecidedByThrottle is what decisions recorded for holds before the
	// held event existed; it is kept so old history reads the same.
	DecidedByThrottle = "throttle"
	DecidedByManual   = "manual"
)

// Values of Decision.CappedBy.
const (
	CappedByMaxRetryAfter = "max_retry_after"
	CappedByMaxHold       = "max_hold"
)

// ScheduledData is published by the scheduler on retry.<kind>.scheduled.<id>
// (first retry) and retry.<kind>.rescheduled.<id> (later ones, and manual
// retries). Attempt is the attempt that will run when due.
type ScheduledData struct {
	Kind          string    `json:"kind"`
	ID            string    `json:"id"`
	Attempt       int       `json:"attempt"`
	NextAttemptAt time.Time `json:"next_attempt_at"`
	JobType       string    `json:"job_type,omitempty"`
	Source        string    `json:"source,omitempty"`
	Decision      Decision  `json:"decision"`
}

// DueData is published by the scheduler on retry.<kind>.due.<id> with
// Nats-Msg-Id DueMsgID(kind, id, attempt). It brings back the payload and
// checkpoint of the last failure.
type DueData struct {
	Kind          string            `json:"kind"`
	ID            string            `json:"id"`
	Attempt       int               `json:"attempt"`
	NextAttemptAt time.Time         `json:"next_attempt_at"`
	JobType       string            `json:"job_type,omitempty"`
	Source        string            `json:"source,omitempty"`
	Payload       json.RawMessage   `json:"payload,omitempty"`
	Checkpoint    json.RawMessage   `json:"checkpoint,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	// MaxRetries, RetryEnabled and TimeoutMS are the job's overrides, as
	// its last failed or held event carried them, so the job that runs
	// again has them (no round trip through metadata).
	MaxRetries   *int  `json:"max_retries,omitempty"`
	RetryEnabled *bool `json:"retry_enabled,omitempty"`
	TimeoutMS    int64 `json:"timeout_ms,omitempty"`
	// Priority is the job's priority band as its last failed or held
	// event carried it (empty: normal); the due router publishes the job
	// on that band's subject.
	Priority Priority `json:"priority,omitempty"`
}

// Values of ExhaustedData.Reason.
const (
	ExhaustedMaxRetries      = "max_retries"
	ExhaustedNonRetryable    = "non_retryable"
	ExhaustedRetriesDisabled = "retries_disabled"
	// ExhaustedHoldExpired: held back longer than the policy's max_hold.
	ExhaustedHoldExpired = "hold_expired"
)

// ExhaustedData is the dead-letter fact on retry.<kind>.exhausted.<id>.
type ExhaustedData struct {
	Kind          string    `json:"kind"`
	ID            string    `json:"id"`
	Attempt       int       `json:"attempt"`
	Reason        string    `json:"reason"`
	Error         ErrorInfo `json:"error"`
	RetryCount    int       `json:"retry_count"`
	MaxRetries    int       `json:"max_retries"`
	Policy        string    `json:"policy"`
	PolicyVersion int       `json:"policy_version"`
	JobType       string    `json:"job_type,omitempty"`
	Source        string    `json:"source,omitempty"`
}

// CancelledData is published on retry.<kind>.cancelled.<id> by an operator
// (through the scheduler's API) or by an owner that gave up on the item.
type CancelledData struct {
	Kind    string `json:"kind"`
	ID      string `json:"id"`
	Attempt int    `json:"attempt"`
	By      string `json:"by"`
	Reason  string `json:"reason,omitempty"`
}

// validate methods check what JSON decoding cannot.

func validateItem(kind, id string, attempt int) error {
	if err := ValidateKind("data.kind", kind); err != nil {
		return err
	}
	if err := ValidateID("data.id", id); err != nil {
		return err
	}
	return ValidateAttempt("data.attempt", attempt)
}

func validateOptionalTokens(jobType, source string) error {
	if jobType != "" {
		if err := ValidateToken("data.job_type", jobType); err != nil {
			return err
		}
	}
	if source != "" {
		if err := ValidateToken("data.source", source); err != nil {
			return err
		}
	}
	return nil
}

// ValidateExecutor checks the executor of an attempt: at most MaxTokenLen
// bytes of printable text. It is a label for operators, not a subject
// token, so host names with capitals and dots fit; printable keeps it from
// breaking the CLI's table and the dashboard's line. Empty means unknown
// (an owner that does not say) and is valid.
func ValidateExecutor(field, executor string) error {
	switch {
	case len(executor) > MaxTokenLen:
		return fieldErr(field, fmt.Sprintf("is %d bytes, more than the limit of %d", len(executor), MaxTokenLen))
	case !utf8.ValidString(executor):
		return fieldErr(field, "is not valid UTF-8")
	case strings.IndexFunc(executor, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return fieldErr(field, fmt.Sprintf("%q must be printable text", executor))
	}
	return nil
}

func validateMetadata(md map[string]string) error {
	if len(md) > 32 {
		return fieldErr("data.metadata", "has more than 32 entries")
	}
	for k, v := range md {
		if k == "" || len(k) > 64 || len(v) > 1024 {
			return fieldErr("data.metadata", fmt.Sprintf("entry %q: keys are 1 to 64 characters, values at most 1024", k))
		}
	}
	return nil
}

func validateError(e ErrorInfo) error {
	if e.Class != "" {
		if err := ValidateToken("data.error.class", e.Class); err != nil {
			return err
		}
	}
	if len(e.Message) > MaxMessageLen {
		return fieldErr("data.error.message", fmt.Sprintf("is longer than %d bytes", MaxMessageLen))
	}
	return nil
}

// Validate checks a failed event.
func (d FailedData) Validate() error {
	if err := validateItem(d.Kind, d.ID, d.Attempt); err != nil {
		return err
	}
	if err := validateError(d.Error); err != nil {
		return err
	}
	if len(d.Reason) > MaxTokenLen {
		return fieldErr("data.reason", fmt.Sprintf("is longer than %d characters", MaxTokenLen))
	}
	if err := validateOptionalTokens(d.JobType, d.Source); err != nil {
		return err
	}
	if err := ValidateExecutor("data.executor", d.Executor); err != nil {
		return err
	}
	return validateWork(d.Priority, d.MaxRetries, d.TimeoutMS, d.Payload, d.Checkpoint, d.Metadata)
}

// Validate checks a succeeded event.
func (d SucceededData) Validate() error {
	if err := validateItem(d.Kind, d.ID, d.Attempt); err != nil {
		return err
	}
	if err := ValidateExecutor("data.executor", d.Executor); err != nil {
		return err
	}
	return validateMetadata(d.Metadata)
}

// Validate checks a scheduled or rescheduled event.
func (d ScheduledData) Validate() error {
	if err := validateItem(d.Kind, d.ID, d.Attempt); err != nil {
		return err
	}
	if d.NextAttemptAt.IsZero() {
		return fieldErr("data.next_attempt_at", "is required")
	}
	return validateOptionalTokens(d.JobType, d.Source)
}

// Validate checks a due event.
func (d DueData) Validate() error {
	if err := validateItem(d.Kind, d.ID, d.Attempt); err != nil {
		return err
	}
	if err := validateOptionalTokens(d.JobType, d.Source); err != nil {
		return err
	}
	return validateWork(d.Priority, d.MaxRetries, d.TimeoutMS, d.Payload, d.Checkpoint, d.Metadata)
}

// Validate checks an exhausted event.
func (d ExhaustedData) Validate() error {
	if err := validateItem(d.Kind, d.ID, d.Attempt); err != nil {
		return err
	}
	switch d.Reason {
	case ExhaustedMaxRetries, ExhaustedNonRetryable, ExhaustedRetriesDisabled, ExhaustedHoldExpired:
	default:
		return fieldErr("data.reason", fmt.Sprintf("%q is not max_retries, non_retryable, retries_disabled or hold_expired", d.Reason))
	}
	return validateError(d.Error)
}

// Validate checks a cancelled event. Attempt may be 0 when the item was
// cancelled before it ever failed.
func (d CancelledData) Validate() error {
	if err := ValidateKind("data.kind", d.Kind); err != nil {
		return err
	}
	if err := ValidateID("data.id", d.ID); err != nil {
		return err
	}
	if d.Attempt < 0 || d.Attempt > MaxAttempt {
		return fieldErr("data.attempt", fmt.Sprintf("must be between 0 and %d", MaxAttempt))
	}
	if d.By == "" || len(d.By) > MaxTokenLen {
		return fieldErr("data.by", fmt.Sprintf("is required and at most %d characters", MaxTokenLen))
	}
	if len(d.Reason) > MaxMessageLen {
		return fieldErr("data.reason", fmt.Sprintf("is longer than %d bytes", MaxMessageLen))
	}
	return nil
}
