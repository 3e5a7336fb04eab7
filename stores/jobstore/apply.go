package jobstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"
	"unicode/utf8"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/pgtext"
)

// Ranks of facts within one attempt; see the package documentation.
const (
	rankScheduled   = 1
	rankJob         = 2
	rankFailed      = 3
	rankFinished    = 4
	rankCancelled   = 5
	ranksPerAttempt = 8
)

// maxStepLen bounds current_step.
const maxStepLen = 256

func position(attempt, rank int) int64 { return int64(attempt)*ranksPerAttempt + int64(rank) }

// fact is one change to a job row. Pointer fields left nil leave the
// column alone.
type fact struct {
	jobID   string
	jobType string
	attempt int
	seq     int64
	status  Status
	at      time.Time

	retryCount   *int
	maxRetries   *int
	retryEnabled *bool
	// checkpoint is set when the fact carries one; step is its "step".
	checkpoint json.RawMessage
	step       *string

	// decision marks the scheduler's decisions (scheduled, exhausted),
	// which own retry_count and max_retries.
	decision bool

	hasError   bool
	errClass   string
	errMessage string

	lastAttemptAt *time.Time
	nextRetryAt   *time.Time
	statusReason  string
	completedAt   *time.Time
	// priority is the job's band when the fact says (a job message always
	// does: none is normal); nil leaves the column alone.
	priority *string
}

// The upsert. A new row takes the fact as is, with max_retries and
// retry_enabled from the job type's policy unless the fact has them. On an
// existing row each group of columns changes only for a fact newer than
// the one that last set it (see the migration 00400 comment), so the row
// ends the same whatever order the facts arrive in.
//
// $1 job_id, $2 job_type, $3 status, $4 attempt, $5 seq, $6 retry_count,
// $7 max_retries, $8 retry_enabled, $9 current_step, $10 checkpoint,
// $11 has error, $12 error message, $13 error class, $14 fact time,
// $15 last_attempt_at, $16 next_retry_at, $17 status_reason,
// $18 completed_at, $19 is a decision (scheduled, exhausted),
// $20 priority (NULL: leave it; a new row is normal).
const upsertSQL = `
INSERT INTO jobs AS j (job_id, job_type, status, attempt, state_seq, decision_seq, checkpoint_seq,
	last_error_seq, retry_count, max_retries, retry_enabled, current_step, checkpoint,
	last_error_message, last_error_class, last_error_timestamp, last_attempt_at, next_retry_at,
	status_reason, created_at, updated_at, completed_at, priority)
SELECT $1, $2, $3, $4, $5::bigint,
	CASE WHEN $19::bool THEN $5::bigint ELSE 0 END,
	CASE WHEN $10::json IS NULL THEN 0 ELSE $5::bigint END,
	CASE WHEN $11::bool THEN $5::bigint ELSE 0 END,
	COALESCE($6::int, 0), COALESCE($7::int, p.max_retries), COALESCE($8::bool, p.enabled, true),
	COALESCE($9::text, ''), $10::json,
	CASE WHEN $11::bool THEN $12 ELSE '' END, CASE WHEN $11::bool THEN $13 ELSE '' END,
	CASE WHEN $11::bool THEN $14::timestamptz END,
	$15::timestamptz, $16::timestamptz, $17, $14::timestamptz, now(), $18::timestamptz,
	COALESCE($20::text, 'normal')
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
	SELECT max_retries, enabled FROM retry_policies
	WHERE kind IN ('job', '*') AND job_type IN ($2, '')
	ORDER BY (job_type <> '') DESC, (kind = 'job') DESC LIMIT 1
) AS p ON true
ON CONFLICT (job_id) DO UPDATE SET
	job_type = CASE WHEN j.job_type = '' THEN EXCLUDED.job_type ELSE j.job_type END,
	priority = COALESCE($20::text, j.priority),
	attempt = GREATEST(j.attempt, EXCLUDED.attempt),
	created_at = LEAST(j.created_at, EXCLUDED.created_at),
	last_attempt_at = GREATEST(j.last_attempt_at, EXCLUDED.last_attempt_at),
	updated_at = now(),

	status = CASE WHEN $5::bigint > j.state_seq THEN EXCLUDED.status ELSE j.status END,
	next_retry_at = CASE WHEN $5::bigint > j.state_seq THEN EXCLUDED.next_retry_at ELSE j.next_retry_at END,
	status_reason = CASE WHEN $5::bigint > j.state_seq THEN EXCLUDED.status_reason ELSE j.status_reason END,
	completed_at = CASE WHEN $5::bigint > j.state_seq THEN EXCLUDED.completed_at ELSE j.completed_at END,
	state_seq = GREATEST(j.state_seq, $5::bigint),

	retry_count = CASE WHEN $6::int IS NOT NULL AND $5::bigint > j.decision_seq THEN $6::int ELSE j.retry_count END,
	max_retries = CASE WHEN $7::int IS NOT NULL AND $5::bigint > j.decision_seq THEN $7::int ELSE j.max_retries END,
	retry_enabled = CASE WHEN $8::bool IS NOT NULL AND $5::bigint > j.decision_seq THEN $8::bool ELSE j.retry_enabled END,
	decision_seq = CASE WHEN $19::bool THEN GREATEST(j.decision_seq, $5::bigint) ELSE j.decision_seq END,

	current_step = CASE WHEN $10::json IS NOT NULL AND $5::bigint > j.checkpoint_seq THEN EXCLUDED.current_step ELSE j.current_step END,
	checkpoint = CASE WHEN $10::json IS NOT NULL AND $5::bigint > j.checkpoint_seq THEN $10::json ELSE j.checkpoint END,
	checkpoint_seq = CASE WHEN $10::json IS NOT NULL THEN GREATEST(j.checkpoint_seq, $5::bigint) ELSE j.checkpoint_seq END,

	last_error_message = CASE WHEN $11::bool AND $5::bigint > j.last_error_seq THEN $12 ELSE j.last_error_message END,
	last_error_class = CASE WHEN $11::bool AND $5::bigint > j.last_error_seq THEN $13 ELSE j.last_error_class END,
	last_error_timestamp = CASE WHEN $11::bool AND $5::bigint > j.last_error_seq THEN $14::timestamptz ELSE j.last_error_timestamp END,
	last_error_seq = CASE WHEN $11::bool THEN GREATEST(j.last_error_seq, $5::bigint) ELSE j.last_error_seq END`

