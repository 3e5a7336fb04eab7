package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier is what Count queries: *pgxpool.Pool, *pgx.Conn and pgx.Tx all
// are one.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// countTimeout bounds one Count, so that a count stuck behind a lock fails
// its test with the query named instead of hanging until go test's timeout.
// It is generous because the tests share a loaded machine.
const countTimeout = 30 * time.Second

// Count runs query, which selects one count, on db and returns it; it fails
// the test on an error.
func Count(t testing.TB, db Querier, query string, args ...any) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), countTimeout)
	defer cancel()
	var n int
	if err := db.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		t.Fatalf("pgtest: count %q: %v", query, err)
	}
	return n
}
