package triggerstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/pgtext"
)

// RunFailure is a failed attempt of a run, as its executor or the lease
// loop reported it.
type RunFailure struct {
	Attempt  int
	Class    string
	Message  string
	Node     string
	Executor string
}

// FailRun moves a run whose attempt failed to retrying: it keeps its
// concurrency slot while the scheduler decides, and its error is
// recorded. A run whose retries an operator cancelled while the attempt
// ran (retry_enabled false) ends failed instead, and the caller frees its
// slot. Only the attempt in flight can fail (changed is false for a stale
// or repeated report, or a run that ended); pgdb.ErrNotFound means retryd did
// not launch it.
func FailRun(ctx context.Context, db DB, id string, f RunFailure) (r Run, changed bool, err error) {
	msg := pgtext.Clean(pgtext.Truncate(f.Message, maxRunError))
	errText := "run failed"
	if f.Class != "" {
		errText += ": " + f.Class
	}
	r, err = scanRun(db.QueryRow(ctx, `
		UPDATE workflow_runs
		SET status = CASE WHEN retry_enabled THEN 'retrying' ELSE 'failed' END,
		    finished_at = CASE WHEN retry_enabled THEN NULL ELSE now() END,
		    error = $3, last_error_class = $4, last_error_message = $5,
		    last_error_timestamp = now(), current_node_id = CASE WHEN $6 = '' THEN current_node_id ELSE $6 END,
		    executor = CASE WHEN $7 = '' THEN executor ELSE $7 END, next_retry_at = NULL, updated_at = now()
		WHERE run_id = $1 AND attempt = $2 AND status IN `+leasedStatuses+`
		RETURNING `+runColumns, id, max(f.Attempt, 1), errText, f.Class, msg, f.Node, pgtext.Truncate(f.Executor, 128)))
	return updatedOrCurrent(r, err, "fail run", func() (Run, error) { return GetRun(ctx, db, id) })
}

// CompleteRun marks a run that has not ended completed. A completion is
// taken from any attempt: the work is done even if the lease loop gave
// the attempt up and a retry is pending. retried says whether the run has
// a retry the scheduler must close.
func CompleteRun(ctx context.Context, db DB, id, executor string) (r Run, changed bool, err error) {
	r, err = scanRun(db.QueryRow(ctx, `
		UPDATE workflow_runs
		SET status = 'completed', error = '', next_retry_at = NULL, finished_at = now(), updated_at = now(),
		    executor = CASE WHEN $2 = '' THEN executor ELSE $2 END
		WHERE run_id = $1 AND status IN `+inFlightStatuses+`
		RETURNING `+runColumns, id, pgtext.Truncate(executor, 128)))
	return updatedOrCurrent(r, err, "complete run", func() (Run, error) { return GetRun(ctx, db, id) })
}

// Retried reports whether the scheduler holds a retry of the run: it
// failed at least once.
func (r Run) Retried() bool { return r.Attempt > 1 || r.LastErrorTimestamp != nil }