func (f fact) apply(ctx context.Context, q Querier) error {
	var cp any
	if len(f.checkpoint) > 0 {
		cp = string(f.checkpoint)
	}
	var step *string
	if f.step != nil {
		s := pgtext.Clean(*f.step)
		step = &s
	}
	// Messages, reasons and steps come from producers' errors and
	// checkpoints, the counts from the scheduler's decision: keep them
	// storable, or the fact would fail (and stall the projection) forever.
	_, err := q.Exec(ctx, upsertSQL,
		f.jobID, f.jobType, string(f.status), f.attempt, f.seq, int4(f.retryCount), int4(f.maxRetries),
		f.retryEnabled, step, cp, f.hasError, pgtext.Clean(f.errMessage), pgtext.Clean(f.errClass),
		f.at, f.lastAttemptAt, f.nextRetryAt, pgtext.Clean(f.statusReason), f.completedAt, f.decision, f.priority)
	if err != nil {
		return fmt.Errorf("apply %s fact to job %s: %w", f.status, f.jobID, err)
	}
	return nil
}

// int4 clamps a count to the range of the integer columns.
func int4(n *int) *int {
	if n == nil {
		return nil
	}
	v := min(max(*n, 0), math.MaxInt32)
	return &v
}

// ApplyJob folds a job message (jobs.<job_type>): attempt d.Attempt is
// queued, the job is in progress. at is the message's time.
func ApplyJob(ctx context.Context, q Querier, d contract.JobData, at time.Time) error {
	at = at.UTC()
	f := fact{
		jobID: d.ID, jobType: d.JobType, attempt: d.Attempt, seq: position(d.Attempt, rankJob),
		status: StatusInProgress, at: at, lastAttemptAt: &at,
		maxRetries: d.MaxRetries, retryEnabled: d.RetryEnabled,
	}
	f.setPriority(d.Priority.Band())
	f.setCheckpoint(d.Checkpoint)
	return f.apply(ctx, q)
}

