package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/retryd/retryd/internal/pgrows"
)

// Querier is what Count and Strings query: *pgxpool.Pool, *pgx.Conn and
// pgx.Tx all are one. It is the stores' pgrows.Querier, which Strings
// reads with.
type Querier = pgrows.Querier

// queryTimeout bounds one Count or Strings, so that a query stuck behind a
// lock fails its test with the query named instead of hanging until go
// test's timeout. It is generous because the tests share a loaded machine.
const queryTimeout = 30 * time.Second

// Count runs query, which selects one count, on db and returns it; it fails
// the test on an error.
func Count(t testing.TB, db Querier, query string, args ...any) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	var n int
	if err := db.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		t.Fatalf("pgtest: count %q: %v", query, err)
	}
	return n
}
