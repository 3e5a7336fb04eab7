package contract

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// JobData is a unit of work on jobs.<job_type> (normal priority) or
// jobs.<job_type>.<band> (high, low). A first run has Attempt 1 and no
// checkpoint; a retry (routed from retry.job.due.<id>) carries the attempt
// number and the checkpoint of the last failure, so a multi-step job
// resumes where it stopped, and the job's priority.
type JobData struct {
	ID      string `json:"id"`
	JobType string `json:"job_type"`
	Attempt int    `json:"attempt"`
	// Priority is the job's band: high, normal or low; empty is normal.
	// It decides the subject (JobSubjectFor) and must match it.
	Priority     Priority          `json:"priority,omitempty"`
	Payload      json.RawMessage   `json:"payload,omitempty"`
	Checkpoint   json.RawMessage   `json:"checkpoint,omitempty"`
	MaxRetries   *int              `json:"max_retries,omitempty"`
	RetryEnabled *bool             `json:"retry_enabled,omitempty"`
	TimeoutMS    int64             `json:"timeout_ms,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
}

// MaxTimeoutMS is the longest timeout_ms a job may ask for: 24 hours.
const MaxTimeoutMS = int64(24 * time.Hour / time.Millisecond)

// validateWork checks what an item carries so that its owner can run it
// again: its priority band, the job's overrides, its payload and
// checkpoint, its metadata. Jobs, failures, holds and dues all carry it.
func validateWork(priority Priority, maxRetries *int, timeoutMS int64, payload, checkpoint json.RawMessage, metadata map[string]string) error {
	if err := ValidatePriority("data.priority", priority); err != nil {
		return err
	}
	if err := validateOverrides(maxRetries, timeoutMS); err != nil {
		return err
	}
	if err := checkRaw("data.payload", payload); err != nil {
		return err
	}
	if err := checkRaw("data.checkpoint", checkpoint); err != nil {
		return err
	}
	return validateMetadata(metadata)
}

// validateOverrides checks a job's overrides of its policy and timeout,
// which ride on jobs, failed, held and due events alike.
func validateOverrides(maxRetries *int, timeoutMS int64) error {
	if maxRetries != nil && (*maxRetries < 0 || *maxRetries > 1000) {
		return fieldErr("data.max_retries", fmt.Sprintf("must be between 0 and 1000, got %d", *maxRetries))
	}
	if timeoutMS < 0 || timeoutMS > MaxTimeoutMS {
		return fieldErr("data.timeout_ms", "must be between 0 and 24 hours")
	}
	return nil
}

// JobMsgID is the Nats-Msg-Id of a job message. The first run uses
// "job:<id>:1"; runs routed from a due event reuse the due's id
// ("job-retry:<id>:<attempt>") so a due routed twice runs once.
func JobMsgID(id string, attempt int) string {
	if attempt <= 1 {
		return "job:" + id + ":1"
	}
	return DueMsgID(KindJob, id, attempt)
}

// Validate checks a job.
func (d JobData) Validate() error {
	if err := ValidateID("data.id", d.ID); err != nil {
		return err
	}
	if err := ValidateToken("data.job_type", d.JobType); err != nil {
		return err
	}
	if err := ValidateAttempt("data.attempt", d.Attempt); err != nil {
		return err
	}
	return validateWork(d.Priority, d.MaxRetries, d.TimeoutMS, d.Payload, d.Checkpoint, d.Metadata)
}

// NewJobMsg builds the message for jobs.<job_type>, or
// jobs.<job_type>.<band> for a high or low priority job.
func NewJobMsg(source string, d JobData, now time.Time) (*nats.Msg, error) {
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("build job: %w", err)
	}
	raw, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("marshal job: %w", err)
	}
	msg, err := newEnvelopeMsg(JobSubjectFor(d.JobType, d.Priority), JobMsgID(d.ID, d.Attempt), source, "job.requested", raw, now)
	if err != nil {
		return nil, err
	}
	msg.Header.Set(HeaderKind, KindJob)
	msg.Header.Set(HeaderItemID, d.ID)
	msg.Header.Set(HeaderAttempt, strconv.Itoa(d.Attempt))
	if err := checkMsgSize(msg); err != nil {
		return nil, fmt.Errorf("build job: %w", err)
	}
	return msg, nil
}

// DecodeJob strictly decodes a jobs.<job_type> or jobs.<job_type>.<band>
// message. The job's priority must be the subject's band (no priority and
// normal both belong on jobs.<job_type>).
func DecodeJob(subject string, body []byte) (Envelope, JobData, error) {
	var d JobData
	env, err := decodeTyped(subject, body, &d, func() error {
		jt, band, err := ParseJobSubjectBand(subject)
		if err != nil {
			return err
		}
		if jt != d.JobType {
			return fieldErr("data.job_type", fmt.Sprintf("%q does not match subject job type %q", d.JobType, jt))
		}
		if err := d.Validate(); err != nil {
			return err
		}
		if d.Priority.Band() != band {
			return fieldErr("data.priority", fmt.Sprintf("%q does not match the subject's band %q (%s)", d.Priority.Band(), band, JobSubjectFor(jt, d.Priority)))
		}
		return nil
	})
	return env, d, err
}
