// Package pgdb holds what every store of retryd shares: the connection
// its functions take (a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx) and the
// error for a row that does not exist.
package pgdb

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/retryd/retryd/pkg/contract"
)

// DB is what a store function needs from a connection: a *pgxpool.Pool,
// a *pgx.Conn or a pgx.Tx.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Copier is a DB that can also COPY rows in.
type Copier interface {
	DB
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error)
}

// ErrNotFound is returned when a row a caller names does not exist. It is
// contract.ErrNotFound, so the HTTP layer answers 404 for it as it is.
var ErrNotFound = contract.ErrNotFound

// NotFound turns pgx.ErrNoRows into ErrNotFound and returns any other
// error as it is.
func NotFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}
