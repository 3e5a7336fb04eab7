package retention_test

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/stores/jobstore"
	"github.com/retryd/retryd/stores/retention"
	"github.com/retryd/retryd/stores/retrystore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const day = 24 * time.Hour

// history is a database whose retry_history has run for a while: the
// partition 00109 made of the old table is gone, and there is a partition
// for each of days (days back from today, UTC), holding one failed attempt
// written a minute into that day.
type history struct {
	url   string
	conn  *pgx.Conn
	today time.Time
}

func setup(t *testing.T, days ...int) history {
	t.Helper()
	ctx := context.Background()
	h := history{url: pgtest.NewDatabaseURL(t), today: time.Now().UTC().Truncate(day)}
	h.conn = h.connect(t)
	_, err := h.conn.Exec(ctx, `DROP TABLE retry_history_legacy`)
	require.NoError(t, err)
	for _, back := range days {
		d := h.day(back)
		_, err := h.conn.Exec(ctx, `CREATE TABLE `+h.partition(back)+` PARTITION OF retry_history
FOR VALUES FROM ('`+d.Format(time.RFC3339)+`') TO ('`+d.Add(day).Format(time.RFC3339)+`')`)
		require.NoError(t, err)
		h.insert(t, d.Add(time.Minute))
	}
	return h
}

func (h history) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), h.url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func (h history) day(back int) time.Time { return h.today.Add(-time.Duration(back) * day) }

func (h history) partition(back int) string {
	return "retry_history_p" + h.day(back).Format("20060102")
}

// insert writes one failed attempt of a job at at, as the scheduler does.
func (h history) insert(t *testing.T, at time.Time) {
	t.Helper()
	require.NoError(t, retrystore.InsertHistory(context.Background(), h.conn, retrystore.HistoryEntry{
		Kind: "job", ItemID: at.Format(time.RFC3339), Attempt: 1, Event: "failed",
		JobType: "mail", ErrorClass: "transient", ErrorMessage: "timeout", At: at,
	}))
}

// rows counts the rows of a partition (or of the table), nil when it does
// not exist.
func (h history) rows(t *testing.T, table string) *int64 {
	t.Helper()
	var exists bool
	require.NoError(t, h.conn.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists))
	if !exists {
		return nil
	}
	var n int64
	require.NoError(t, h.conn.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&n))
	return &n
}

func count(n int64) *int64 { return &n }

func run(t *testing.T, conn *pgx.Conn, opts retention.Options) retention.Report {
	t.Helper()
	rep, err := retention.Run(context.Background(), conn, opts, zerolog.Nop())
	require.NoError(t, err)
	require.Equal(t, retention.TableNames(), tableNames(rep), "every table, in order")
	return rep
}

func tableNames(rep retention.Report) []string {
	out := make([]string, len(rep.Tables))
	for i, tr := range rep.Tables {
		out[i] = tr.Table
	}
	return out
}

// of is the report of one table.
func of(t *testing.T, rep retention.Report, table string) retention.TableReport {
	t.Helper()
	for _, tr := range rep.Tables {
		if tr.Table == table {
			return tr
		}
	}
	require.Failf(t, "no report", "of %s", table)
	return retention.TableReport{}
}

var defaults = retention.Options{Ahead: retention.DefaultAhead}

