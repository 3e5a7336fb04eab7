package triggerstore

import (
	"context"
	"fmt"

	"github.com/retryd/retryd/internal/pgquery"
	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/stores/pgdb"
)

// The operator views' list of workflow runs: filtered, newest first, a
// page at a time. It only reads; one run is GetRun, its steps Steps.

// MaxRunListLimit bounds one page of ListRuns.
const MaxRunListLimit = 500

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
	w.Equal("workflow", f.Workflow)
	w.Equal("trigger_id", f.TriggerID)
	w.AnyOf("status", f.Statuses)
	w.Equal("last_error_class", f.ErrorClass)
	if !w.BeforeTimeCursor("requested_at, run_id", cursor) {
		return RunPage{}, fmt.Errorf("list runs: %w", pgdb.ErrBadCursor)
	}
	sql := `SELECT ` + runColumns + ` FROM workflow_runs` + w.SQL() +
		` ORDER BY requested_at DESC, run_id DESC LIMIT ` + w.Arg(limit+1)
	var page RunPage
	page.Runs, page.NextCursor, err = pgrows.Page(ctx, db, "list runs", scanRun, limit,
		func(r Run) string { return pgquery.EncodeTimeCursor(r.RequestedAt, r.ID) }, sql, w.Args...)
	return page, err
}
