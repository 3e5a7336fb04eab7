package triggerstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/pgquery"
	"github.com/retryd/retryd/stores/pgdb"
)

// DB is what the store needs from a connection: pgx.Tx, *pgx.Conn and
// *pgxpool.Pool satisfy it.
type DB = pgdb.DB

var notFound = pgdb.NotFound

// Now reads the database clock. Launch times and throttle windows use it,
// not the clocks of the service instances, so instances with skewed clocks
// still count the same window.
func Now(ctx context.Context, db DB) (time.Time, error) {
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("read database clock: %w", err)
	}
	return now, nil
}

// updatedOrCurrent ends a guarded UPDATE … RETURNING that scanned v (err
// its error): the row it changed, with updated true, or, when its guard
// matched no row (the change does not apply to the row as it stands), that
// row as current reads it, with updated false.
func updatedOrCurrent[T any](v T, err error, what string, current func() (T, error)) (T, bool, error) {
	if err == nil {
		return v, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		var zero T
		return zero, false, fmt.Errorf("%s: %w", what, err)
	}
	v, err = current()
	return v, false, err
}

// pageSize is the page a list asked for limit reads: pgquery.DefaultLimit
// when it asks for none.
func pageSize(limit int) int {
	if limit <= 0 {
		return pgquery.DefaultLimit
	}
	return limit
}
