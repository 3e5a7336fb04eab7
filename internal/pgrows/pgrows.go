// Package pgrows reads a query's rows into values, for the stores of the
// services (triggerstore, ingressstore): one row, where no row is
// contract.ErrNotFound, or all of them. The scan functions stay with the
// store that owns the table; this package only runs the query, collects
// the rows and names the failure.
package pgrows

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/pkg/contract"
)

// Querier is what a read needs from a connection: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// One scans the row sql returns. No row is contract.ErrNotFound (the
// stores' ErrNotFound, a 404 at the API); errors are wrapped as
// "what: …".
func One[T any](ctx context.Context, db Querier, what string, scan func(pgx.Row) (T, error), sql string, args ...any) (T, error) {
	v, err := scan(db.QueryRow(ctx, sql, args...))
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			err = contract.ErrNotFound
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
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (T, error) { return scan(r) })
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}
