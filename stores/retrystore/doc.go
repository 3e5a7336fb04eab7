// Package retrystore is the Postgres side of the scheduler: the retries
// projection (one row per retried item), its history (every lifecycle fact
// of every item, in order) and the retry policies with their versions.
//
// The package holds SQL and types only. The state machine — which fact
// moves a row where, and which facts are stale — lives in the scheduler,
// which calls these functions inside its own transactions. Every function
// takes a Querier, so the same code runs on a pool or inside a pgx.Tx.
//
// Time comparisons (what is due, what must be re-emitted) use the
// database clock, never the caller's, so a skewed service clock cannot fire
// a retry early.
package retrystore

import (
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/stores/pgdb"
)

// Querier is what the functions of this package need: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx.
type Querier = pgdb.DB

// Copier is a Querier that can also COPY rows in (a pool, a connection or
// a transaction).
type Copier = pgdb.Copier

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
