// Package pgdb holds what every store of retryd shares: the connection
// its functions take (a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx) and the
// sentinel errors of a store: a row that does not exist, a change that
// clashes with a row, a list cursor the store did not make. Each is
// defined here only, so the HTTP layer (internal/serve) answers 404, 409
// and 400 for whichever store or handler wrapped it.
package pgdb

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

var (
	// ErrNotFound is wrapped when what a caller names (an event, a retry,
	// a trigger, a job, a policy, a token) does not exist (HTTP 404).
	ErrNotFound = errors.New("not found")
	// ErrConflict is wrapped when a change clashes with the state of what
	// it names: an id that is taken, cancelling a retry that finished, a
	// policy version that changed (HTTP 409).
	ErrConflict = errors.New("conflict")
	// ErrBadCursor is wrapped when a list is given a cursor it did not
	// make; the client sent it, so the API answers 400 for it.
	ErrBadCursor = errors.New("cursor is not valid")
)

// NotFound turns pgx.ErrNoRows into ErrNotFound and returns any other
// error as it is.
func NotFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}
