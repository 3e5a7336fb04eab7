package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
)

// 00109 makes retry_history range-partitioned by day without rewriting a
// row: the old table becomes a partition, ids continue after the old
// sequence, a new row lands in its day's partition (or DEFAULT when its day
// has none), and Down gives back the plain table with every row.
func TestHistoryPartitionsMigration(t *testing.T) {
	t.Parallel()
	b := setupAt(t, 108)
	ctx := context.Background()
	now := time.Now().UTC()
	_, err := b.conn.Exec(ctx, `INSERT INTO retry_history (kind, item_id, attempt, event, at)
VALUES ('job', 'a', 1, 'failed', $1), ('job', 'a', 2, 'due', $2), ('event', 'b', 1, 'failed', $2)`, now.Add(-72*time.Hour), now)
	require.NoError(t, err)
	// A deleted newest row: its id is not handed out again.
	_, err = b.conn.Exec(ctx, `DELETE FROM retry_history WHERE item_id = 'b'`)
	require.NoError(t, err)
	before := historyRows(t, b.conn)
	require.Len(t, before, 2)
	columns := historyColumns(t, b.conn)

	b.up(t)
	b.requireAllApplied(t)
	require.Equal(t, "p", relkind(t, b.conn, "retry_history"), "partitioned")
	require.Equal(t, before, historyRows(t, b.conn), "every row kept")
	require.Equal(t, columns, historyColumns(t, b.conn), "the same columns, defaults and identity")
	require.Equal(t, 2, pgtest.Count(t, b.conn, `SELECT count(*) FROM retry_history_legacy`), "the old table is a partition")

	tomorrow := now.Truncate(24 * time.Hour).Add(24 * time.Hour)
	for _, tc := range []struct {
		at        time.Time
		partition string
	}{
		{now, "retry_history_legacy"},
		{tomorrow.Add(time.Hour), "retry_history_p" + tomorrow.Format("20060102")},
		{tomorrow.Add(6*24*time.Hour + time.Hour), "retry_history_p" + tomorrow.Add(6*24*time.Hour).Format("20060102")},
		{now.Add(60 * 24 * time.Hour), "retry_history_default"},
	} {
		var id int64
		var partition string
		require.NoError(t, b.conn.QueryRow(ctx, `INSERT INTO retry_history (kind, item_id, attempt, event, at)
VALUES ('job', 'c', 1, 'failed', $1) RETURNING id, tableoid::regclass::text`, tc.at).Scan(&id, &partition))
		require.Equal(t, tc.partition, partition, "a row at %s", tc.at)
		require.Greater(t, id, int64(3), "ids continue after the old sequence")
	}

	b.down(t, 108)
	require.Equal(t, "r", relkind(t, b.conn, "retry_history"), "a plain table again")
	require.Equal(t, columns, historyColumns(t, b.conn))
	after := historyRows(t, b.conn)
	require.Len(t, after, 6)
	require.Equal(t, before, after[:2])
	var id int64
	require.NoError(t, b.conn.QueryRow(ctx, `INSERT INTO retry_history (kind, item_id, attempt, event)
VALUES ('job', 'd', 1, 'failed') RETURNING id`).Scan(&id))
	require.Greater(t, id, after[5].ID, "ids continue after Down")
	require.Equal(t, []string{"retry_history"}, tablesLike(t, b.conn, "retry_history%"), "no partition left")
}

type historyRow struct {
	ID     int64
	ItemID string
	Event  string
	At     time.Time
}

func historyRows(t *testing.T, conn *pgx.Conn) []historyRow {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT id, item_id, event, at FROM retry_history ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[historyRow])
	require.NoError(t, err)
	return out
}

func relkind(t *testing.T, conn *pgx.Conn, table string) string {
	t.Helper()
	var k string
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`, table).Scan(&k))
	return k
}

func tablesLike(t *testing.T, conn *pgx.Conn, pattern string) []string {
	t.Helper()
	return pgtest.Strings(t, conn, `SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE $1 ORDER BY 1`, pattern)
}

// historyColumns describes retry_history's columns in order: name, type,
// null, default, identity.
func historyColumns(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	out := pgtest.Strings(t, conn, `SELECT concat_ws(' ', column_name, data_type, is_nullable,
	coalesce(column_default, '-'), is_identity, coalesce(identity_generation, '-'))
FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'retry_history' ORDER BY ordinal_position`)
	require.Len(t, out, 18)
	return out
}