// ScheduleRunRetry records the scheduler's decision to retry attempt at
// next: the run and its failed nodes show when it comes back.
func ScheduleRunRetry(ctx context.Context, db DB, id string, attempt int, next time.Time, retryCount int, maxRetries *int, meta map[string]any) (bool, error) {
	tag, err := db.Exec(ctx, `
		UPDATE workflow_runs SET next_retry_at = $3, retry_count = $4, max_retries = $5, updated_at = now()
		WHERE run_id = $1 AND attempt = $2 AND status = 'retrying'`, id, attempt, next, retryCount, maxRetries)
	if err != nil {
		return false, fmt.Errorf("schedule run retry: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	raw, err := json.Marshal(meta)
	if err != nil {
		return false, fmt.Errorf("schedule run retry: %w", err)
	}
	if _, err := db.Exec(ctx, `
		UPDATE workflow_run_steps
		SET retry_state = 'scheduled', next_attempt_at = $3, `+countRetry("$2::int")+`,
		    retry_metadata = retry_metadata || $4::jsonb, updated_at = now()
		WHERE run_id = $1 AND run_attempt = $2 AND status = 'failed'`, id, attempt, next, raw); err != nil {
		return false, fmt.Errorf("schedule step retry: %w", err)
	}
	return true, nil
}

// countRetry counts the retry of the run attempt (an SQL expression) in
// a workflow_run_steps row's retry_attempts. The node's failed report,
// the scheduler's decision and the launch of the next attempt are applied
// in any order, and each counts the retry when it finds the other facts
// it needs; retried_run_attempts keeps the attempts already counted, so
// the retry is counted once whichever comes first, and a decision
// rescheduled by an operator does not count it again.
func countRetry(attempt string) string {
	return `retry_attempts = retry_attempts + CASE WHEN ` + attempt + ` = ANY(retried_run_attempts) THEN 0 ELSE 1 END,
		    retried_run_attempts = CASE WHEN ` + attempt + ` = ANY(retried_run_attempts) THEN retried_run_attempts
		                                ELSE array_append(retried_run_attempts, ` + attempt + `) END`
}

// EndRun ends a retrying run the scheduler gave up on (exhausted, or
// cancelled by an operator) as status, freeing its slot. changed is false
// when the run is not retrying: it ended already, or an attempt is in
// flight (an operator's cancel then stops no work; the attempt's own end
// decides).
func EndRun(ctx context.Context, db DB, id string, status RunStatus, errText string, retryCount int, maxRetries *int) (r Run, changed bool, err error) {
	if status != RunFailed && status != RunFailedMaxRetries {
		return Run{}, false, fmt.Errorf("end run: status %q is not failed or failed_max_retries", status)
	}
	r, err = scanRun(db.QueryRow(ctx, `
		UPDATE workflow_runs
		SET status = $2, error = $3, retry_count = GREATEST(retry_count, $4), max_retries = coalesce($5, max_retries),
		    next_retry_at = NULL, finished_at = now(), updated_at = now()
		WHERE run_id = $1 AND status = 'retrying'
		RETURNING `+runColumns, id, string(status), pgtext.Clean(pgtext.Truncate(errText, maxRunError)), retryCount, maxRetries))
	if errors.Is(err, pgx.ErrNoRows) {
		r, err = GetRun(ctx, db, id)
		return r, false, err
	}
	if err != nil {
		return Run{}, false, fmt.Errorf("end run: %w", err)
	}
	if _, err := db.Exec(ctx, `
		UPDATE workflow_run_steps SET retry_state = 'exhausted', next_attempt_at = NULL, updated_at = now()
		WHERE run_id = $1 AND status = 'failed' AND retry_state IN ('none', 'scheduled')`, id); err != nil {
		return Run{}, false, fmt.Errorf("end run steps: %w", err)
	}
	return r, true, nil
}

// StopRunRetries records an operator's cancel of a run's retries that
// arrived while an attempt is in flight: the attempt goes on, and if it
// fails the run ends failed instead of retrying (the scheduler, whose
// retry is cancelled, would not answer). changed is false when no
// attempt is in flight.
func StopRunRetries(ctx context.Context, db DB, id string) (bool, error) {
	return pgrows.Changed(ctx, db, "stop run retries", `UPDATE workflow_runs SET retry_enabled = false, updated_at = now()
		WHERE run_id = $1 AND status IN `+leasedStatuses+` AND retry_enabled`, id)
}

// RelaunchRun starts attempt of a run the scheduler brought back: it is
// requested again with a new lease (now plus the trigger's run timeout,
// defaultTimeout when it sets none). A due for an attempt the run has
// already reached changes nothing (changed is false). A run that ended
// (an operator's retry of a failed run) takes its slot back only when one
// is free: full is true when it is not, and nothing changed.
func RelaunchRun(ctx context.Context, tx pgx.Tx, id string, attempt int, defaultTimeout time.Duration) (r Run, changed, full bool, err error) {
	r, err = pgrows.One(ctx, tx, "relaunch run", scanRun, `SELECT `+runColumns+` FROM workflow_runs WHERE run_id = $1 FOR UPDATE`, id)
	if err != nil {
		return Run{}, false, false, err
	}
	if attempt <= r.Attempt || r.Status == RunCompleted || (!r.Status.Ended() && r.Status != RunRetrying) {
		return r, false, false, nil
	}
	if r.Status.Ended() && r.TriggerID != "" {
		t, err := LockTrigger(ctx, tx, r.TriggerID)
		if err != nil && !errors.Is(err, pgdb.ErrNotFound) {
			return Run{}, false, false, err
		}
		if err == nil && t.MaxConcurrency > 0 {
			n, err := CountInFlight(ctx, tx, r.TriggerID)
			if err != nil {
				return Run{}, false, false, err
			}
			if n >= t.MaxConcurrency {
				return r, false, true, nil
			}
		}
	}
	r, err = scanRun(tx.QueryRow(ctx, `
		UPDATE workflow_runs r
		SET status = 'requested', attempt = $2, next_retry_at = NULL, finished_at = NULL, error = '', retry_enabled = true,
		    lease_expires_at = now() + coalesce(
		        (SELECT t.run_timeout_ms FROM workflow_triggers t WHERE t.trigger_id = r.trigger_id), $3
		    ) * interval '1 millisecond',
		    updated_at = now()
		WHERE r.run_id = $1
		RETURNING `+runColumns, id, attempt, defaultTimeout.Milliseconds()))
	if err != nil {
		return Run{}, false, false, fmt.Errorf("relaunch run: %w", err)
	}
	// A node whose failure was applied before the scheduler's decision,
	// when the decision comes after this launch (or never: an operator's
	// retry of a failed run), is retried all the same.
	if _, err := tx.Exec(ctx, `
		UPDATE workflow_run_steps SET `+countRetry("run_attempt")+`,
		    retry_state = CASE WHEN retry_state = 'none' THEN 'scheduled' ELSE retry_state END, updated_at = now()
		WHERE run_id = $1 AND status = 'failed' AND run_attempt < $2`, id, attempt); err != nil {
		return Run{}, false, false, fmt.Errorf("relaunch run steps: %w", err)
	}
	return r, true, false, nil
}

// Step is a node of a run as its executor reported it: a row of
// workflow_run_steps.
type Step struct {
	RunID            string
	Node             string
	Status           string
	ReportedAt       time.Time
	Attempts         int
	RunAttempt       int
	RetryState       string
	RetryAttempts    int
	NextAttemptAt    *time.Time
	Output           json.RawMessage
	LastErrorClass   string
	LastErrorMessage string
	Executor         string
	CreatedAt        time.Time
	UpdatedAt        time.Time
}

// RecordStep stores a node's report. A node is reported once per attempt
// of its run: a report of an attempt the row already has (a redelivery)
// changes nothing, and neither does one for a run retryd did not launch
// (pgdb.ErrNotFound). A failed report of an attempt older than the row's only
// counts its run and its retry (see lateFailure). The first report of the
// run's current attempt moves it to in_progress.
func RecordStep(ctx context.Context, tx pgx.Tx, d contract.RunStepData, reportedAt time.Time) (r Run, recorded bool, err error) {
	r, err = pgrows.One(ctx, tx, "record step", scanRun, `SELECT `+runColumns+` FROM workflow_runs WHERE run_id = $1 FOR UPDATE`, d.RunID)
	if err != nil {
		return Run{}, false, err
	}
	attempt := max(d.Attempt, 1)
	var errClass, errMsg string
	if d.Error != nil {
		errClass, errMsg = d.Error.Class, pgtext.Clean(pgtext.Truncate(d.Error.Message, maxRunError))
	}
	var output any
	if d.Status == contract.StepCompleted && len(d.Output) > 0 {
		output = string(d.Output)
	}
	// Reports are applied concurrently with the run's end, the
	// scheduler's decision and the launch of the next attempt: a failed
	// node reported after them takes the retry state they gave the run,
	// and its retry is counted here when one of them already happened
	// (see countRetry).
	failedState, retried, next := "none", []int{}, (*time.Time)(nil)
	if d.Status == contract.StepFailed {
		if attempt < r.Attempt || (attempt == r.Attempt && r.Status == RunRetrying && r.NextRetryAt != nil) {
			failedState, retried = "scheduled", []int{attempt}
			if attempt == r.Attempt {
				next = r.NextRetryAt
			}
		}
		if r.Status == RunFailed || r.Status == RunFailedMaxRetries {
			failedState = "exhausted"
		}
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO workflow_run_steps AS s (run_id, step_id, status, attempts, run_attempt, output,
		    last_error_class, last_error_message, executor, reported_at, retry_state, retry_attempts,
		    retried_run_attempts, next_attempt_at)
		VALUES ($1, $2, $3, 1, $4, $5, $6, $7, $8, $9, $10, cardinality($11::int[]), $11, $12)
		ON CONFLICT (run_id, step_id) DO UPDATE SET
		    status = EXCLUDED.status, attempts = s.attempts + 1, run_attempt = EXCLUDED.run_attempt,
		    output = EXCLUDED.output, executor = EXCLUDED.executor,
		    last_error_class = CASE WHEN EXCLUDED.status = 'failed' THEN EXCLUDED.last_error_class ELSE s.last_error_class END,
		    last_error_message = CASE WHEN EXCLUDED.status = 'failed' THEN EXCLUDED.last_error_message ELSE s.last_error_message END,
		    retry_state = CASE WHEN EXCLUDED.status = 'completed' AND s.status = 'failed' THEN 'succeeded'
		                       WHEN EXCLUDED.status = 'failed' THEN EXCLUDED.retry_state ELSE s.retry_state END,
		    retry_attempts = s.retry_attempts + EXCLUDED.retry_attempts,
		    retried_run_attempts = s.retried_run_attempts || EXCLUDED.retried_run_attempts,
		    next_attempt_at = EXCLUDED.next_attempt_at, updated_at = now()
		WHERE s.run_attempt < EXCLUDED.run_attempt`,
		d.RunID, d.Node, d.Status, attempt, output, errClass, errMsg, pgtext.Truncate(d.Executor, 128), reportedAt,
		failedState, retried, next)
	if err != nil {
		return Run{}, false, fmt.Errorf("record step: %w", err)
	}
	if tag.RowsAffected() == 0 {
		recorded, err := lateFailure(ctx, tx, d, attempt, r)
		return r, recorded, err
	}
	// The node the executor reported last (by its clock) in the attempt
	// is the run's current node, unless the run failed: then it stays the
	// node the failure named. A run whose completion was applied before
	// its last steps still moves on to them.
	if attempt == r.Attempt && (r.Status == RunRequested || r.Status == RunInProgress || r.Status == RunCompleted) {
		r, err = scanRun(tx.QueryRow(ctx, `
			UPDATE workflow_runs SET status = CASE WHEN status = 'requested' THEN 'in_progress' ELSE status END,
			    current_node_id = CASE WHEN EXISTS (SELECT 1 FROM workflow_run_steps s
			        WHERE s.run_id = $1 AND s.run_attempt = $5 AND s.reported_at > $4) THEN current_node_id ELSE $2 END,
			    executor = CASE WHEN $3 = '' THEN executor ELSE $3 END, updated_at = now()
			WHERE run_id = $1 RETURNING `+runColumns, d.RunID, d.Node, pgtext.Truncate(d.Executor, 128), reportedAt, attempt))
		if err != nil {
			return Run{}, false, fmt.Errorf("record step: %w", err)
		}
	}
	return r, true, nil
}

// lateFailure applies a node's failed report of an attempt older than
// the row's last report: the newer report stays the node's state, but
// the node ran in that attempt too, and a later attempt exists, so that
// attempt was retried. A redelivery finds its attempt counted already
// and changes nothing.
func lateFailure(ctx context.Context, tx pgx.Tx, d contract.RunStepData, attempt int, r Run) (bool, error) {
	if d.Status != contract.StepFailed || attempt >= r.Attempt {
		return false, nil
	}
	return pgrows.Changed(ctx, tx, "record late step failure", `
		UPDATE workflow_run_steps SET attempts = attempts + 1, `+countRetry("$3::int")+`, updated_at = now()
		WHERE run_id = $1 AND step_id = $2 AND run_attempt > $3 AND NOT $3 = ANY(retried_run_attempts)`,
		d.RunID, d.Node, attempt)
}

const stepColumns = `run_id, step_id, status, reported_at, attempts, run_attempt, retry_state, retry_attempts,
	next_attempt_at, output, last_error_class, last_error_message, executor, created_at, updated_at`

// Steps lists a run's nodes in the order their executor first reported
// them.
func Steps(ctx context.Context, db DB, runID string) ([]Step, error) {
	return pgrows.All(ctx, db, "list steps", scanStep,
		`SELECT `+stepColumns+` FROM workflow_run_steps WHERE run_id = $1 ORDER BY reported_at, step_id`, runID)
}

func scanStep(row pgx.Row) (Step, error) {
	var s Step
	var output []byte
	err := row.Scan(&s.RunID, &s.Node, &s.Status, &s.ReportedAt, &s.Attempts, &s.RunAttempt, &s.RetryState,
		&s.RetryAttempts, &s.NextAttemptAt, &output, &s.LastErrorClass, &s.LastErrorMessage, &s.Executor,
		&s.CreatedAt, &s.UpdatedAt)
	if len(output) > 0 {
		s.Output = output
	}
	return s, err
}

// Checkpoint is where a retry of the run resumes: its completed nodes up
// to the first that is not, with their outputs. Nil when no node
// completed, or when the outputs would not fit in one message (the retry
// then starts from the first node).
func Checkpoint(ctx context.Context, db DB, runID string) (*contract.RunCheckpoint, error) {
	steps, err := Steps(ctx, db, runID)
	if err != nil {
		return nil, err
	}
	var cp *contract.RunCheckpoint
	size := 0
	for _, s := range steps {
		if s.Status != contract.StepCompleted {
			break
		}
		size += len(s.Output)
		if size > contract.MaxCheckpointBytes || (cp != nil && len(cp.Outputs) >= contract.MaxRunNodes) {
			return nil, nil
		}
		if cp == nil {
			cp = &contract.RunCheckpoint{Outputs: map[string]json.RawMessage{}}
		}
		cp.Node = s.Node
		if len(s.Output) > 0 {
			cp.Outputs[s.Node] = s.Output
		}
	}
	return cp, nil
}

// UnconfirmedRunRetries lists runs whose failure the scheduler has not
// answered (retrying, with no next_retry_at) since before olderThan: the
// failure fact may have been lost with a purged RETRIES stream, and the
// run would hold its slot for good.
func UnconfirmedRunRetries(ctx context.Context, db DB, olderThan time.Time, limit int) ([]Run, error) {
	return pgrows.All(ctx, db, "list unconfirmed run retries", scanRun, `
		SELECT `+runColumns+` FROM workflow_runs
		WHERE status = 'retrying' AND next_retry_at IS NULL AND updated_at < $1
		ORDER BY updated_at LIMIT $2`, olderThan, limit)
}

// LockUnconfirmedRun locks a run listed by UnconfirmedRunRetries and
// touches it, so the next pass waits again; ok is false when it was
// answered or moved on since the listing.
func LockUnconfirmedRun(ctx context.Context, tx pgx.Tx, id string, attempt int) (r Run, ok bool, err error) {
	r, err = scanRun(tx.QueryRow(ctx, `
		UPDATE workflow_runs SET updated_at = now()
		WHERE run_id = $1 AND attempt = $2 AND status = 'retrying' AND next_retry_at IS NULL
		RETURNING `+runColumns, id, attempt))
	if errors.Is(err, pgx.ErrNoRows) {
		return Run{}, false, nil
	}
	if err != nil {
		return Run{}, false, fmt.Errorf("lock unconfirmed run: %w", err)
	}
	return r, true, nil
}
