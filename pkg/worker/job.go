package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/retryd/retryd/pkg/contract"
)

// Handler runs one attempt of a job. Returning nil reports success;
// returning an error reports a failure whose class decides whether and when
// the scheduler retries (see Worker.Handle). ctx is cancelled when the
// job's timeout passes or the worker is forced to stop.
type Handler func(ctx context.Context, job *Job) error

// Job is one attempt of a job as a handler sees it.
type Job struct {
	// ID is the job id, the same on every attempt.
	ID string
	// Type is the job type (the subject token of jobs.<job_type>).
	Type string
	// Attempt is 1 on the first run and grows by one per retry.
	Attempt int
	// Payload is the job's input, unchanged across attempts.
	Payload json.RawMessage
	// Checkpoint is the progress recorded so far: on a retry, what the
	// failed attempt recorded with SetCheckpoint; updated by SetCheckpoint.
	// Empty on a first attempt.
	Checkpoint json.RawMessage
	// Metadata travels with the job across attempts.
	Metadata map[string]string
	// MaxRetries and RetryEnabled are the job's overrides of its type's
	// retry policy, when the job was enqueued with them.
	MaxRetries   *int
	RetryEnabled *bool
	// Timeout is the job's own timeout (its timeout_ms), zero when it runs
	// under the worker's timeout for its type. ctx ends when it passes.
	Timeout time.Duration
	// Priority is the job's band (high, normal or low), the same on every
	// attempt: a retry runs in the band the job was enqueued in.
	Priority contract.Priority

	mu sync.Mutex
}

func newJob(d contract.JobData) *Job {
	return &Job{
		ID:           d.ID,
		Type:         d.JobType,
		Attempt:      d.Attempt,
		Payload:      d.Payload,
		Checkpoint:   d.Checkpoint,
		Metadata:     d.Metadata,
		MaxRetries:   d.MaxRetries,
		RetryEnabled: d.RetryEnabled,
		Timeout:      time.Duration(d.TimeoutMS) * time.Millisecond,
		Priority:     d.Priority.Band(),
	}
}

// IdempotencyKey is "<id>:<attempt>": the same for every delivery of one
// attempt (a redelivery after a crash), different for each retry. Key
// external effects with it (or with it plus a step name) so that a job run
// twice has its effect once.
func (j *Job) IdempotencyKey() string {
	return j.ID + ":" + strconv.Itoa(j.Attempt)
}

// SetCheckpoint records progress, typically after each step of a multi-step
// job: {"step": "send_email", "done": ["fetch", "render"]}. If the attempt
// fails, the last checkpoint travels with the failure and comes back in
// Checkpoint on the retry. A "step" field shows as current_step in the jobs
// API. v is marshalled to JSON immediately; it must be at most
// contract.MaxDataBytes.
func (j *Job) SetCheckpoint(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("marshal checkpoint: %w", err)
	}
	if len(b) > contract.MaxDataBytes {
		return fmt.Errorf("set checkpoint: %w", &contract.FieldError{
			Field:  "checkpoint",
			Reason: fmt.Sprintf("is %d bytes, more than the limit of %d", len(b), contract.MaxDataBytes),
			Err:    contract.ErrTooLarge,
		})
	}
	if bytes.Equal(b, []byte("null")) {
		b = nil
	}
	j.mu.Lock()
	j.Checkpoint = b
	j.mu.Unlock()
	return nil
}

// DecodeCheckpoint unmarshals the checkpoint into v and reports whether
// there was one.
func (j *Job) DecodeCheckpoint(v any) (bool, error) {
	cp := j.checkpoint()
	if len(cp) == 0 {
		return false, nil
	}
	if err := json.Unmarshal(cp, v); err != nil {
		return true, fmt.Errorf("decode checkpoint: %w", err)
	}
	return true, nil
}

// DecodePayload unmarshals the payload into v. An empty payload leaves v
// unchanged.
func (j *Job) DecodePayload(v any) error {
	if len(j.Payload) == 0 {
		return nil
	}
	if err := json.Unmarshal(j.Payload, v); err != nil {
		return fmt.Errorf("decode payload: %w", err)
	}
	return nil
}

func (j *Job) checkpoint() json.RawMessage {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.Checkpoint
}
