package retention_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/stores/jobstore"
	"github.com/retryd/retryd/stores/retention"
)

// Item tables are not partitioned: their terminal rows older than the
// retention go in batches, the others stay, a rerun finds nothing, and
// the analytics of the kept window answer as before.
func TestRetentionDeletesTerminalItems(t *testing.T) {
	t.Parallel()
	ctx, conn, now, ago := itemDB(t)

	retry := func(id, state string, created time.Time, resolved *time.Time) {
		t.Helper()
		_, err := conn.Exec(ctx, `INSERT INTO retries (kind, item_id, state, attempt, retry_count, max_retries, job_type,
	last_error_class, created_at, updated_at, resolved_at)
VALUES ('job', $1, $2, 2, 1, 3, 'mail', 'transient', $3, $3, $4)`, id, state, created, resolved)
		require.NoError(t, err)
	}
	job := func(id, status string, created, updated time.Time) {
		t.Helper()
		_, err := conn.Exec(ctx, `INSERT INTO jobs (job_id, job_type, status, retry_count, attempt, created_at, updated_at, completed_at)
VALUES ($1, 'mail', $2, 1, 2, $3, $4, CASE WHEN $2 = 'completed' THEN $4::timestamptz END)`, id, status, created, updated)
		require.NoError(t, err)
	}
	for _, id := range []string{"old-1", "old-2", "old-3", "old-4", "old-5"} {
		retry(id, "exhausted", ago(45), new(ago(40)))
	}
	retry("old-ok", "succeeded", ago(35), new(ago(31)))
	retry("old-cancelled", "cancelled", ago(35), new(ago(31)))
	retry("recent", "succeeded", ago(12), new(ago(10)))
	retry("recent-exhausted", "exhausted", ago(3), new(ago(2)))
	// Not terminal: kept however old (a manual retry of an exhausted item
	// clears resolved_at; this one kept it, and still stays).
	retry("pending", "scheduled", ago(60), new(ago(40)))
	for _, id := range []string{"old-1", "old-2", "old-3"} {
		job(id, "completed", ago(45), ago(40))
	}
	job("old-failed", "failed_max_retries", ago(45), ago(40))
	job("recent", "completed", ago(6), ago(5))
	job("retrying", "retrying", ago(60), ago(40))

	window := jobstore.AnalyticsQuery{Since: now.Add(-retention.DefaultItemRetention), Until: now.Add(time.Hour)}
	before, err := jobstore.RetryAnalytics(ctx, conn, window)
	require.NoError(t, err)
	require.Len(t, before.Kinds, 1)
	require.Equal(t, int64(2), before.Kinds[0].Items, "the recent items")
	require.Len(t, before.JobTypes, 1)
	require.Equal(t, int64(1), before.JobTypes[0].TotalJobs, "the recent job")

	opts := defaults
	opts.Batch = 2
	opts.DryRun = true
	dry := run(t, conn, opts)
	require.Equal(t, int64(7), of(t, dry, "retries").Deleted)
	require.Equal(t, int64(4), of(t, dry, "jobs").Deleted)
	require.Equal(t, int64(10), countRows(t, conn, "retries"), "a dry run deletes nothing")

	var logs bytes.Buffer
	opts.DryRun = false
	rep, err := retention.Run(ctx, conn, opts, zerolog.New(&logs))
	require.NoError(t, err)
	tr := of(t, rep, "retries")
	require.Equal(t, retention.MethodRows, tr.Method)
	require.Equal(t, "30d", tr.Retention)
	require.Equal(t, int64(7), tr.Deleted)
	require.Equal(t, int64(4), of(t, rep, "jobs").Deleted)
	require.Equal(t, 4+2, strings.Count(logs.String(), "retention deleted terminal rows"),
		"progress per batch of 2: four for retries' 7, two for jobs' 4")

	require.Equal(t, []string{"pending", "recent", "recent-exhausted"}, ids(t, conn, `SELECT item_id FROM retries ORDER BY 1`))
	require.Equal(t, []string{"recent", "retrying"}, ids(t, conn, `SELECT job_id FROM jobs ORDER BY 1`))

	after, err := jobstore.RetryAnalytics(ctx, conn, window)
	require.NoError(t, err)
	require.NotNil(t, after.CompleteFrom, "they say from when they are complete")
	after.CompleteFrom, after.Partial = nil, false
	require.Equal(t, before, after, "the analytics of the retention window do not change")

	again := run(t, conn, opts)
	require.Zero(t, of(t, again, "retries").Deleted, "a second run has nothing to do")
	require.Zero(t, of(t, again, "jobs").Deleted)

	// A shorter retention, per table.
	opts.Keep = map[string]time.Duration{"retries": 5 * day}
	short := run(t, conn, opts)
	require.Equal(t, int64(1), of(t, short, "retries").Deleted, "the item resolved 10 days ago")
	require.Zero(t, of(t, short, "jobs").Deleted, "jobs keep their default")
}

func countRows(t *testing.T, conn *pgx.Conn, table string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&n))
	return n
}

func ids(t *testing.T, conn *pgx.Conn, sql string) []string {
	t.Helper()
	return pgtest.Strings(t, conn, sql)
}

// The deletes find their rows by the partial indexes of migrations 00110,
// 00405, 00205 and 00305: the conditions of retention.Tables imply their
// predicates.
func TestRetentionItemsUseTheirIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := pgtest.NewConn(t)
	// With no rows, a sequential scan costs nothing: forbid it, so the
	// plan shows whether the index can serve the query at all.
	_, err := conn.Exec(ctx, `SET enable_seqscan = off`)
	require.NoError(t, err)
	for _, tc := range []struct{ table, index string }{
		{"retries", "retries_terminal_idx"}, {"jobs", "jobs_terminal_idx"},
		{"workflow_events", "workflow_events_terminal_idx"},
		{"workflow_trigger_deliveries", "workflow_trigger_deliveries_terminal_idx"},
		{"workflow_runs", "workflow_runs_terminal_idx"},
	} {
		var tbl retention.Table
		for _, x := range retention.Tables {
			if x.Name == tc.table {
				tbl = x
			}
		}
		require.NotEmpty(t, tbl.Terminal, tc.table)
		cond := tbl.Terminal + ` AND ` + tbl.Column + ` < $1`
		if tbl.Guard != "" {
			cond += ` AND ` + tbl.Guard
		}
		plan := pgtest.Strings(t, conn, `EXPLAIN SELECT ctid FROM `+tc.table+` WHERE `+cond+` LIMIT 5000`, time.Now())
		require.Contains(t, strings.Join(plan, "\n"), tc.index, tc.table)
	}
}
