package jobstore

import (
	"context"
	"fmt"
	"time"

	"github.com/retryd/retryd/internal/pgquery"
	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/stores/pgdb"
)

// MaxListLimit bounds one page of List.
const MaxListLimit = 1000

// Filter selects jobs; zero fields match everything. It is what the jobs
// list and bulk retry filter on.
type Filter struct {
	// Statuses matches any of them.
	Statuses []Status
	JobType  string
	// Priority keeps one band: high, normal or low.
	Priority string
	// MinRetryCount keeps jobs that used at least this many retries.
	MinRetryCount int
	// ErrorClass matches the class of the job's last error.
	ErrorClass string
	// Since and Until bound the job's last change (updated_at): Since
	// inclusive, Until exclusive.
	Since, Until *time.Time
}

// where renders the filter as SQL conditions with arguments numbered
// after args.
func (f Filter) where(args ...any) *pgquery.Where {
	w := &pgquery.Where{Args: args}
	if len(f.Statuses) > 0 {
		s := make([]string, len(f.Statuses))
		for i, st := range f.Statuses {
			s[i] = string(st)
		}
		w.AnyOf("status", s)
	}
	w.Equal("job_type", f.JobType)
	w.Equal("priority", f.Priority)
	if f.MinRetryCount > 0 {
		w.Add("retry_count >= ?", f.MinRetryCount)
	}
	w.Equal("last_error_class", f.ErrorClass)
	if f.Since != nil {
		w.Add("updated_at >= ?", *f.Since)
	}
	if f.Until != nil {
		w.Add("updated_at < ?", *f.Until)
	}
	return w
}

// Page is one page of List: most recently changed jobs first.
type Page struct {
	Jobs []Job `json:"jobs"`
	// NextCursor is empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// List returns the jobs matching f, most recently changed first, limit at
// a time (0 means 100); cursor is the previous page's NextCursor.
func List(ctx context.Context, q Querier, f Filter, limit int, cursor string) (Page, error) {
	limit, err := pgquery.Limit(limit, MaxListLimit)
	if err != nil {
		return Page{}, fmt.Errorf("list jobs: %w", err)
	}
	w := f.where()
	if !w.BeforeTimeCursor("updated_at, job_id", cursor) {
		return Page{}, fmt.Errorf("list jobs: %w", pgdb.ErrBadCursor)
	}
	sql := `SELECT ` + jobColumns + ` FROM jobs` + w.SQL() + ` ORDER BY updated_at DESC, job_id DESC LIMIT ` + w.Arg(limit+1)
	var page Page
	page.Jobs, page.NextCursor, err = pgrows.Page(ctx, q, "list jobs", scanJob, limit,
		func(j Job) string { return pgquery.EncodeTimeCursor(j.UpdatedAt, j.ID) }, sql, w.Args...)
	return page, err
}

// Count returns how many jobs match f.
func Count(ctx context.Context, q Querier, f Filter) (int64, error) {
	w := f.where()
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM jobs`+w.SQL(), w.Args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count jobs: %w", err)
	}
	return n, nil
}
