package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
)

// EnqueueSource is the CloudEvents source of the jobs POST /v1/jobs
// publishes.
const EnqueueSource = "retryd/jobs-api"

// Limits of POST /v1/jobs.
const (
	// MaxRunAhead is how far ahead run_at may be.
	MaxRunAhead = 366 * 24 * time.Hour
	// MaxUniqueFor is the longest unique_for.
	MaxUniqueFor = 90 * 24 * time.Hour
	// MaxIdempotencyKeyLen bounds the Idempotency-Key header.
	MaxIdempotencyKeyLen = 255
)

// HeaderIdempotencyKey names a request: the same key and job type always
// make the same job id, so a client that retries its request enqueues
// one job.
const HeaderIdempotencyKey = "Idempotency-Key"

// JobFields are what a client sets of a job it enqueues or schedules:
// contract.JobData less the id, the type (named elsewhere) and what only
// retries carry (attempt, checkpoint).
type JobFields struct {
	Priority     contract.Priority `json:"priority,omitempty"`
	Payload      json.RawMessage   `json:"payload,omitempty"`
	MaxRetries   *int              `json:"max_retries,omitempty"`
	RetryEnabled *bool             `json:"retry_enabled,omitempty"`
	TimeoutMS    int64             `json:"timeout_ms,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
}

// firstRun is the first attempt of the job id of jobType with f.
func (f JobFields) firstRun(id, jobType string) contract.JobData {
	return contract.JobData{
		ID: id, JobType: jobType, Attempt: 1, Priority: f.Priority, Payload: f.Payload,
		MaxRetries: f.MaxRetries, RetryEnabled: f.RetryEnabled, TimeoutMS: f.TimeoutMS, Metadata: f.Metadata,
	}
}

func jobFieldsOf(d contract.JobData) JobFields {
	return JobFields{Priority: d.Priority, Payload: d.Payload, MaxRetries: d.MaxRetries,
		RetryEnabled: d.RetryEnabled, TimeoutMS: d.TimeoutMS, Metadata: d.Metadata}
}

// EnqueueRequest is the body of POST /v1/jobs: a job, when to run it
// first, and for how long its id stays unique.
type EnqueueRequest struct {
	// ID names the job; without it the job's id comes from the
	// Idempotency-Key header, or is a new ULID.
	ID      string `json:"id,omitempty"`
	JobType string `json:"job_type"`
	JobFields
	// RunAt delays the first run: a JetStream message schedule fires it
	// then. Empty or past runs it now.
	RunAt *time.Time `json:"run_at,omitempty"`
	// UniqueFor (a Go duration such as "24h") refuses a second job with
	// this id while the first is younger than that, beyond the streams'
	// 2-minute duplicate window.
	UniqueFor string `json:"unique_for,omitempty"`
}

// EnqueueResponse answers POST /v1/jobs: 202 for a new job, 200 when the
// job already exists (duplicate).
type EnqueueResponse struct {
	ID      string `json:"id"`
	JobType string `json:"job_type"`
	// Subject is where the job was published: jobs.<job_type>[.<band>],
	// or delayed.<job_type>.<id> on SCHEDULES for a delayed one.
	Subject   string     `json:"subject"`
	RunAt     *time.Time `json:"run_at,omitempty"`
	Duplicate bool       `json:"duplicate"`
}

func (a *API) handleEnqueue(w http.ResponseWriter, r *http.Request) {
	var req EnqueueRequest
	if err := serve.DecodeJSON(r, a.cfg.MaxBodyBytes, &req); err != nil {
		serve.WriteError(w, err)
		return
	}
	job, uniqueFor, err := req.job(r.Header.Get(HeaderIdempotencyKey))
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	now := a.cfg.Now()
	resp := EnqueueResponse{ID: job.ID, JobType: job.JobType, Subject: contract.JobSubjectFor(job.JobType, job.Priority)}
	if req.RunAt != nil && req.RunAt.After(now) {
		if req.RunAt.Sub(now) > MaxRunAhead {
			serve.WriteError(w, invalid("run_at", fmt.Sprintf("is more than %s ahead", MaxRunAhead)))
			return
		}
		at := req.RunAt.UTC()
		resp.RunAt, resp.Subject = &at, contract.DelayedSubject(job.JobType, job.ID)
	}
	if uniqueFor > 0 {
		exists, err := a.jobWithin(r.Context(), job.ID, now.Add(-uniqueFor))
		if err != nil {
			a.writeErr(w, r, err)
			return
		}
		if exists {
			resp.Duplicate = true
			serve.WriteJSON(w, http.StatusOK, resp)
			return
		}
	}
	resp.Duplicate, err = a.publishJob(r.Context(), job, resp.RunAt, now)
	if err != nil {
		if errors.Is(err, contract.ErrInvalid) {
			serve.WriteError(w, err)
			return
		}
		a.writeErr(w, r, err)
		return
	}
	if !resp.Duplicate {
		a.log.Info().Str("job_id", job.ID).Str("job_type", job.JobType).Bool("delayed", resp.RunAt != nil).Msg("job enqueued")
	}
	status := http.StatusAccepted
	if resp.Duplicate {
		status = http.StatusOK
	}
	serve.WriteJSON(w, status, resp)
}

// job checks the request and builds its first attempt.
func (req EnqueueRequest) job(idempotencyKey string) (contract.JobData, time.Duration, error) {
	job := req.firstRun(req.ID, req.JobType)
	if err := contract.ValidateToken("job_type", req.JobType); err != nil {
		return job, 0, err
	}
	switch {
	case len(idempotencyKey) > MaxIdempotencyKeyLen:
		return job, 0, invalid(HeaderIdempotencyKey, fmt.Sprintf("is %d bytes, more than %d", len(idempotencyKey), MaxIdempotencyKeyLen))
	case idempotencyKey != "" && req.ID != "":
		return job, 0, invalid(HeaderIdempotencyKey, "give either an id or an Idempotency-Key: both name the job")
	case idempotencyKey != "":
		job.ID = IdempotentJobID(req.JobType, idempotencyKey)
	case req.ID == "":
		job.ID = contract.NewID()
	}
	var uniqueFor time.Duration
	if req.UniqueFor != "" {
		d, err := time.ParseDuration(req.UniqueFor)
		if err != nil || d <= 0 || d > MaxUniqueFor {
			return job, 0, invalid("unique_for", fmt.Sprintf("must be a duration between 1s and %s, such as \"24h\", got %q", MaxUniqueFor, req.UniqueFor))
		}
		uniqueFor = d
	}
	if err := job.Validate(); err != nil {
		return job, 0, err
	}
	return job, uniqueFor, nil
}

// IdempotentJobID is the id of the job a request with an Idempotency-Key
// enqueues: a hash of the job type and the key, so the same request made
// again names the same job.
func IdempotentJobID(jobType, key string) string {
	sum := sha256.Sum256([]byte(jobType + "\x00" + key))
	return "idem-" + hex.EncodeToString(sum[:20])
}

// jobWithin reports whether the jobs projection holds job id created
// since since.
func (a *API) jobWithin(ctx context.Context, id string, since time.Time) (bool, error) {
	var created time.Time
	err := a.cfg.Pool.QueryRow(ctx, `SELECT created_at FROM jobs WHERE job_id = $1`, id).Scan(&created)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up job %s: %w", id, err)
	}
	return !created.Before(since), nil
}

// publishJob publishes the job's first attempt now, or its delayed first
// run as a one-shot schedule, and reports whether the stream already had
// it: the same Nats-Msg-Id within the duplicate window, or, delayed, a
// schedule still waiting on its subject.
func (a *API) publishJob(ctx context.Context, job contract.JobData, runAt *time.Time, now time.Time) (bool, error) {
	if runAt == nil {
		msg, err := contract.NewJobMsg(EnqueueSource, job, now)
		if err != nil {
			return false, err
		}
		ack, err := a.cfg.JS.PublishMsg(ctx, msg)
		if err != nil {
			return false, fmt.Errorf("publish job %s: %w", job.ID, err)
		}
		return ack.Duplicate, nil
	}
	msg, err := contract.NewDelayedJobMsg(EnqueueSource, job, *runAt, now)
	if err != nil {
		return false, err
	}
	ack, err := a.cfg.JS.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(0))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("publish delayed job %s: %w", job.ID, err)
	}
	return ack.Duplicate, nil
}
