package jobstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgrows"
)

// MaxOperationItems bounds the jobs one bulk retry may release.
const MaxOperationItems = 100_000

// ErrTooManyItems is returned by CreateBulkRetry when the filter matches
// more than MaxOperationItems jobs.
var ErrTooManyItems = errors.New("filter matches too many jobs")

// Operation states.
const (
	OperationRunning   = "running"
	OperationCompleted = "completed"
	OperationCancelled = "cancelled"
)

// Item states.
const (
	ItemPending  = "pending"
	ItemReleased = "released"
	ItemSkipped  = "skipped"
	ItemFailed   = "failed"
)

// Operation is a bulk retry and its progress.
type Operation struct {
	ID            string          `json:"id"`
	Kind          string          `json:"kind"`
	Status        string          `json:"status"`
	Filter        json.RawMessage `json:"filter"`
	Reason        string          `json:"reason,omitempty"`
	RequestedBy   string          `json:"requested_by,omitempty"`
	ResetAttempts bool            `json:"reset_attempts"`
	RatePerSecond float64         `json:"rate_per_second"`
	Total         int             `json:"total"`
	Released      int             `json:"released"`
	Skipped       int             `json:"skipped"`
	Failed        int             `json:"failed"`
	// Pending is Total minus the items done.
	Pending    int        `json:"pending"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

const operationColumns = `operation_id, kind, status, filter, reason, requested_by, reset_attempts,
	rate_per_second, total, released, skipped, failed, created_at, updated_at, finished_at`

func scanOperation(row pgx.Row) (Operation, error) {
	var o Operation
	err := row.Scan(&o.ID, &o.Kind, &o.Status, (*[]byte)(&o.Filter), &o.Reason, &o.RequestedBy, &o.ResetAttempts,
		&o.RatePerSecond, &o.Total, &o.Released, &o.Skipped, &o.Failed, &o.CreatedAt, &o.UpdatedAt, &o.FinishedAt)
	o.Pending = o.Total - o.Released - o.Skipped - o.Failed
	return o, err
}

// NewBulkRetry describes a bulk retry to create.
type NewBulkRetry struct {
	ID     string
	Filter Filter
	// FilterJSON is the filter as the client gave it, kept for display.
	FilterJSON    json.RawMessage
	Reason        string
	RequestedBy   string
	ResetAttempts bool
	RatePerSecond float64
}

// CreateBulkRetry writes the operation and one pending item per job
// matching the filter now, oldest change first. q should be a
// transaction: the items and the total are written by two statements.
func CreateBulkRetry(ctx context.Context, q Querier, op NewBulkRetry) (Operation, error) {
	if _, err := q.Exec(ctx, `
INSERT INTO job_operations (operation_id, kind, status, filter, reason, requested_by, reset_attempts, rate_per_second)
VALUES ($1, 'bulk_retry', 'running', $2, $3, $4, $5, $6)`,
		op.ID, string(op.FilterJSON), op.Reason, op.RequestedBy, op.ResetAttempts, op.RatePerSecond); err != nil {
		return Operation{}, fmt.Errorf("create bulk retry %s: %w", op.ID, err)
	}
	w := op.Filter.where(op.ID)
	sql := `
INSERT INTO job_operation_items (operation_id, job_id, seq)
SELECT $1, job_id, row_number() OVER (ORDER BY updated_at, job_id) FROM (
	SELECT job_id, updated_at FROM jobs` + w.SQL() + ` ORDER BY updated_at, job_id LIMIT ` + w.Arg(MaxOperationItems+1) + `
) AS matched`
	tag, err := q.Exec(ctx, sql, w.Args...)
	if err != nil {
		return Operation{}, fmt.Errorf("create bulk retry %s: select jobs: %w", op.ID, err)
	}
	if tag.RowsAffected() > MaxOperationItems {
		return Operation{}, fmt.Errorf("create bulk retry: %w: more than %d", ErrTooManyItems, MaxOperationItems)
	}
	status := OperationRunning
	if tag.RowsAffected() == 0 {
		status = OperationCompleted
	}
	o, err := scanOperation(q.QueryRow(ctx, `
UPDATE job_operations SET total = $2, status = $3,
	finished_at = CASE WHEN $3 = 'completed' THEN now() END, updated_at = now()
WHERE operation_id = $1 RETURNING `+operationColumns, op.ID, tag.RowsAffected(), status))
	if err != nil {
		return Operation{}, fmt.Errorf("create bulk retry %s: %w", op.ID, err)
	}
	return o, nil
}

// GetOperation returns an operation, or pgdb.ErrNotFound.
func GetOperation(ctx context.Context, q Querier, id string) (Operation, error) {
	return pgrows.One(ctx, q, "get operation "+id, scanOperation, `SELECT `+operationColumns+` FROM job_operations WHERE operation_id = $1`, id)
}

// CancelOperation stops a running operation; its pending items stay
// pending. It returns the operation; cancelling a finished one changes
// nothing.
func CancelOperation(ctx context.Context, q Querier, id string) (Operation, error) {
	if _, err := q.Exec(ctx, `
UPDATE job_operations SET status = 'cancelled', finished_at = now(), updated_at = now(), lease_until = NULL
WHERE operation_id = $1 AND status = 'running'`, id); err != nil {
		return Operation{}, fmt.Errorf("cancel operation %s: %w", id, err)
	}
	return GetOperation(ctx, q, id)
}

// LeaseOperations takes the lease of running operations whose lease is
// free or expired (or already runner's), until now + ttl, and returns
// their ids.
func LeaseOperations(ctx context.Context, q Querier, runner string, ttl time.Duration) ([]string, error) {
	return pgrows.Strings(ctx, q, "lease operations", `
UPDATE job_operations SET runner = $1, lease_until = now() + make_interval(secs => $2)
WHERE status = 'running' AND (lease_until IS NULL OR lease_until < now() OR runner = $1)
RETURNING operation_id`, runner, ttl.Seconds())
}

// RenewLease extends runner's lease of an operation. It reports false when
// the operation is no longer running or another runner holds it.
func RenewLease(ctx context.Context, q Querier, id, runner string, ttl time.Duration) (bool, error) {
	return pgrows.Changed(ctx, q, "renew lease of operation "+id, `
UPDATE job_operations SET lease_until = now() + make_interval(secs => $3)
WHERE operation_id = $1 AND runner = $2 AND status = 'running'`, id, runner, ttl.Seconds())
}

// NextItem locks the next pending item of a running operation held by
// runner; q must be a transaction, which FinishItem then uses. ok is false
// when nothing is left to do (or the lease was lost).
func NextItem(ctx context.Context, tx pgx.Tx, id, runner string) (jobID string, ok bool, err error) {
	err = tx.QueryRow(ctx, `
SELECT i.job_id FROM job_operation_items i
JOIN job_operations o ON o.operation_id = i.operation_id
WHERE i.operation_id = $1 AND i.state = 'pending' AND o.status = 'running' AND o.runner = $2
ORDER BY i.seq LIMIT 1
FOR UPDATE OF i SKIP LOCKED`, id, runner).Scan(&jobID)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("next item of operation %s: %w", id, err)
	}
	return jobID, true, nil
}

// FinishItem records an item's result and counts it on the operation.
func FinishItem(ctx context.Context, q Querier, id, jobID, state, errMsg string) error {
	tag, err := q.Exec(ctx, `
UPDATE job_operation_items SET state = $3, error = $4, done_at = now()
WHERE operation_id = $1 AND job_id = $2 AND state = 'pending'`, id, jobID, state, errMsg)
	if err != nil {
		return fmt.Errorf("finish item %s of operation %s: %w", jobID, id, err)
	}
	if tag.RowsAffected() == 0 {
		return nil
	}
	if _, err := q.Exec(ctx, `
UPDATE job_operations SET
	released = released + CASE WHEN $2 = 'released' THEN 1 ELSE 0 END,
	skipped = skipped + CASE WHEN $2 = 'skipped' THEN 1 ELSE 0 END,
	failed = failed + CASE WHEN $2 = 'failed' THEN 1 ELSE 0 END,
	updated_at = now()
WHERE operation_id = $1`, id, state); err != nil {
		return fmt.Errorf("count item of operation %s: %w", id, err)
	}
	return nil
}

// CompleteOperation marks a running operation with no pending item
// completed and reports whether it did.
func CompleteOperation(ctx context.Context, q Querier, id string) (bool, error) {
	return pgrows.Changed(ctx, q, "complete operation "+id, `
UPDATE job_operations SET status = 'completed', finished_at = now(), updated_at = now(), lease_until = NULL
WHERE operation_id = $1 AND status = 'running'
	AND NOT EXISTS (SELECT 1 FROM job_operation_items WHERE operation_id = $1 AND state = 'pending')`, id)
}

// OperationItem is one job of an operation and what became of it.
type OperationItem struct {
	JobID  string     `json:"job_id"`
	State  string     `json:"state"`
	Error  string     `json:"error,omitempty"`
	DoneAt *time.Time `json:"done_at,omitempty"`
}

// OperationItems returns the items of an operation that are not pending
// or released (skipped and failed ones, which need attention), at most
// limit of them.
func OperationItems(ctx context.Context, q Querier, id string, limit int) ([]OperationItem, error) {
	return pgrows.All(ctx, q, "read items of operation "+id, scanOperationItem, `
SELECT job_id, state, error, done_at FROM job_operation_items
WHERE operation_id = $1 AND state IN ('skipped', 'failed') ORDER BY seq LIMIT $2`, id, limit)
}

func scanOperationItem(r pgx.Row) (OperationItem, error) {
	var it OperationItem
	err := r.Scan(&it.JobID, &it.State, &it.Error, &it.DoneAt)
	return it, err
}
