package pgrows_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/stores/pgdb"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func scanNumber(row pgx.Row) (int, error) {
	var n int
	err := row.Scan(&n)
	return n, err
}

// One maps a missing row to pgdb.ErrNotFound and names what failed;
// All and Strings return every row, and [] (not nil) for none.
func TestOneAndAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)

	n, err := pgrows.One(ctx, pool, "get number", scanNumber, `SELECT $1::int`, 7)
	require.NoError(t, err)
	require.Equal(t, 7, n)

	_, err = pgrows.One(ctx, pool, "get number", scanNumber, `SELECT 1 WHERE false`)
	require.ErrorIs(t, err, pgdb.ErrNotFound)
	require.EqualError(t, err, "get number: "+pgdb.ErrNotFound.Error())

	_, err = pgrows.One(ctx, pool, "get number", scanNumber, `SELECT 'x'::text`)
	require.Error(t, err)
	require.NotErrorIs(t, err, pgdb.ErrNotFound)
	require.Contains(t, err.Error(), "get number: ")

	ns, err := pgrows.All(ctx, pool, "list numbers", scanNumber, `SELECT generate_series(1, $1::int)`, 3)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3}, ns)

	ns, err = pgrows.All(ctx, pool, "list numbers", scanNumber, `SELECT 1 WHERE false`)
	require.NoError(t, err)
	require.NotNil(t, ns)
	require.Empty(t, ns)

	_, err = pgrows.All(ctx, pool, "list numbers", scanNumber, `SELECT FROM no_such_table`)
	require.ErrorContains(t, err, "list numbers: ")

	names, err := pgrows.Strings(ctx, pool, "list names", `SELECT unnest($1::text[])`, []string{"a", "b"})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, names)
	names, err = pgrows.Strings(ctx, pool, "list names", `SELECT 'a' WHERE false`)
	require.NoError(t, err)
	require.Equal(t, []string{}, names)
}

// Page keeps limit rows of the limit+1 a list query asked for and makes
// the next cursor of the last one kept; a short page has none.
func TestPage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	cursor := func(n int) string { return "after-" + strconv.Itoa(n) }
	series := `SELECT generate_series(1, $1::int)`

	ns, next, err := pgrows.Page(ctx, pool, "list numbers", scanNumber, 2, cursor, series, 3)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, ns)
	require.Equal(t, "after-2", next)

	ns, next, err = pgrows.Page(ctx, pool, "list numbers", scanNumber, 2, cursor, series, 2)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, ns)
	require.Empty(t, next)

	ns, next, err = pgrows.Page(ctx, pool, "list numbers", scanNumber, 2, cursor, `SELECT 1 WHERE false`)
	require.NoError(t, err)
	require.Equal(t, []int{}, ns)
	require.Empty(t, next)

	_, _, err = pgrows.Page(ctx, pool, "list numbers", scanNumber, 2, cursor, `SELECT FROM no_such_table`)
	require.ErrorContains(t, err, "list numbers: ")
}

// Changed reports whether the statement changed a row, and names what
// failed.
func TestChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE pgrows_test (id text PRIMARY KEY)`)
	require.NoError(t, err)

	insert := `INSERT INTO pgrows_test (id) VALUES ($1) ON CONFLICT DO NOTHING`
	changed, err := pgrows.Changed(ctx, pool, "insert row", insert, "a")
	require.NoError(t, err)
	require.True(t, changed)
	changed, err = pgrows.Changed(ctx, pool, "insert row", insert, "a")
	require.NoError(t, err)
	require.False(t, changed, "the row exists")

	_, err = pgrows.Changed(ctx, pool, "insert row", `INSERT INTO no_such_table VALUES (1)`)
	require.ErrorContains(t, err, "insert row: ")
}
