package jobstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
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
	if limit == 0 {
		limit = 100
	}
	if limit < 1 || limit > MaxListLimit {
		return OperationPage{}, fmt.Errorf("list operations: limit must be between 1 and %d, got %d", MaxListLimit, limit)
	}
	var conds []string
	var args []any
	if status != "" {
		args = append(args, status)
		conds = append(conds, fmt.Sprintf("status = $%d", len(args)))
	}
	if cursor != "" {
		at, id, err := decodeCursor(cursor)
		if err != nil {
			return OperationPage{}, fmt.Errorf("list operations: %w", err)
		}
		args = append(args, at, id)
		conds = append(conds, fmt.Sprintf("(created_at, operation_id) < ($%d, $%d)", len(args)-1, len(args)))
	}
	args = append(args, limit+1)
	rows, err := q.Query(ctx, `SELECT `+operationColumns+` FROM job_operations`+whereSQL(conds)+
		fmt.Sprintf(` ORDER BY created_at DESC, operation_id DESC LIMIT $%d`, len(args)), args...)
	if err != nil {
		return OperationPage{}, fmt.Errorf("list operations: %w", err)
	}
	defer rows.Close()
	page := OperationPage{Operations: []Operation{}}
	page.Operations, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Operation, error) { return scanOperation(row) })
	if err != nil {
		return OperationPage{}, fmt.Errorf("list operations: %w", err)
	}
	if len(page.Operations) > limit {
		page.Operations = page.Operations[:limit]
		last := page.Operations[limit-1]
		page.NextCursor = encodeCursor(last.CreatedAt, last.ID)
	}
	return page, nil
}
