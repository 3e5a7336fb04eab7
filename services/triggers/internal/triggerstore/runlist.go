package triggerstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/retryd/retryd/internal/pgquery"
	"github.com/retryd/retryd/internal/pgrows"
)

// The operator views' list of workflow runs: filtered, newest first, a
// page at a time. It only reads; one run is GetRun, its steps Steps.

// MaxRunListLimit bounds one page of ListRuns.
const MaxRunListLimit = 500

// ErrBadRunCursor is returned by ListRuns for a cursor it did not
// produce.
var ErrBadRunCursor = errors.New("cursor is not valid")

// RunFilter selects runs; zero fields match everything.
type RunFilter struct {
	Workflow  string
	TriggerID string
	// Statuses matches any of them.
	Statuses []string
	// ErrorClass matches the class of the run's last error.
	ErrorClass string
}

// RunPage is one page of ListRuns, newest first.
type RunPage struct {
	Runs []Run
	// NextCursor is empty on the last page.
	NextCursor string
}

// ListRuns returns the runs matching f, newest (requested_at) first,
// limit at a time (0 means 100); cursor is the previous page's
// NextCursor.
func ListRuns(ctx context.Context, db DB, f RunFilter, limit int, cursor string) (RunPage, error) {
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
		at, id, ok := pgquery.DecodeTimeCursor(cursor)
		if !ok {
			return RunPage{}, fmt.Errorf("list runs: %w", ErrBadRunCursor)
		}
		w.Add("(requested_at, run_id) < (?, ?)", at, id)
	}
	sql := `SELECT ` + runColumns + ` FROM workflow_runs` + w.SQL() +
		` ORDER BY requested_at DESC, run_id DESC LIMIT ` + w.Arg(limit+1)
	runs, err := pgrows.All(ctx, db, "list runs", scanRun, sql, w.Args...)
	if err != nil {
		return RunPage{}, err
	}
	page := RunPage{Runs: runs}
	if len(page.Runs) > limit {
		page.Runs = page.Runs[:limit]
		last := page.Runs[limit-1]
		page.NextCursor = pgquery.EncodeTimeCursor(last.RequestedAt, last.ID)
	}
	return page, nil
}
