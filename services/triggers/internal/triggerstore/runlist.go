package triggerstore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgquery"
)

// The operator views of workflow runs: a filtered list, newest first, and
// one run with its steps. They only read; the write path is runs.go.

// MaxRunListLimit bounds one page of ListRunRecords.
const MaxRunListLimit = 500

// ErrBadRunCursor is returned by ListRunRecords for a cursor it did not
// produce.
var ErrBadRunCursor = errors.New("cursor is not valid")

// RunRecord is a whole row of workflow_runs, as the operator views show
// it (migration 00304's columns included).
type RunRecord struct {
	ID                 string
	Workflow           string
	DeliveryID         string
	TriggerID          string
	EventID            string
	Status             string
	Error              string
	RequestedAt        time.Time
	FinishedAt         *time.Time
	UpdatedAt          time.Time
	LeaseExpiresAt     *time.Time
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

const runRecordColumns = `run_id, workflow, coalesce(delivery_id, ''), coalesce(trigger_id, ''),
	coalesce(event_id, ''), status, error, requested_at, finished_at, updated_at, lease_expires_at,
	attempt, retry_count, max_retries, retry_enabled, current_node_id, last_error_class,
	last_error_message, last_error_timestamp, next_retry_at, executor`

func scanRunRecord(row interface{ Scan(...any) error }) (RunRecord, error) {
	var r RunRecord
	err := row.Scan(&r.ID, &r.Workflow, &r.DeliveryID, &r.TriggerID, &r.EventID, &r.Status, &r.Error,
		&r.RequestedAt, &r.FinishedAt, &r.UpdatedAt, &r.LeaseExpiresAt, &r.Attempt, &r.RetryCount,
		&r.MaxRetries, &r.RetryEnabled, &r.CurrentNodeID, &r.LastErrorClass, &r.LastErrorMessage,
		&r.LastErrorTimestamp, &r.NextRetryAt, &r.Executor)
	return r, err
}

// StepRecord is a row of workflow_run_steps: a node of a run as its
// executor reported it.
type StepRecord struct {
	RunID            string
	Node             string // step_id
	Position         int
	Status           string
	Attempts         int
	RunAttempt       int
	RetryState       string
	NextAttemptAt    *time.Time
	RetryAttempts    int
	RetryMetadata    json.RawMessage
	Output           json.RawMessage
	LastErrorClass   string
	LastErrorMessage string
	Executor         string
	CreatedAt        time.Time
	UpdatedAt        time.Time
}

// RunFilter selects runs; zero fields match everything.
type RunFilter struct {
	Workflow  string
	TriggerID string
	// Statuses matches any of them.
	Statuses []string
	// ErrorClass matches the class of the run's last error.
	ErrorClass string
}

// RunPage is one page of ListRunRecords, newest first.
type RunPage struct {
	Runs []RunRecord
	// NextCursor is empty on the last page.
	NextCursor string
}

// ListRunRecords returns the runs matching f, newest (requested_at) first,
// limit at a time (0 means 100); cursor is the previous page's
// NextCursor.
func ListRunRecords(ctx context.Context, db DB, f RunFilter, limit int, cursor string) (RunPage, error) {
	limit, err := pgquery.Limit(limit, MaxRunListLimit)
	if err != nil {
		return RunPage{}, fmt.Errorf("list runs: %w", err)
	}
	var w pgquery.Where
	if f.Workflow != "" {
		w.Add("workflow = ?", f.Workflow)
	}
	if f.TriggerID != "" {
		w.Add("trigger_id = ?", f.TriggerID)
	}
	if len(f.Statuses) > 0 {
		w.Add("status = ANY(?::text[])", f.Statuses)
	}
	if f.ErrorClass != "" {
		w.Add("last_error_class = ?", f.ErrorClass)
	}
	if cursor != "" {
		at, id, err := decodeRunCursor(cursor)
		if err != nil {
			return RunPage{}, fmt.Errorf("list runs: %w", err)
		}
		w.Add("(requested_at, run_id) < (?, ?)", at, id)
	}
	sql := `SELECT ` + runRecordColumns + ` FROM workflow_runs` + w.SQL() +
		` ORDER BY requested_at DESC, run_id DESC LIMIT ` + w.Arg(limit+1)
	rows, err := db.Query(ctx, sql, w.Args...)
	if err != nil {
		return RunPage{}, fmt.Errorf("list runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunRecord, error) { return scanRunRecord(row) })
	if err != nil {
		return RunPage{}, fmt.Errorf("list runs: %w", err)
	}
	page := RunPage{Runs: runs}
	if len(page.Runs) > limit {
		page.Runs = page.Runs[:limit]
		last := page.Runs[limit-1]
		page.NextCursor = encodeRunCursor(last.RequestedAt, last.ID)
	}
	return page, nil
}

// GetRunRecord reads a whole run; ErrNotFound when there is none.
func GetRunRecord(ctx context.Context, db DB, id string) (RunRecord, error) {
	r, err := scanRunRecord(db.QueryRow(ctx, `SELECT `+runRecordColumns+` FROM workflow_runs WHERE run_id = $1`, id))
	if err != nil {
		return RunRecord{}, fmt.Errorf("get run: %w", notFound(err))
	}
	return r, nil
}

// RunStepRecords returns the steps of a run in the order they were first
// reported (position), then by node.
func RunStepRecords(ctx context.Context, db DB, runID string) ([]StepRecord, error) {
	rows, err := db.Query(ctx, `
		SELECT run_id, step_id, position, status, attempts, run_attempt, retry_state, next_attempt_at,
		       retry_attempts, retry_metadata, output, last_error_class, last_error_message, executor,
		       created_at, updated_at
		FROM workflow_run_steps WHERE run_id = $1 ORDER BY position, created_at, step_id`, runID)
	if err != nil {
		return nil, fmt.Errorf("list run steps: %w", err)
	}
	steps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StepRecord, error) {
		var s StepRecord
		var meta, out []byte
		err := row.Scan(&s.RunID, &s.Node, &s.Position, &s.Status, &s.Attempts, &s.RunAttempt, &s.RetryState,
			&s.NextAttemptAt, &s.RetryAttempts, &meta, &out, &s.LastErrorClass, &s.LastErrorMessage, &s.Executor,
			&s.CreatedAt, &s.UpdatedAt)
		if len(meta) > 0 && string(meta) != "{}" {
			s.RetryMetadata = meta
		}
		if len(out) > 0 {
			s.Output = out
		}
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("list run steps: %w", err)
	}
	return steps, nil
}

func encodeRunCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(at.UTC().Format(time.RFC3339Nano) + "|" + id))
}

func decodeRunCursor(c string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", ErrBadRunCursor
	}
	ts, id, ok := strings.Cut(string(b), "|")
	if !ok || id == "" {
		return time.Time{}, "", ErrBadRunCursor
	}
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return time.Time{}, "", ErrBadRunCursor
	}
	return at, id, nil
}
