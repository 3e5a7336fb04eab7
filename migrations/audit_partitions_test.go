package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
)

// 00502 makes audit_log range-partitioned by UTC week (from Monday)
// without rewriting a row, as 00109 did for retry_history: the old table
// becomes a partition, ids continue after the old sequence, the checks
// still hold, a new row lands in its week's partition (or DEFAULT), and
// Down gives back the plain table with every row.
func TestAuditPartitionsMigration(t *testing.T) {
	t.Parallel()
	b := setupAt(t, 501)
	ctx := context.Background()
	now := time.Now().UTC()
	_, err := b.conn.Exec(ctx, `INSERT INTO audit_log (principal, role, action, target, at)
VALUES ('ops', 'admin', 'sources.pause', 'shop', $1), ('ops', 'admin', 'sources.resume', 'shop', $2)`, now.Add(-40*24*time.Hour), now)
	require.NoError(t, err)
	before := auditRows(t, b.conn)
	require.Len(t, before, 2)
	columns := columnsOf(t, b.conn, "audit_log")

	b.up(t)
	b.requireAllApplied(t)
	require.Equal(t, "p", relkind(t, b.conn, "audit_log"), "partitioned")
	require.Equal(t, before, auditRows(t, b.conn), "every row kept")
	require.Equal(t, columns, columnsOf(t, b.conn, "audit_log"), "the same columns, defaults and identity")
	require.Equal(t, 2, pgtest.Count(t, b.conn, `SELECT count(*) FROM audit_log_legacy`), "the old table is a partition")

	monday := now.Truncate(7 * 24 * time.Hour)
	require.Equal(t, time.Monday, monday.Weekday())
	next := monday.Add(7 * 24 * time.Hour)
	for _, tc := range []struct {
		at        time.Time
		partition string
	}{
		{now, "audit_log_legacy"},
		{next, "audit_log_p" + next.Format("20060102")},
		{next.Add(13*24*time.Hour + time.Hour), "audit_log_p" + next.Add(7*24*time.Hour).Format("20060102")},
		{now.Add(60 * 24 * time.Hour), "audit_log_default"},
	} {
		var id int64
		var partition string
		require.NoError(t, b.conn.QueryRow(ctx, `INSERT INTO audit_log (principal, role, action, target, at)
VALUES ('ops', 'admin', 'tokens.create', 'ci', $1) RETURNING id, tableoid::regclass::text`, tc.at).Scan(&id, &partition))
		require.Equal(t, tc.partition, partition, "a row at %s", tc.at)
		require.Greater(t, id, before[1].ID, "ids continue after the old sequence")
	}
	_, err = b.conn.Exec(ctx, `INSERT INTO audit_log (principal, role, action, target) VALUES ('', 'admin', 'x', 'y')`)
	require.ErrorContains(t, err, "audit_log_principal_check", "the checks hold on the partitioned table")

	b.down(t, 501)
	require.Equal(t, "r", relkind(t, b.conn, "audit_log"), "a plain table again")
	require.Equal(t, columns, columnsOf(t, b.conn, "audit_log"))
	after := auditRows(t, b.conn)
	require.Len(t, after, 6)
	require.Equal(t, before, after[:2])
	require.Equal(t, []string{"audit_log"}, tablesLike(t, b.conn, "audit_log%"), "no partition left")
}

// 00110, 00205, 00305 and 00405 index the terminal rows that maintenance
// deletes.
func TestTerminalIndexesMigrations(t *testing.T) {
	t.Parallel()
	b := setupAt(t, 109)
	b.up(t)
	b.requireAllApplied(t)
	for _, idx := range terminalIndexes {
		var valid bool
		require.NoError(t, b.conn.QueryRow(context.Background(),
			`SELECT indisvalid FROM pg_index WHERE indexrelid = $1::regclass`, idx).Scan(&valid))
		require.True(t, valid, idx)
	}
	b.down(t, 109)
	for _, idx := range terminalIndexes {
		var exists bool
		require.NoError(t, b.conn.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, idx).Scan(&exists))
		require.False(t, exists, idx)
	}
}

var terminalIndexes = []string{"retries_terminal_idx", "jobs_terminal_idx", "workflow_events_terminal_idx",
	"workflow_trigger_deliveries_terminal_idx", "workflow_runs_terminal_idx"}

type auditRow struct {
	ID     int64
	Action string
	At     time.Time
}

func auditRows(t *testing.T, conn *pgx.Conn) []auditRow {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT id, action, at FROM audit_log ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[auditRow])
	require.NoError(t, err)
	return out
}

// columnsOf describes a table's columns in order: name, type, null,
// default, identity.
func columnsOf(t *testing.T, conn *pgx.Conn, table string) []string {
	t.Helper()
	out := pgtest.Strings(t, conn, `SELECT concat_ws(' ', column_name, data_type, is_nullable,
	coalesce(column_default, '-'), is_identity, coalesce(identity_generation, '-'))
FROM information_schema.columns WHERE table_schema = 'public' AND table_name = $1 ORDER BY ordinal_position`, table)
	require.NotEmpty(t, out)
	return out
}
