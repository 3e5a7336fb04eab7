package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/stores/retention"
)

const week = 7 * day

// audit_log is partitioned by UTC week: filled across three weeks, a
// retention drops the oldest week whole, and what the audit trail lists
// within the retention stays as it was.
func TestRetentionDropsOldAuditWeeks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := pgtest.NewConn(t)
	now := time.Now().UTC()
	monday := now.Truncate(week)
	require.Equal(t, time.Monday, monday.Weekday())
	name := func(back int) string {
		return "audit_log_p" + monday.Add(-time.Duration(back)*week).Format("20060102")
	}
	// A trail that has run for a while: the partition 00502 made of the
	// old table is gone.
	_, err := conn.Exec(ctx, `DROP TABLE audit_log_legacy`)
	require.NoError(t, err)
	insert := func(at time.Time) {
		t.Helper()
		_, err := conn.Exec(ctx, `INSERT INTO audit_log (principal, role, action, target, at)
VALUES ('ops', 'admin', 'sources.pause', 'shop', $1)`, at)
		require.NoError(t, err)
	}
	// And the weeks 00502 created after it: this run creates them.
	for _, back := range []int{-1, -2} {
		_, err = conn.Exec(ctx, `DROP TABLE IF EXISTS `+name(back))
		require.NoError(t, err)
	}
	for _, back := range []int{8, 2, 0} {
		from := monday.Add(-time.Duration(back) * week)
		_, err := conn.Exec(ctx, `CREATE TABLE `+name(back)+` PARTITION OF audit_log
FOR VALUES FROM ('`+from.Format(time.RFC3339)+`') TO ('`+from.Add(week).Format(time.RFC3339)+`')`)
		require.NoError(t, err)
		insert(from.Add(time.Minute))
	}
	// Weeks without a partition: their rows are in DEFAULT, one older
	// than the retention, one within it.
	insert(monday.Add(-14 * week))
	insert(monday.Add(-3*week + time.Hour))

	opts := defaults
	opts.Keep = map[string]time.Duration{"audit_log": 30 * day}
	cutoff := now.Add(-30 * day)
	kept := func() []string {
		return ids(t, conn, `SELECT id::text FROM audit_log WHERE at >= '`+cutoff.Format(time.RFC3339Nano)+`' ORDER BY id DESC`)
	}
	before := kept()
	require.Len(t, before, 3, "two weeks back, three weeks back (in DEFAULT) and this week")

	tr := of(t, run(t, conn, opts), "audit_log")
	require.Equal(t, retention.MethodPartitions, tr.Method)
	require.Equal(t, "30d", tr.Retention)
	require.Equal(t, []string{name(8)}, tr.Dropped)
	require.Equal(t, int64(1), tr.DeletedFromDefault)
	require.Equal(t, []string{name(-1)}, tr.Created, "next week's partition (now + 7 days is in it), not this week's, which exists")
	require.Equal(t, before, kept(), "the rows within the retention stay")
	require.Equal(t, int64(3), countRows(t, conn, "audit_log"))
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name(8)).Scan(&exists))
	require.False(t, exists, "the oldest week is dropped, not emptied")

	var partition string
	require.NoError(t, conn.QueryRow(ctx, `INSERT INTO audit_log (principal, role, action, target, at)
VALUES ('ops', 'admin', 'tokens.create', 'ci', $1) RETURNING tableoid::regclass::text`,
		monday.Add(2*week-time.Microsecond)).Scan(&partition))
	require.Equal(t, name(-1), partition, "the last microsecond of next week")

	again := of(t, run(t, conn, opts), "audit_log")
	require.Empty(t, again.Created, "a second run has nothing to do")
	require.Empty(t, again.Dropped)
}
