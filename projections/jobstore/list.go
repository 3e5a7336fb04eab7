package jobstore

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// MaxListLimit bounds one page of List.
const MaxListLimit = 1000

// ErrBadCursor is returned by List for a cursor it did not produce.
var ErrBadCursor = errors.New("cursor is not valid")

// Filter selects jobs; zero fields match everything. It is what the jobs
// list and bulk retry filter on.
type Filter struct {
	// Statuses matches any of them.
	Statuses []Status
	JobType  string
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
func (f Filter) where(args []any) ([]string, []any) {
	var conds []string
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	if len(f.Statuses) > 0 {
		s := make([]string, len(f.Statuses))
		for i, st := range f.Statuses {
			s[i] = string(st)
		}
		add("status = ANY(?::text[])", s)
	}
	if f.JobType != "" {
		add("job_type = ?", f.JobType)
	}
	if f.MinRetryCount > 0 {
		add("retry_count >= ?", f.MinRetryCount)
	}
	if f.ErrorClass != "" {
		add("last_error_class = ?", f.ErrorClass)
	}
	if f.Since != nil {
		add("updated_at >= ?", *f.Since)
	}
	if f.Until != nil {
		add("updated_at < ?", *f.Until)
	}
	return conds, args
}

func whereSQL(conds []string) string {
	if len(conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(conds, " AND ")
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
	if limit == 0 {
		limit = 100
	}
	if limit < 1 || limit > MaxListLimit {
		return Page{}, fmt.Errorf("list jobs: limit must be between 1 and %d, got %d", MaxListLimit, limit)
	}
	conds, args := f.where(nil)
	if cursor != "" {
		at, id, err := decodeCursor(cursor)
		if err != nil {
			return Page{}, fmt.Errorf("list jobs: %w", err)
		}
		args = append(args, at, id)
		conds = append(conds, fmt.Sprintf("(updated_at, job_id) < ($%d, $%d)", len(args)-1, len(args)))
	}
	args = append(args, limit+1)
	rows, err := q.Query(ctx, `SELECT `+jobColumns+` FROM jobs`+whereSQL(conds)+
		fmt.Sprintf(` ORDER BY updated_at DESC, job_id DESC LIMIT $%d`, len(args)), args...)
	if err != nil {
		return Page{}, fmt.Errorf("list jobs: %w", err)
	}
	defer rows.Close()
	var page Page
	page.Jobs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Job, error) { return scanJob(row) })
	if err != nil {
		return Page{}, fmt.Errorf("list jobs: %w", err)
	}
	if len(page.Jobs) > limit {
		page.Jobs = page.Jobs[:limit]
		last := page.Jobs[limit-1]
		page.NextCursor = encodeCursor(last.UpdatedAt, last.ID)
	}
	return page, nil
}

// Count returns how many jobs match f.
func Count(ctx context.Context, q Querier, f Filter) (int64, error) {
	conds, args := f.where(nil)
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM jobs`+whereSQL(conds), args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count jobs: %w", err)
	}
	return n, nil
}

func encodeCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(at.UTC().Format(time.RFC3339Nano) + "|" + id))
}

func decodeCursor(c string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", ErrBadCursor
	}
	ts, id, ok := strings.Cut(string(b), "|")
	if !ok || id == "" {
		return time.Time{}, "", ErrBadCursor
	}
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return time.Time{}, "", ErrBadCursor
	}
	return at, id, nil
}
