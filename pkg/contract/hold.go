package contract

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Values of HeldData.Reason: why an owner holds an item back. A hold is
// waiting for permission, not a failed attempt, so the scheduler never
// counts it against the retry budget (see docs/contract.md).
const (
	HoldThrottle    = "throttle"
	HoldPause       = "pause"
	HoldConcurrency = "concurrency"
)

// Values of ReleasedData.Reason.
const (
	// ReleaseResume: an operator resumed a paused source.
	ReleaseResume = "resume"
	// ReleaseLimitChanged: an operator changed or removed the limit that
	// throttled the items (a source's rate limit).
	ReleaseLimitChanged = "limit_changed"
	// ReleaseSlotFreed: a run finished and freed a concurrency slot; with
	// Count 1 and HoldReason concurrency it releases the delivery that has
	// waited longest.
	ReleaseSlotFreed = "slot_freed"
)

// HeldData is published by an item's owner on retry.<kind>.held.<id> when
// it held attempt Attempt back instead of running it. The scheduler keeps
// the retry budget as it was, releases the item at Until (uncapped by the
// policy's max delay), at a release fact for HoldKey, or ends it as
// exhausted (hold_expired) once it has been held for the policy's
// max_hold.
type HeldData struct {
	Kind    string `json:"kind"`
	ID      string `json:"id"`
	Attempt int    `json:"attempt"`
	// Reason is HoldThrottle, HoldPause or HoldConcurrency.
	Reason string `json:"reason"`
	// Until is when the hold lifts by itself (the end of a rate window or
	// of a pause); nil when only a release fact or max_hold ends it.
	Until *time.Time `json:"until,omitempty"`
	// HoldKey groups the items one release fact lifts, e.g. the source of
	// a paused event. It is a subject token.
	HoldKey string `json:"hold_key,omitempty"`
	// Detail is for operators ("rate limit of 10 per 1s reached").
	Detail     string            `json:"detail,omitempty"`
	JobType    string            `json:"job_type,omitempty"`
	Source     string            `json:"source,omitempty"`
	Payload    json.RawMessage   `json:"payload,omitempty"`
	Checkpoint json.RawMessage   `json:"checkpoint,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// MaxRetries, RetryEnabled and TimeoutMS are a held job's overrides,
	// kept for its next run as a failed event's are.
	MaxRetries   *int  `json:"max_retries,omitempty"`
	RetryEnabled *bool `json:"retry_enabled,omitempty"`
	TimeoutMS    int64 `json:"timeout_ms,omitempty"`
	// Priority is a held job's priority band (empty: normal), kept for
	// its next run as a failed event's is.
	Priority Priority `json:"priority,omitempty"`
	// Executor names the worker instance that held the attempt back, as
	// on FailedData.
	Executor string `json:"executor,omitempty"`
}

// ReleasedData is published by an owner on retry.<kind>.released.<hold_key>
// when what held items under HoldKey lifted early (an operator resumed a
// paused source or changed its rate limit). The scheduler makes every item
// it holds under the key due, in the order they were first held: at once,
// or at its slot of Pace; the owner looks at each again and holds it again
// if it must.
type ReleasedData struct {
	Kind    string `json:"kind"`
	HoldKey string `json:"hold_key"`
	// Reason is ReleaseResume or ReleaseLimitChanged.
	Reason string `json:"reason"`
	// By names who lifted the hold (the API, the CLI, an operator).
	By string `json:"by,omitempty"`
	// ReleasedAt is when the hold lifted, on the owner's database clock:
	// a hold decided before it and applied after it is released too (only
	// for a release of every hold of the key: Count 0).
	ReleasedAt time.Time `json:"released_at"`
	// HoldReason, when set, releases only the holds of that reason.
	HoldReason string `json:"hold_reason,omitempty"`
	// Count, when above 0, releases at most that many holds, those held
	// longest first (a freed slot releases one waiting delivery).
	Count int `json:"count,omitempty"`
	// ReleaseID, when set, names the release in its message id instead of
	// ReleasedAt (e.g. the run whose end freed a slot), so the same
	// release published twice is stored once.
	ReleaseID string `json:"release_id,omitempty"`
	// Pace, when set, spreads the release over the owner's rate windows:
	// the items come due one by one at their slots (see ReleasePace)
	// instead of all at once.
	Pace *ReleasePace `json:"pace,omitempty"`
	// OwnerAdmits, when true, says the owner brings the released items
	// back itself, in order, each at its time (its slot of Pace, or at
	// once): the scheduler emits no due for them and closes each row on
	// the owner's succeeded. It still gives each row a due, its redue
	// interval after that time, in case the owner never answers.
	OwnerAdmits bool `json:"owner_admits,omitempty"`
}

func (d HeldData) itemKey() (string, string, int) { return d.Kind, d.ID, d.Attempt }

// itemKey of a release is its hold key; a release has no attempt.
func (d ReleasedData) itemKey() (string, string, int) { return d.Kind, d.HoldKey, 0 }

// Validate checks a held event.
func (d HeldData) Validate() error {
	if err := validateItem(d.Kind, d.ID, d.Attempt); err != nil {
		return err
	}
	switch d.Reason {
	case HoldThrottle, HoldPause, HoldConcurrency:
	default:
		return fieldErr("data.reason", fmt.Sprintf("%q is not throttle, pause or concurrency", d.Reason))
	}
	if d.Until != nil && d.Until.IsZero() {
		return fieldErr("data.until", "is the zero time: leave it out when the hold has no end")
	}
	if d.HoldKey != "" {
		if err := ValidateID("data.hold_key", d.HoldKey); err != nil {
			return err
		}
	}
	if len(d.Detail) > MaxMessageLen {
		return fieldErr("data.detail", fmt.Sprintf("is longer than %d bytes", MaxMessageLen))
	}
	if err := validateOptionalTokens(d.JobType, d.Source); err != nil {
		return err
	}
	if err := ValidateExecutor("data.executor", d.Executor); err != nil {
		return err
	}
	return validateWork(d.Priority, d.MaxRetries, d.TimeoutMS, d.Payload, d.Checkpoint, d.Metadata)
}

// Validate checks a released event.
func (d ReleasedData) Validate() error {
	if err := ValidateKind("data.kind", d.Kind); err != nil {
		return err
	}
	if err := ValidateID("data.hold_key", d.HoldKey); err != nil {
		return err
	}
	switch d.Reason {
	case ReleaseResume, ReleaseLimitChanged, ReleaseSlotFreed:
	default:
		return fieldErr("data.reason", fmt.Sprintf("%q is not resume, limit_changed or slot_freed", d.Reason))
	}
	switch d.HoldReason {
	case "", HoldThrottle, HoldPause, HoldConcurrency:
	default:
		return fieldErr("data.hold_reason", fmt.Sprintf("%q is not throttle, pause or concurrency", d.HoldReason))
	}
	if d.Count < 0 || d.Count > 1_000_000 {
		return fieldErr("data.count", fmt.Sprintf("must be between 0 (all) and 1000000, got %d", d.Count))
	}
	if d.ReleaseID != "" {
		if err := ValidateID("data.release_id", d.ReleaseID); err != nil {
			return err
		}
	}
	if len(d.By) > MaxTokenLen {
		return fieldErr("data.by", fmt.Sprintf("is longer than %d characters", MaxTokenLen))
	}
	if d.ReleasedAt.IsZero() {
		return fieldErr("data.released_at", "is required")
	}
	if d.OwnerAdmits && d.Count != 0 {
		return fieldErr("data.owner_admits", "cannot be set with data.count: an owner admits a release of every hold of the key")
	}
	if d.Pace != nil {
		if d.Count != 0 {
			return fieldErr("data.pace", "cannot be set with data.count: a paced release releases every hold of the key")
		}
		return d.Pace.Validate()
	}
	return nil
}

// ReleasedMsgID is the Nats-Msg-Id of a release:
// "<kind>-released:<hold_key>:<released_at in µs since the epoch>", so the
// same resume published twice is stored once and two resumes are two facts.
func ReleasedMsgID(kind, holdKey string, releasedAt time.Time) string {
	return kind + "-released:" + holdKey + ":" + strconv.FormatInt(releasedAt.UnixMicro(), 10)
}

// releasedMsgID is the message id of d: by its ReleaseID when it has one.
func releasedMsgID(d ReleasedData) string {
	if d.ReleaseID != "" {
		return d.Kind + "-released:" + d.HoldKey + ":" + d.ReleaseID
	}
	return ReleasedMsgID(d.Kind, d.HoldKey, d.ReleasedAt)
}

// LegacyHoldReason maps the FailedData.Reason values owners published for
// holds before the held event existed (source_throttled, source_paused,
// trigger_throttled, max_concurrency) to a hold reason, so such a failure
// in the stream, or from an owner not upgraded yet, is decided as a hold.
func LegacyHoldReason(reason string) (string, bool) {
	switch reason {
	case "source_throttled", "trigger_throttled":
		return HoldThrottle, true
	case "source_paused":
		return HoldPause, true
	case "max_concurrency":
		return HoldConcurrency, true
	}
	return "", false
}
