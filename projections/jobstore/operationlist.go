package jobstore

import (
	"context"
	"fmt"

	"github.com/retryd/retryd/internal/pgquery"
	"github.com/retryd/retryd/projections/pgdb"
)

// OperationPage is one page of ListOperations: the newest first.
type OperationPage struct {
	Operations []Operation `json:"operations"`
	// NextCursor is empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// ListOperations returns the bulk operations, newest first, limit at a
// time (0 means 100), only those in status when it is not empty; cursor
// is the previous page's NextCursor.
func ListOperations(ctx context.Context, q Querier, status string, limit int, cursor string) (OperationPage, error) {
	limit, err := pgquery.Limit(limit, MaxListLimit)
	if err != nil {
		return OperationPage{}, fmt.Errorf("list operations: %w", err)
	}
	var w pgquery.Where
	if status != "" {
		w.Add("status = ?", status)
	}
	if cursor != "" {
		at, id, ok := pgquery.DecodeTimeCursor(cursor)
		if !ok {
			return OperationPage{}, fmt.Errorf("list operations: %w", ErrBadCursor)
		}
		w.Add("(created_at, operation_id) < (?, ?)", at, id)
	}
	sql := `SELECT ` + operationColumns + ` FROM job_operations` + w.SQL() +
		` ORDER BY created_at DESC, operation_id DESC LIMIT ` + w.Arg(limit+1)
	var page OperationPage
	var more bool
	page.Operations, more, err = pgdb.QueryPage(ctx, q, sql, w.Args, limit, scanOperation)
	if err != nil {
		return OperationPage{}, fmt.Errorf("list operations: %w", err)
	}
	if more {
		last := page.Operations[limit-1]
		page.NextCursor = pgquery.EncodeTimeCursor(last.CreatedAt, last.ID)
	}
	return page, nil
}
