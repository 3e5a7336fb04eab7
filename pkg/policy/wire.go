package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
)

// wire is a Policy in its JSON form, the public contract of the policy
// API: the retry_policies columns by name, durations in whole
// milliseconds. It is private so that Policy stays the one shape callers
// handle; MarshalJSON and the decoders below are its only users.
type wire struct {
	Kind                string                    `json:"kind"`
	JobType             string                    `json:"job_type"`
	Name                string                    `json:"name"`
	Version             int                       `json:"version"`
	MaxRetries          int                       `json:"max_retries"`
	BaseDelayMS         int64                     `json:"base_delay_ms"`
	Multiplier          float64                   `json:"multiplier"`
	MaxDelayMS          int64                     `json:"max_delay_ms"`
	Jitter              backoff.Jitter            `json:"jitter"`
	JitterMS            int64                     `json:"jitter_ms"`
	RetryableClasses    []errclass.Class          `json:"retryable_classes"`
	NonRetryableClasses []errclass.Class          `json:"non_retryable_classes"`
	Enabled             bool                      `json:"enabled"`
	MaxHoldMS           int64                     `json:"max_hold_ms"`
	MaxRetryAfterMS     int64                     `json:"max_retry_after_ms"`
	ClassBackoff        map[string]ClassBackoffMS `json:"class_backoff"`
	UpdatedBy           string                    `json:"updated_by"`
	CreatedAt           time.Time                 `json:"created_at"`
	UpdatedAt           time.Time                 `json:"updated_at"`
}

func (p Policy) wire() wire {
	b := p.Backoff
	return wire{
		Kind: p.Kind, JobType: p.JobType, Name: p.Name, Version: p.Version, MaxRetries: p.MaxRetries,
		BaseDelayMS: b.Base.Milliseconds(), Multiplier: b.Multiplier, MaxDelayMS: b.Max.Milliseconds(),
		Jitter: b.Jitter, JitterMS: b.JitterMax.Milliseconds(),
		// Empty lists and objects rather than null, as the API always sent.
		RetryableClasses:    nonNil(p.RetryableClasses),
		NonRetryableClasses: nonNil(p.NonRetryableClasses),
		Enabled:             p.Enabled, MaxHoldMS: p.MaxHold.Milliseconds(), MaxRetryAfterMS: p.MaxRetryAfter.Milliseconds(),
		ClassBackoff: ClassBackoffsToMS(p.ClassBackoff),
		UpdatedBy:    p.UpdatedBy, CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt,
	}
}

func (w wire) policy() Policy {
	return Policy{
		Kind: w.Kind, JobType: w.JobType, Name: w.Name, Version: w.Version, MaxRetries: w.MaxRetries,
		Backoff: backoff.Config{
			Base: FromMS(w.BaseDelayMS), Max: FromMS(w.MaxDelayMS), Multiplier: w.Multiplier,
			Jitter: w.Jitter, JitterMax: FromMS(w.JitterMS),
		},
		RetryableClasses:    noClasses(w.RetryableClasses),
		NonRetryableClasses: noClasses(w.NonRetryableClasses),
		Enabled:             w.Enabled, MaxHold: FromMS(w.MaxHoldMS), MaxRetryAfter: FromMS(w.MaxRetryAfterMS),
		ClassBackoff: ClassBackoffsFromMS(w.ClassBackoff),
		UpdatedBy:    w.UpdatedBy, CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt,
	}
}

// MarshalJSON writes the policy in the API's JSON form: the
// retry_policies columns by name, durations in whole milliseconds
// (docs/scheduler.md, "The API").
func (p Policy) MarshalJSON() ([]byte, error) {
	return json.Marshal(p.wire())
}

// UnmarshalJSON reads the JSON form over p: fields the JSON leaves out keep
// p's values, so a caller can preset defaults. Unknown fields are ignored,
// so a client keeps reading the answers of a newer server; DecodeBody
// refuses them.
func (p *Policy) UnmarshalJSON(data []byte) error {
	w := p.wire()
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*p = w.policy()
	return nil
}

// DecodeBody reads a request body in the JSON form over p, as
// UnmarshalJSON does, but strictly: an unknown field is an error rather
// than a silently ignored typo, and so is a string Postgres cannot store.
// It returns the names of the fields the body set (null counts as left
// out), so that the caller can require some. Errors are encoding/json's
// or *contract.FieldError wrapping contract.ErrInvalid.
func DecodeBody(data []byte, p *Policy) (set []string, err error) {
	w := p.wire()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return nil, err
	}
	if err := contract.CheckStorable("", &w); err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, fmt.Errorf("read policy fields: %w", err)
	}
	maps.DeleteFunc(fields, func(_ string, v json.RawMessage) bool { return string(v) == "null" })
	*p = w.policy()
	return slices.Sorted(maps.Keys(fields)), nil
}

// FromMS is ms milliseconds as a Duration, saturated so that a figure too
// large for a Duration stays too large (and fails Validate) instead of
// wrapping around to a plausible one.
func FromMS(ms int64) time.Duration {
	const limit = int64(1<<63-1) / int64(time.Millisecond)
	switch {
	case ms > limit:
		return 1<<63 - 1
	case ms < -limit:
		return -1 << 63
	}
	return time.Duration(ms) * time.Millisecond
}

// noClasses is classes, or nil when there are none, so that a policy
// read from JSON or the database compares equal to one written in Go.
func noClasses(classes []errclass.Class) []errclass.Class {
	if len(classes) == 0 {
		return nil
	}
	return classes
}

func nonNil(classes []errclass.Class) []errclass.Class {
	if classes == nil {
		return []errclass.Class{}
	}
	return classes
}
