package triggerstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/retryd/retryd/projections/pgdb"
)

// DB is what the store needs from a connection: pgx.Tx, *pgx.Conn and
// *pgxpool.Pool satisfy it.
type DB = pgdb.DB

var (
	// ErrNotFound is returned when a trigger, delivery or run does not
	// exist (or the trigger was deleted). It is pgdb.ErrNotFound.
	ErrNotFound = pgdb.ErrNotFound
	// ErrConflict is returned when a trigger id is already taken.
	ErrConflict = errors.New("already exists")
)

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
