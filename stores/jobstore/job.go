package jobstore

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
)

// Status is a job's status. The names are the ones job-queue users already
// know (in_progress, retrying, failed_max_retries), so they are kept.
type Status string

// Job statuses.
const (
	// StatusInProgress: an attempt is queued or running, or its failure is
	// being decided on.
	StatusInProgress Status = "in_progress"
	// StatusCompleted: an attempt succeeded.
	StatusCompleted Status = "completed"
	// StatusFailed: a non-retryable error, or retries disabled.
	StatusFailed Status = "failed"
	// StatusRetrying: a retry is scheduled at NextRetryAt.
	StatusRetrying Status = "retrying"
	// StatusHeld: the worker held the job back (a throttle, a pause, max
	// concurrency). No retry was used; NextRetryAt is when the hold lifts
	// by itself, if it does, and StatusReason says why it is held.
	StatusHeld Status = "held"
	// StatusFailedMaxRetries: the retry budget is spent.
	StatusFailedMaxRetries Status = "failed_max_retries"
	// StatusCancelled: an operator cancelled the job's retries.
	StatusCancelled Status = "cancelled"
)

// Statuses lists every status.
var Statuses = []Status{StatusInProgress, StatusCompleted, StatusFailed, StatusRetrying, StatusHeld, StatusFailedMaxRetries, StatusCancelled}

// Valid reports whether s is a known status.
func (s Status) Valid() bool {
	for _, v := range Statuses {
		if v == s {
			return true
		}
	}
	return false
}

// Job is a row of the jobs table.
type Job struct {
	ID      string `json:"id"`
	JobType string `json:"job_type"`
	Status  Status `json:"status"`
	// Priority is the job's band: high, normal or low (migration 00404).
	Priority string `json:"priority"`
	// Attempt is the latest attempt seen (1-based).
	Attempt int `json:"attempt"`
	// RetryCount is how many retries the job used, as the scheduler counts
	// them against MaxRetries.
	RetryCount int `json:"retry_count"`
	// MaxRetries is the job's budget: its override, the scheduler's last
	// decision or, before any, its type's policy.
	MaxRetries   *int   `json:"max_retries"`
	RetryEnabled bool   `json:"retry_enabled"`
	CurrentStep  string `json:"current_step,omitempty"`
	// Checkpoint is the latest progress the worker recorded.
	Checkpoint         json.RawMessage `json:"checkpoint,omitempty"`
	LastErrorMessage   string          `json:"last_error_message,omitempty"`
	LastErrorClass     string          `json:"last_error_class,omitempty"`
	LastErrorTimestamp *time.Time      `json:"last_error_timestamp,omitempty"`
	LastAttemptAt      *time.Time      `json:"last_attempt_at,omitempty"`
	NextRetryAt        *time.Time      `json:"next_retry_at,omitempty"`
	// StatusReason says why a job failed (non_retryable, retries_disabled,
	// max_retries) or who cancelled it.
	StatusReason string     `json:"status_reason,omitempty"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
	CompletedAt  *time.Time `json:"completed_at,omitempty"`
}

const jobColumns = `job_id, job_type, status, attempt, retry_count, max_retries, retry_enabled,
	current_step, checkpoint, last_error_message, last_error_class, last_error_timestamp,
	last_attempt_at, next_retry_at, status_reason, created_at, updated_at, completed_at, priority`

func scanJob(row pgx.Row) (Job, error) {
	var j Job
	var status string
	err := row.Scan(&j.ID, &j.JobType, &status, &j.Attempt, &j.RetryCount, &j.MaxRetries, &j.RetryEnabled,
		&j.CurrentStep, (*[]byte)(&j.Checkpoint), &j.LastErrorMessage, &j.LastErrorClass, &j.LastErrorTimestamp,
		&j.LastAttemptAt, &j.NextRetryAt, &j.StatusReason, &j.CreatedAt, &j.UpdatedAt, &j.CompletedAt, &j.Priority)
	j.Status = Status(status)
	return j, err
}

// Get returns one job, or pgdb.ErrNotFound.
func Get(ctx context.Context, q Querier, id string) (Job, error) {
	return pgrows.One(ctx, q, "get job "+id, scanJob, `SELECT `+jobColumns+` FROM jobs WHERE job_id = $1`, id)
}
