package jobstore

import (
	"context"
	"fmt"

	"github.com/retryd/retryd/internal/pgquery"
	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/stores/pgdb"
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
	w.Equal("status", status)
	if !w.BeforeTimeCursor("created_at, operation_id", cursor) {
		return OperationPage{}, fmt.Errorf("list operations: %w", pgdb.ErrBadCursor)
	}
	sql := `SELECT ` + operationColumns + ` FROM job_operations` + w.SQL() +
		` ORDER BY created_at DESC, operation_id DESC LIMIT ` + w.Arg(limit+1)
	var page OperationPage
	page.Operations, page.NextCursor, err = pgrows.Page(ctx, q, "list operations", scanOperation, limit,
		func(o Operation) string { return pgquery.EncodeTimeCursor(o.CreatedAt, o.ID) }, sql, w.Args...)
	return page, err
}
