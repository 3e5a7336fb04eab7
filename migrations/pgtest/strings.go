package pgtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/retryd/retryd/internal/pgrows"
)

// Strings runs query, which selects one text column, on db and returns its
// rows in order (no row is an empty slice); it fails the test on an error.
func Strings(t testing.TB, db Querier, query string, args ...any) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	out, err := pgrows.Strings(ctx, db, fmt.Sprintf("strings %q", query), query, args...)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return out
}