// The done-when of issue 19: history across three daily partitions (40,
// 20 and 0 days old); retention of 30 days drops the oldest partition
// whole and leaves the others, and the analytics of the window answer as
// before.
func TestRetentionDropsOldPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := setup(t, 40, 20, 0)
	// Rows whose day has no partition landed in DEFAULT: one older than
	// the retention, one within it.
	h.insert(t, h.day(35))
	h.insert(t, h.day(10))
	require.Equal(t, count(2), h.rows(t, "retry_history_default"))

	window := jobstore.AnalyticsQuery{Since: time.Now().Add(-retention.DefaultHistoryRetention), Until: time.Now().Add(time.Hour)}
	before, err := jobstore.RetryAnalytics(ctx, h.conn, window)
	require.NoError(t, err)

	rep := run(t, h.conn, defaults)
	tr := of(t, rep, "retry_history")
	require.Equal(t, retention.MethodPartitions, tr.Method)
	require.Equal(t, "30d", tr.Retention)
	require.Equal(t, []string{h.partition(40)}, tr.Dropped)
	require.Equal(t, int64(1), tr.DeletedFromDefault)
	require.Nil(t, h.rows(t, h.partition(40)), "the oldest partition is dropped, not emptied")
	require.Equal(t, count(1), h.rows(t, h.partition(20)))
	require.Equal(t, count(1), h.rows(t, h.partition(0)))
	require.Equal(t, count(1), h.rows(t, "retry_history_default"), "the row within the retention stays")
	for back := 0; back >= -7; back-- {
		require.NotNil(t, h.rows(t, h.partition(back)), "a partition for %s", h.day(back))
	}

	after, err := jobstore.RetryAnalytics(ctx, h.conn, window)
	require.NoError(t, err)
	require.Nil(t, before.CompleteFrom, "no retention had run")
	require.NotNil(t, after.CompleteFrom, "the analytics say from when they are complete")
	require.WithinDuration(t, time.Now().Add(-retention.DefaultHistoryRetention), *after.CompleteFrom, time.Minute)
	after.CompleteFrom, after.Partial = nil, false
	require.Equal(t, before, after, "the analytics of the retention window do not change")
	require.Len(t, after.Kinds, 1)
	require.Equal(t, []jobstore.ClassCount{{Class: "transient", Count: 3}}, after.Kinds[0].ErrorsByClass,
		"the attempts of 20 days, 10 days and today")

	again := of(t, run(t, h.conn, defaults), "retry_history")
	require.Empty(t, again.Created, "a second run has nothing to do")
	require.Empty(t, again.Dropped)
	require.Zero(t, again.DeletedFromDefault)
}

// A dry run reports what a run would change and changes nothing.
func TestRetentionDryRun(t *testing.T) {
	t.Parallel()
	h := setup(t, 40)
	h.insert(t, h.day(35))
	opts := defaults
	opts.DryRun = true
	now := time.Now()
	opts.Now = func() time.Time { return now }
	tr := of(t, run(t, h.conn, opts), "retry_history")
	require.Equal(t, []string{h.partition(40)}, tr.Dropped)
	require.Equal(t, int64(1), tr.DeletedFromDefault)
	require.Contains(t, tr.Created, h.partition(0))
	require.Equal(t, count(1), h.rows(t, h.partition(40)))
	require.Equal(t, count(1), h.rows(t, "retry_history_default"))
	require.Nil(t, h.rows(t, h.partition(0)))
	require.Equal(t, tr, of(t, run(t, h.conn, opts), "retry_history"), "and says the same again")
}

// Rows that landed in DEFAULT because maintenance had not run move into
// their day's partition when it is created, with their ids.
func TestRetentionMovesRowsOutOfDefault(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.insert(t, h.today.Add(time.Hour))
	var id int64
	require.NoError(t, h.conn.QueryRow(context.Background(), `SELECT id FROM retry_history_default`).Scan(&id))

	tr := of(t, run(t, h.conn, defaults), "retry_history")
	require.Contains(t, tr.Created, h.partition(0))
	require.Equal(t, int64(1), tr.MovedFromDefault)
	require.Equal(t, count(0), h.rows(t, "retry_history_default"))
	var partition string
	require.NoError(t, h.conn.QueryRow(context.Background(),
		`SELECT tableoid::regclass::text FROM retry_history WHERE id = $1`, id).Scan(&partition))
	require.Equal(t, h.partition(0), partition)
}

// Two runs at once (two CronJob pods) take turns on the advisory lock:
// both succeed and each partition is dropped once.
func TestRetentionConcurrentRuns(t *testing.T) {
	t.Parallel()
	h := setup(t, 50, 40)
	conns := []*pgx.Conn{h.conn, h.connect(t)}
	reps := make([]retention.Report, len(conns))
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Go(func() { reps[i], errs[i] = retention.Run(context.Background(), conn, defaults, zerolog.Nop()) })
	}
	wg.Wait()
	var dropped, created []string
	for i := range conns {
		require.NoError(t, errs[i])
		dropped = append(dropped, of(t, reps[i], "retry_history").Dropped...)
		created = append(created, of(t, reps[i], "retry_history").Created...)
	}
	require.ElementsMatch(t, []string{h.partition(50), h.partition(40)}, dropped)
	require.Contains(t, created, h.partition(0))
	slices.Sort(created)
	require.Equal(t, created, slices.Compact(slices.Clone(created)), "no partition created twice")
}

