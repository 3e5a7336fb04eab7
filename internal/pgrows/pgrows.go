// Package pgrows runs the statements of the stores (the services'
// triggerstore and ingressstore, the projections' jobstore and retrystore,
// the audit log, the tokens) row-wise: it reads one row, where no row is
// pgdb.ErrNotFound, all of them, or one page of a list, and tells
// whether a statement changed its row. The scan functions stay with the store that owns the
// table; this package only runs the statement, collects the rows and
// names the failure.
package pgrows

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retryd/retryd/stores/pgdb"
)

// Querier is what a read needs from a connection: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// One scans the row sql returns. No row is pgdb.ErrNotFound (the
// stores' ErrNotFound, a 404 at the API); errors are wrapped as
// "what: …".
func One[T any](ctx context.Context, db Querier, what string, scan func(pgx.Row) (T, error), sql string, args ...any) (T, error) {
	v, err := scan(db.QueryRow(ctx, sql, args...))
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			err = pgdb.ErrNotFound
		}
		var zero T
		return zero, fmt.Errorf("%s: %w", what, err)
	}
	return v, nil
}

// All scans every row sql returns, in order; no row is an empty, non-nil
// slice (a JSON list shows [] rather than null). Errors are wrapped as
// "what: …".
func All[T any](ctx context.Context, db Querier, what string, scan func(pgx.Row) (T, error), sql string, args ...any) ([]T, error) {
	return collect(ctx, db, what, func(r pgx.CollectableRow) (T, error) { return scan(r) }, sql, args...)
}

// Strings reads the one text column of every row sql returns, like All.
func Strings(ctx context.Context, db Querier, what, sql string, args ...any) ([]string, error) {
	return collect(ctx, db, what, pgx.RowTo[string], sql, args...)
}

func collect[T any](ctx context.Context, db Querier, what string, fn pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, fn)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// Execer is what a change needs from a connection: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Changed runs sql, which changes one row at the most (an INSERT … ON
// CONFLICT DO NOTHING, an UPDATE of one row with a guard), and reports
// whether it changed one. Errors are wrapped as "what: …".
func Changed(ctx context.Context, db Execer, what, sql string, args ...any) (bool, error) {
	tag, err := db.Exec(ctx, sql, args...)
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Page scans the rows of a list query whose LIMIT asks one row more than
// limit: at most limit of them, and, when that one more came back (a next
// page follows), next is the cursor that cursor makes of the last row
// kept; on the last page next is "". Errors are wrapped as "what: …".
func Page[T any](ctx context.Context, db Querier, what string, scan func(pgx.Row) (T, error), limit int, cursor func(T) string, sql string, args ...any) (items []T, next string, err error) {
	items, err = All(ctx, db, what, scan, sql, args...)
	if err != nil || len(items) <= limit {
		return items, "", err
	}
	items = items[:limit]
	return items, cursor(items[limit-1]), nil
}
