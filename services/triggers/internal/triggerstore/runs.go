package triggerstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
)

// RunStatus is where a workflow run stands.
type RunStatus string

// A run is requested when launched, in_progress once its executor
// reports a node, retrying between a retryable failure and its next
// attempt, and ends completed, failed (not retryable, or cancelled) or
// failed_max_retries (seed 003's statuses). It holds its trigger's
// concurrency slot until it ends.
const (
	RunRequested        RunStatus = "requested"
	RunInProgress       RunStatus = "in_progress"
	RunRetrying         RunStatus = "retrying"
	RunCompleted        RunStatus = "completed"
	RunFailed           RunStatus = "failed"
	RunFailedMaxRetries RunStatus = "failed_max_retries"
)

// Ended reports whether the run has ended for good.
func (s RunStatus) Ended() bool {
	return s == RunCompleted || s == RunFailed || s == RunFailedMaxRetries
}

// inFlightStatuses are the statuses that hold a concurrency slot, as SQL.
const inFlightStatuses = `('requested', 'in_progress', 'retrying')`

// leasedStatuses are the statuses whose lease can end: an executor has
// the run.
const leasedStatuses = `('requested', 'in_progress')`

// Run is a row of workflow_runs: the run a delivery launched.
type Run struct {
	ID          string
	Workflow    string
	DeliveryID  string
	TriggerID   string
	EventID     string
	Status      RunStatus
	Error       string
	RequestedAt time.Time
	// LeaseExpiresAt is when the run loses its concurrency slot unless a
	// heartbeat or its end comes first. Nil for runs launched before
	// leases existed: their lease is RequestedAt plus the service's
	// default run timeout.
	LeaseExpiresAt *time.Time
	FinishedAt     *time.Time
	UpdatedAt      time.Time

	// Retries (docs/runs.md). Attempt is the attempt in flight or the
	// last one; RetryCount the retries the scheduler scheduled;
	// MaxRetries the policy's limit as its last decision said.
	Attempt            int
	RetryCount         int
	MaxRetries         *int
	RetryEnabled       bool
	CurrentNodeID      string
	LastErrorClass     string
	LastErrorMessage   string
	LastErrorTimestamp *time.Time
	NextRetryAt        *time.Time
	Executor           string
}

const runColumns = `run_id, workflow, coalesce(delivery_id, ''), coalesce(trigger_id, ''),
	coalesce(event_id, ''), status, error, requested_at, lease_expires_at, finished_at, updated_at,
	attempt, retry_count, max_retries, retry_enabled, current_node_id, last_error_class,
	last_error_message, last_error_timestamp, next_retry_at, executor`

func scanRun(row pgx.Row) (Run, error) {
	var r Run
	var status string
	if err := row.Scan(&r.ID, &r.Workflow, &r.DeliveryID, &r.TriggerID, &r.EventID, &status,
		&r.Error, &r.RequestedAt, &r.LeaseExpiresAt, &r.FinishedAt, &r.UpdatedAt,
		&r.Attempt, &r.RetryCount, &r.MaxRetries, &r.RetryEnabled, &r.CurrentNodeID, &r.LastErrorClass,
		&r.LastErrorMessage, &r.LastErrorTimestamp, &r.NextRetryAt, &r.Executor); err != nil {
		return Run{}, err
	}
	r.Status = RunStatus(status)
	return r, nil
}

// InsertRun records a requested run with its first lease
// (r.LeaseExpiresAt). A delivery launches at most one run: inserted is
// false when the run id or the delivery already has a run.
func InsertRun(ctx context.Context, db DB, r Run) (inserted bool, err error) {
	return pgrows.Changed(ctx, db, "insert run", `
		INSERT INTO workflow_runs (run_id, workflow, delivery_id, trigger_id, event_id, status, requested_at, lease_expires_at)
		VALUES ($1, $2, $3, $4, $5, 'requested', $6, $7)
		ON CONFLICT DO NOTHING`,
		r.ID, r.Workflow, nullString(r.DeliveryID), nullString(r.TriggerID), nullString(r.EventID), r.RequestedAt, r.LeaseExpiresAt)
}

// GetRun reads a run.
func GetRun(ctx context.Context, db DB, id string) (Run, error) {
	return pgrows.One(ctx, db, "get run", scanRun, `SELECT `+runColumns+` FROM workflow_runs WHERE run_id = $1`, id)
}