// Errors name what they were about, and bad options are refused.
func TestRetentionOptions(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for opts, want := range map[*retention.Options]string{
		{Keep: map[string]time.Duration{"retry_history": 0}}:   "retry_history",
		{Keep: map[string]time.Duration{"retry_histroy": day}}: `"retry_histroy" is not a table`,
		{Ahead: -day}: "Ahead",
		{Batch: -1}:   "Batch",
	} {
		_, err := retention.Run(context.Background(), h.conn, *opts, zerolog.Nop())
		require.ErrorContains(t, err, want)
	}

	for in, want := range map[string]time.Duration{"30d": 30 * day, "36h": 36 * time.Hour, "0d": 0} {
		got, err := retention.ParseDuration(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "d", "-1d", "thirty", "1.5d"} {
		_, err := retention.ParseDuration(in)
		require.Error(t, err, in)
	}
	require.Equal(t, "30d", retention.FormatDuration(30*day))
	require.Equal(t, "36h0m0s", retention.FormatDuration(36*time.Hour))
}

// The partition 00109 made of the old table (FROM MINVALUE) goes like any
// other once its end is older than the retention, and partition bounds
// read back exactly whatever the session's time zone (Postgres prints
// them in it).
func TestRetentionDropsTheLegacyPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := pgtest.NewConn(t)
	_, err := conn.Exec(ctx, `SET TimeZone = 'Pacific/Auckland'`)
	require.NoError(t, err)

	later := time.Now().Add(40 * day)
	opts := defaults
	opts.Now = func() time.Time { return later }
	tr := of(t, run(t, conn, opts), "retry_history")
	require.Contains(t, tr.Dropped, "retry_history_legacy")
	require.Len(t, tr.Dropped, 8, "the old table and the week 00109 created after it")
	require.Len(t, tr.Created, 8, "the day of the clock and seven ahead")
	require.Equal(t, "retry_history_p"+later.UTC().Format("20060102"), tr.Created[0])

	start := later.UTC().Truncate(day)
	for _, at := range []time.Time{start, start.Add(day - time.Microsecond)} {
		var partition string
		require.NoError(t, conn.QueryRow(ctx, `INSERT INTO retry_history (kind, item_id, attempt, event, at)
VALUES ('job', 'tz', 1, 'failed', $1) RETURNING tableoid::regclass::text`, at).Scan(&partition))
		require.Equal(t, tr.Created[0], partition, "a UTC day's first and last microsecond")
	}
}

// Each run records, per table, before when rows may be gone; a longer
// retention later cannot bring them back, so the mark never moves back,
// and a dry run records nothing.
func TestRetentionMarksOnlyMoveForward(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := setup(t)
	marks := func() map[string]time.Time {
		rows, err := h.conn.Query(ctx, `SELECT table_name, cutoff FROM retention_marks`)
		require.NoError(t, err)
		out := map[string]time.Time{}
		var name string
		var at time.Time
		_, err = pgx.ForEachRow(rows, []any{&name, &at}, func() error { out[name] = at; return nil })
		require.NoError(t, err)
		return out
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	opts := defaults
	opts.Now = func() time.Time { return now }
	opts.DryRun = true
	run(t, h.conn, opts)
	require.Empty(t, marks(), "a dry run records nothing")

	opts.DryRun = false
	run(t, h.conn, opts)
	first := marks()
	require.ElementsMatch(t, retention.TableNames(), slices.Collect(maps.Keys(first)))
	require.True(t, first["retry_history"].Equal(now.Add(-retention.DefaultHistoryRetention)), "%s", first["retry_history"])

	opts.Keep = map[string]time.Duration{"retry_history": 90 * day}
	run(t, h.conn, opts)
	require.True(t, marks()["retry_history"].Equal(first["retry_history"]), "a longer retention keeps the mark")

	a, err := jobstore.RetryAnalytics(ctx, h.conn, jobstore.AnalyticsQuery{Since: now.Add(-40 * day), Until: now})
	require.NoError(t, err)
	require.True(t, a.Partial, "a period from before the mark counts only what is kept")
	a, err = jobstore.RetryAnalytics(ctx, h.conn, jobstore.AnalyticsQuery{Since: now.Add(-7 * day), Until: now})
	require.NoError(t, err)
	require.False(t, a.Partial)
}

// itemDB is a migrated database for the item tables' tests, the time
// they count from, and ago(days) before it.
func itemDB(t *testing.T) (context.Context, *pgx.Conn, time.Time, func(days int) time.Time) {
	t.Helper()
	ctx := context.Background()
	conn := pgtest.NewConn(t)
	now := time.Now().UTC()
	return ctx, conn, now, func(days int) time.Time { return now.Add(-time.Duration(days) * day) }
}
