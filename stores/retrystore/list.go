package retrystore

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgquery"
	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/stores/pgdb"
)

// MaxListLimit bounds one page of List.
const MaxListLimit = 1000

// ListFilter selects retries; empty fields match everything.
type ListFilter struct {
	Kind    string
	State   State
	Source  string
	JobType string
	// Limit is the page size, 1 to MaxListLimit (0 means 100).
	Limit int
	// Cursor is the NextCursor of the previous page, or empty.
	Cursor string
}

// Page is one page of List.
type Page struct {
	Retries []Retry `json:"retries"`
	// NextCursor is empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// List returns retries matching f ordered by kind and item id, one page at
// a time (keyset pagination: a page costs the same however deep it is, and
// rows inserted meanwhile do not shift later pages).
func List(ctx context.Context, q Querier, f ListFilter) (Page, error) {
	limit, err := pgquery.Limit(f.Limit, MaxListLimit)
	if err != nil {
		return Page{}, fmt.Errorf("list retries: %w", err)
	}
	var w pgquery.Where
	w.Equal("kind", f.Kind)
	w.Equal("state", string(f.State))
	w.Equal("source", f.Source)
	w.Equal("job_type", f.JobType)
	if f.Cursor != "" {
		kind, item, err := decodeCursor(f.Cursor)
		if err != nil {
			return Page{}, fmt.Errorf("list retries: %w", err)
		}
		w.Add("(kind, item_id) > (?, ?)", kind, item)
	}
	sql := `SELECT ` + retryColumns + ` FROM retries` + w.SQL() + ` ORDER BY kind, item_id LIMIT ` + w.Arg(limit+1)
	var page Page
	page.Retries, page.NextCursor, err = pgrows.Page(ctx, q, "list retries", scanRetryRow, limit,
		func(r Retry) string { return encodeCursor(r.Kind, r.ItemID) }, sql, w.Args...)
	return page, err
}

// ListCursor is the cursor of a List page that ends at kind/item: the
// next page starts after it. retryd gateway resumes each shard's list
// where its merged page stopped taking from that shard.
func ListCursor(kind, item string) string { return encodeCursor(kind, item) }

// ParseListCursor returns the kind and item id a List cursor resumes
// after, or pgdb.ErrBadCursor.
func ParseListCursor(c string) (kind, item string, err error) { return decodeCursor(c) }

// Cursors are opaque to clients: base64 of "kind\x00item_id". Neither part
// can hold a NUL byte.
func encodeCursor(kind, item string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(kind + "\x00" + item))
}

func decodeCursor(c string) (kind, item string, err error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return "", "", pgdb.ErrBadCursor
	}
	kind, item, ok := strings.Cut(string(b), "\x00")
	if !ok || kind == "" || item == "" {
		return "", "", pgdb.ErrBadCursor
	}
	return kind, item, nil
}

// PendingCount is the number of rows of one kind in one pending state.
type PendingCount struct {
	Kind  string
	State State
	Count int64
}

// Pending counts the scheduled and due rows per kind. It reads the two
// partial indexes' rows only, not the terminal ones.
func Pending(ctx context.Context, q Querier) ([]PendingCount, error) {
	rows, err := q.Query(ctx, `SELECT kind, state, count(*) FROM retries
WHERE state IN ('scheduled', 'due') GROUP BY kind, state ORDER BY kind, state`)
	if err != nil {
		return nil, fmt.Errorf("count pending retries: %w", err)
	}
	var out []PendingCount
	var c PendingCount
	var state string
	if _, err := pgx.ForEachRow(rows, []any{&c.Kind, &state, &c.Count}, func() error {
		c.State = State(state)
		out = append(out, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count pending retries: %w", err)
	}
	return out, nil
}