// CountInFlight counts a trigger's runs that are requested or running:
// the slots its max concurrency limits.
func CountInFlight(ctx context.Context, db DB, triggerID string) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `
		SELECT count(*) FROM workflow_runs
		WHERE trigger_id = $1 AND status IN `+inFlightStatuses, triggerID).Scan(&n); err != nil {
		return 0, fmt.Errorf("count runs in flight: %w", err)
	}
	return n, nil
}

// WaitingForSlot reports whether deliveries of the trigger are held
// waiting for a concurrency slot: a new delivery then queues behind them,
// so the slots go oldest first.
func WaitingForSlot(ctx context.Context, db DB, triggerID string) (bool, error) {
	var waiting bool
	if err := db.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM workflow_trigger_deliveries
		WHERE trigger_id = $1 AND status = 'concurrency_limited' AND retry_state = 'scheduled')`, triggerID).Scan(&waiting); err != nil {
		return false, fmt.Errorf("look for deliveries waiting for a slot: %w", err)
	}
	return waiting, nil
}

// RunTimeoutReason is the error of a run failed by ExpireRuns and the
// status_reason it leaves on the run's delivery.
const RunTimeoutReason = "run_timeout"

// ExpireRuns fails, as run_timeout (class timeout), the attempts of up to
// limit runs in flight whose lease ended before now (no heartbeat and no
// completed or failed message came in time), earliest lease first, and
// records run_timeout as their deliveries' status_reason. The runs go to
// retrying, like any failed attempt: the caller reports the failures to
// the scheduler, and a run keeps its slot until it ends. A run without a
// lease (launched before leases existed) ends at its requested_at plus
// defaultTimeout. Runs locked by another transaction (a heartbeat being
// applied) are skipped. It returns the runs it failed.
func ExpireRuns(ctx context.Context, db DB, now time.Time, defaultTimeout time.Duration, limit int) ([]Run, error) {
	return pgrows.All(ctx, db, "expire runs", scanRun, `
		WITH expired AS (
			-- finished_at is the clock the lease was judged by, not the
			-- transaction's start, which may come before the lease ended.
			UPDATE workflow_runs r SET status = CASE WHEN r.retry_enabled THEN 'retrying' ELSE 'failed' END,
			    finished_at = CASE WHEN r.retry_enabled THEN NULL ELSE $1 END,
			    error = $3, last_error_class = 'timeout',
			    last_error_message = 'no heartbeat and no end within the run timeout',
			    last_error_timestamp = $1, next_retry_at = NULL, updated_at = now()
			WHERE r.run_id IN (
				SELECT run_id FROM workflow_runs
				WHERE status IN `+leasedStatuses+`
				  AND (lease_expires_at < $1 OR (lease_expires_at IS NULL AND requested_at < $1 - $4 * interval '1 millisecond'))
				ORDER BY coalesce(lease_expires_at, requested_at) LIMIT $2
				FOR UPDATE SKIP LOCKED)
			RETURNING r.*
		), marked AS (
			UPDATE workflow_trigger_deliveries d SET status_reason = $3, updated_at = now()
			FROM expired WHERE d.run_id = expired.run_id
		)
		SELECT `+runColumns+` FROM expired ORDER BY coalesce(lease_expires_at, requested_at)`,
		now, limit, RunTimeoutReason, defaultTimeout.Milliseconds())
}

// ExtendLease renews the lease of a run in flight to sentAt plus its
// trigger's run timeout (defaultTimeout when the trigger sets none), with
// sentAt capped at the database's now(): a heartbeat redelivered or
// replayed long after it was sent extends the lease no further than it
// did when it was new, and a lease never moves backwards. extended is
// false for a run that has finished (left as it was); pgdb.ErrNotFound means
// retryd did not launch the run.
func ExtendLease(ctx context.Context, db DB, id string, sentAt time.Time, defaultTimeout time.Duration) (r Run, extended bool, err error) {
	r, err = scanRun(db.QueryRow(ctx, `
		UPDATE workflow_runs r
		SET lease_expires_at = GREATEST(r.lease_expires_at, LEAST(now(), $2) + coalesce(
		        (SELECT t.run_timeout_ms FROM workflow_triggers t WHERE t.trigger_id = r.trigger_id), $3
		    ) * interval '1 millisecond'),
		    updated_at = now()
		WHERE r.run_id = $1 AND r.status IN `+leasedStatuses+`
		RETURNING `+runColumns, id, sentAt, defaultTimeout.Milliseconds()))
	return updatedOrCurrent(r, err, "extend run lease", func() (Run, error) { return GetRun(ctx, db, id) })
}

// maxRunError bounds the error text kept for a failed run.
const maxRunError = 1024