// ApplyLifecycle folds a retry.job.<event>.<id> fact. Due events change
// nothing (the job message routed from them does); other kinds are
// ignored.
func ApplyLifecycle(ctx context.Context, q Querier, ev contract.LifecycleEvent) error {
	if ev.Kind != contract.KindJob {
		return nil
	}
	at := ev.Envelope.Time.UTC()
	f := fact{jobID: ev.ID, at: at}
	switch {
	case ev.Failed != nil:
		d := ev.Failed
		f.jobType, f.attempt, f.seq, f.status = d.JobType, d.Attempt, position(d.Attempt, rankFailed), StatusInProgress
		f.maxRetries, f.retryEnabled = d.MaxRetries, d.RetryEnabled
		f.hasError, f.errClass, f.errMessage = true, d.Error.Class, d.Error.Message
		f.setPriority(d.Priority)
		f.setCheckpoint(d.Checkpoint)
	case ev.Held != nil:
		// A hold takes the place of the attempt's outcome, as a failure
		// would, but records no error: nothing failed.
		d := ev.Held
		f.jobType, f.attempt, f.seq, f.status = d.JobType, d.Attempt, position(d.Attempt, rankFailed), StatusHeld
		f.statusReason = heldReason(d.Reason, d.Detail)
		f.setPriority(d.Priority)
		if d.Until != nil {
			until := d.Until.UTC()
			f.nextRetryAt = &until
		}
		f.setCheckpoint(d.Checkpoint)
	case ev.Scheduled != nil:
		d := ev.Scheduled
		next := d.NextAttemptAt.UTC()
		f.jobType, f.attempt, f.seq, f.status = d.JobType, d.Attempt, position(d.Attempt, rankScheduled), StatusRetrying
		f.nextRetryAt, f.decision = &next, true
		if d.Decision.HoldReason != "" {
			// The scheduler's decision for a hold: still held, until then.
			f.status, f.statusReason = StatusHeld, heldReason(d.Decision.HoldReason, d.Decision.Note)
		}
		rc, mr := d.Decision.RetryCount, d.Decision.MaxRetries
		f.retryCount, f.maxRetries = &rc, &mr
	case ev.Succeeded != nil:
		d := ev.Succeeded
		f.attempt, f.seq, f.status = d.Attempt, position(d.Attempt, rankFinished), StatusCompleted
		f.completedAt = &at
	case ev.Exhausted != nil:
		d := ev.Exhausted
		f.jobType, f.attempt, f.seq = d.JobType, d.Attempt, position(d.Attempt, rankFinished)
		f.status, f.statusReason, f.decision = StatusFailed, d.Reason, true
		if d.Reason == contract.ExhaustedMaxRetries {
			f.status = StatusFailedMaxRetries
		}
		rc, mr := d.RetryCount, d.MaxRetries
		f.retryCount, f.maxRetries = &rc, &mr
		if d.Reason == contract.ExhaustedRetriesDisabled {
			f.retryEnabled = new(bool)
		}
		if d.Error.Message != "" || d.Error.Class != "" {
			f.hasError, f.errClass, f.errMessage = true, d.Error.Class, d.Error.Message
		}
	case ev.Cancelled != nil:
		d := ev.Cancelled
		f.attempt, f.seq, f.status = max(d.Attempt, 1), position(max(d.Attempt, 1), rankCancelled), StatusCancelled
		f.statusReason = "cancelled by " + d.By
		if d.Reason != "" {
			f.statusReason += ": " + d.Reason
		}
	default:
		return nil
	}
	return f.apply(ctx, q)
}

// setPriority records a band the fact names; an empty one (an owner that
// does not send it) leaves the row's.
func (f *fact) setPriority(p contract.Priority) {
	if p == "" {
		return
	}
	s := string(p)
	f.priority = &s
}

// heldReason is a held job's status_reason: "held: <reason>", then the
// worker's or the decision's detail when there is one.
func heldReason(reason, detail string) string {
	r := "held: " + reason
	if detail != "" {
		r += ": " + detail
	}
	return r
}

// setCheckpoint records a checkpoint and its "step" field: a string as
// is, a number or boolean as written.
func (f *fact) setCheckpoint(cp json.RawMessage) {
	if len(cp) == 0 || bytes.Equal(cp, []byte("null")) {
		return
	}
	f.checkpoint = cp
	var fields map[string]json.RawMessage
	if json.Unmarshal(cp, &fields) != nil {
		return
	}
	raw, ok := fields["step"]
	if !ok {
		return
	}
	var step string
	switch {
	case json.Unmarshal(raw, &step) == nil:
	case len(raw) > 0 && raw[0] != '{' && raw[0] != '[' && string(raw) != "null":
		step = string(raw)
	default:
		return
	}
	if len(step) > maxStepLen {
		n := maxStepLen
		for n > 0 && !utf8.RuneStart(step[n]) {
			n--
		}
		step = step[:n]
	}
	f.step = &step
}
